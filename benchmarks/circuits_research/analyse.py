import json
import re

import numpy as np

from lib import SEEDS, summary

data = json.load(open("/work/tmp/circuits/baselines.json"))


def cands(e, kind="k"):
    k = np.array(e[kind])  # (src, tgt)
    init = np.array(e["init"][kind])
    out = {
        "raw": k,
        "target_z": (k - k.mean(0, keepdims=True)) / k.std(0, keepdims=True),
        "perm_z": (k - np.array(e[f"perm_mean_{kind}"])) / np.array(e[f"perm_std_{kind}"]),
        "rot_z": (k - np.array(e[f"rot_mean_{kind}"])) / np.array(e[f"rot_std_{kind}"]),
        "init_z": (k - init.mean()) / init.std(),
        "delta_init": k - init,
    }
    if kind == "k":
        out["rope_rms"] = np.array(e["k_rope_rms"])
        out["rope_max"] = np.array(e["k_rope_max"])
    return out


np.set_printoptions(precision=2, suppress=True, linewidth=200)
for seed in map(str, SEEDS):
    rec = data[seed]
    steps = sorted(map(int, rec))
    final = rec[str(steps[-1])]
    pt = int(np.argmax(final["prev"]))
    ind = [h for h in range(4) if final["ind"][h] > 0.4]
    phase = int(re.search(r"phase change at step (\d+)", summary(int(seed))).group(1))
    print(f"seed {seed}: prev-token head L0.H{pt}, induction heads {ind}, phase change {phase}")
    for name in cands(final):
        series = [cands(rec[str(s)])[name] for s in steps]
        fin = series[-1]
        ok = [int(np.argmax(fin[:, b])) == pt for b in ind]
        became = []
        for b in ind:
            s_from = None
            for i in range(len(steps) - 1, -1, -1):
                if int(np.argmax(series[i][:, b])) != pt:
                    break
                s_from = steps[i]
            became.append(s_from)
        real = fin[pt, ind]
        mask = np.ones_like(fin, bool); mask[pt, ind] = False
        other = fin[mask]
        s50 = series[1]
        print(f"  {name:10s} argmax=PT {ok}  strongest from {became}  real {real}  max other {other.max():.2f}"
              f"  step50 max {s50.max():.2f} PT-edge@50 {s50[pt, ind]}")

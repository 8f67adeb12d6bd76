import json, re
import numpy as np
from lib import SEEDS, summary
closed = json.load(open("/work/tmp/circuits/closed.json"))
base = json.load(open("/work/tmp/circuits/baselines.json"))
np.set_printoptions(precision=2, suppress=True, linewidth=220)
for seed in map(str, SEEDS):
    rec = closed[seed]; steps = sorted(map(int, rec)); fb = base[seed][str(steps[-1])]
    pt = int(np.argmax(fb["prev"])); ind = [h for h in range(4) if fb["ind"][h] > 0.4]
    phase = int(re.search(r"phase change at step (\d+)", summary(int(seed))).group(1))
    print(f"seed {seed}: PT L0.H{pt}, induction {ind}, phase {phase}")
    for name in ("off0_k_s", "off0_k_z", "alloff_k_s", "alloff_k_z"):
        series = [np.array(rec[str(s)][name]) for s in steps]
        fin = series[-1]
        became = []
        for b in ind:
            s_from = None
            for i in range(len(steps) - 1, -1, -1):
                if int(np.argmax(series[i][:, b])) != pt: break
                s_from = steps[i]
            became.append(s_from)
        mask = np.ones_like(fin, bool); mask[pt, ind] = False
        print(f"  {name:11s} final argmaxPT {[int(np.argmax(fin[:, b])) == pt for b in ind]} from {became} real {fin[pt, ind]} "
              f"max other {fin[mask].max():.2f} (pair {np.unravel_index(np.where(mask, fin, -1e9).argmax(), fin.shape)}) step50 max {series[1].max():.2f}")
    e = rec[str(steps[-1])]
    print("  r_eff W_OV L0 heads", np.array(e["off0_k_ra"]), " r_eff K-read L1 off0", np.array(e["off0_k_rb"]), "alloff", np.array(e["alloff_k_rb"]))
    e = rec["50"]
    print("  step 50 r_eff W_OV", np.array(e["off0_k_ra"]), "K-read", np.array(e["off0_k_rb"]))
    # compare closed z with sampled rot z at final
    b = base[seed][str(steps[-1])]
    rz = (np.array(b["k"]) - np.array(b["rot_mean_k"])) / np.array(b["rot_std_k"])
    print("  sampled rot z (on s)", rz[pt], " closed z (on s^2)", np.array(rec[str(steps[-1])]["off0_k_z"])[pt])

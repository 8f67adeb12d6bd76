"""All numbers of REPORT.md, from insight/circuits.py on the kept weights of the three induction runs."""
import copy
import json
import re

import numpy as np
import torch

from insight.ablation import ablation_dloss
from insight.circuits import (composition_scores, composition_zscores, direct_logit_attribution, ov_promoted_tokens,
                              path_ablation)
from insight.roles import head_role_scores
from lib import SEEDS, load, probes, stats, steps, summary

N_PERM = 200
text, probe, long, tok = probes()


def permuted_scores(model, perms):
    """(N, H, H) K scores L0 -> L1 with layer 1's reading of the residual stream permuted (its qkv columns and
    input-norm gain), for each permutation: the same weights, the basis between writer and reader shuffled."""
    out = []
    moved = copy.deepcopy(model)
    qkv, gain = model.blocks[1].attn.qkv_proj.weight.detach().clone(), model.blocks[1].attn_norm.weight.detach().clone()
    with torch.no_grad():
        for perm in perms:
            moved.blocks[1].attn.qkv_proj.weight.copy_(qkv[:, perm])
            moved.blocks[1].attn_norm.weight.copy_(gain[perm])
            out.append(composition_scores(moved, rope_offsets=[0])["k"][0, :, 1])
    return np.stack(out)


def candidates(model, init_raw, perms):
    """{name: (H_src, H_tgt)} K-composition L0 -> L1 under each baseline."""
    raw0 = composition_scores(model, rope_offsets=[0])["k"][0, :, 1]
    null = permuted_scores(model, perms)
    return {
        "raw, Δ=0": raw0,
        "z over the target's sources": (raw0 - raw0.mean(0)) / raw0.std(0),
        "z vs init (Gaussian-like)": (raw0 - init_raw.mean()) / init_raw.std(),
        "change since init": raw0 - init_raw,
        "permutation z, Δ=0": (raw0 - null.mean(0)) / null.std(0),
        "rotation z, Δ=0": composition_zscores(model, rope_offsets=[0])["k"][0, :, 1],
        "raw, all Δ": composition_scores(model)["k"][0, :, 1],
        "rotation z, all Δ (chosen)": composition_zscores(model)["k"][0, :, 1],
    }


def main():
    gen = torch.Generator().manual_seed(0)
    perms = [torch.randperm(128, generator=gen) for _ in range(N_PERM)]
    results = {}
    for seed in SEEDS:
        st = stats(seed)
        all_steps = steps(seed)
        last = all_steps[-1]
        pt = int(np.argmax([st[last][(0, h)]["prev_token"] for h in range(4)]))
        ind = [h for h in range(4) if st[last][(1, h)]["induction"] > 0.4]
        phase = int(re.search(r"phase change at step (\d+)", summary(seed)).group(1))
        init_raw = composition_scores(load(seed, 0), rope_offsets=[0])["k"][0, :, 1]
        series = {}
        path_series = {}
        for s in all_steps:
            m = load(seed, s)
            series[s] = {k: v.tolist() for k, v in candidates(m, init_raw, perms).items()}
            if s:
                path_series[s] = {b: path_ablation(m, text, probe, "k", (1, b), sources=[(0, a) for a in range(4)])["induction"].tolist()
                                  for b in ind}
            print(seed, s, flush=True)
        m = load(seed, last)
        roles = head_role_scores(m, text, probe)
        final = {kind: {b: path_ablation(m, text, probe, kind, (1, b)) for b in range(4)} for kind in "qkv"}
        dla = direct_logit_attribution(m, long)
        dla_rel = direct_logit_attribution(m, long, relative_to_mean=True)
        w0 = m.attention_maps(long, [0])[0]  # (B, H, T, T)
        self_weight = w0.diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2)).tolist()
        promoted = {h: ov_promoted_tokens(m, long, 0, h, top=3, attended=5) for h in range(4)}
        results[seed] = dict(
            pt=pt, ind=ind, phase=phase, summary=summary(seed),
            series={str(s): v for s, v in series.items()},
            path_series={str(s): v for s, v in path_series.items()},
            roles={k: v.tolist() for k, v in roles.items()},
            ablation=ablation_dloss(m, text).tolist(),
            ablation_long=ablation_dloss(m, long).tolist(),
            path={kind: {b: {k: v.tolist() for k, v in r.items()} for b, r in d.items()} for kind, d in final.items()},
            z={kind: v[0, :, 1].tolist() for kind, v in composition_zscores(m).items()},
            scores={kind: v[0, :, 1].tolist() for kind, v in composition_scores(m).items()},
            dla_heads=dla["heads"].mean(0).tolist(), dla_rel_heads=dla_rel["heads"].mean(0).tolist(),
            dla_other={k: np.asarray(dla[k]).mean(0).tolist() for k in ("mlp", "embedding", "logit")},
            dla_rel_other={k: np.asarray(dla_rel[k]).mean(0).tolist() for k in ("mlp", "embedding", "logit")},
            self_weight=self_weight,
            promoted={h: [dict(token=tok.decode([e["token"]]), attention=e["attention"],
                               promoted=[(tok.decode([v]), p) for v, p in e["promoted"]]) for e in lst]
                      for h, lst in promoted.items()},
        )
    json.dump(results, open("/work/tmp/circuits/results.json", "w"), indent=1, default=float)


main()

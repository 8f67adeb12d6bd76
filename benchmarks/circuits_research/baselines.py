"""Composition baselines over training: raw, within-target z, permutation z, rotation z, init z, change since init."""
import json
import sys

import numpy as np
import torch

from insight.circuits import _factors, _frobenius_sq, composition_scores, head_weights
from lib import SEEDS, load, stats, steps

N_NULL = 200


def k_scores_with_mixing(model, mixers, kind="k"):
    """(n_mix, H_src, H_tgt) scores of L0 -> L1 with the residual basis between them mixed by each matrix."""
    w0, w1 = head_weights(model, 0), head_weights(model, 1)
    H = model.config.n_head
    w_v, w_o = w0["v"], w0["o"]
    sg = w_v.transpose(1, 2) @ w_v
    ssq = _frobenius_sq(torch.eye(w_o.shape[1], dtype=torch.float64), sg, w_o @ w_o.transpose(1, 2))
    x, tg = _factors(w1, kind, 1, True)
    tsq = _frobenius_sq(torch.eye(x.shape[2], dtype=torch.float64), x.transpose(1, 2) @ x, tg)
    out = []
    for mix in mixers:
        xm = torch.einsum("de,tef->tdf", mix, x)
        m = torch.einsum("ahd,tde->athe", w_o, xm)
        out.append((_frobenius_sq(m, sg[:, None], tg[None]) / (ssq[:, None] * tsq[None])).sqrt())
    return torch.stack(out).numpy()


def main():
    gen = torch.Generator().manual_seed(0)
    d = 128
    perms = [torch.eye(d, dtype=torch.float64)[torch.randperm(d, generator=gen)] for _ in range(N_NULL)]
    rots = [torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0] for _ in range(N_NULL)]
    out = {}
    for seed in SEEDS:
        st = stats(seed)
        rec = {}
        init = composition_scores(load(seed, 0))
        for s in steps(seed):
            m = load(seed, s)
            c = composition_scores(m)
            entry = {kind: c[kind][0, :, 1].tolist() for kind in "qkv"}
            entry["init"] = {kind: init[kind][0, :, 1].tolist() for kind in "qkv"}
            for name, mixers in (("perm", perms), ("rot", rots)):
                for kind in "qk":
                    null = k_scores_with_mixing(m, mixers, kind)  # (N, H, H)
                    entry[f"{name}_mean_{kind}"] = null.mean(0).tolist()
                    entry[f"{name}_std_{kind}"] = null.std(0).tolist()
            # rope offsets: rms over offsets 0..31 of the k score
            offs = [composition_scores(m, rope_offset=o)["k"][0, :, 1] for o in range(0, 32)]
            entry["k_rope_rms"] = np.sqrt(np.mean(np.square(offs), axis=0)).tolist()
            entry["k_rope_max"] = np.max(offs, axis=0).tolist()
            if s:
                entry["prev"] = [st[s][(0, h)]["prev_token"] for h in range(4)]
                entry["ind"] = [st[s][(1, h)]["induction"] for h in range(4)]
            rec[s] = entry
            print(seed, s, flush=True)
        out[seed] = rec
    json.dump(out, open("/work/tmp/circuits/baselines.json", "w"))


main()

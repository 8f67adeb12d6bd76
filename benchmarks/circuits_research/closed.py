"""Closed-form rotation null (effective ranks), with and without RoPE offsets stacked."""
import json
import re

import numpy as np
import torch

from insight.circuits import head_weights
from lib import SEEDS, load, stats, steps, summary


def mats(model, offsets):
    """A[a] = W_OV^A (d, d) of L0; Bk[b] = stacked K reading matrices of L1 over offsets (d, n_off * d)."""
    w0 = head_weights(model, 0)
    A = [w0["v"][a] @ w0["o"][a] for a in range(4)]
    B = {}
    for kind in "qk":
        per = []
        for b in range(4):
            blocks = []
            for off in offsets:
                w1 = head_weights(model, 1, off)
                qk = w1["q"][b] @ w1["k"][b].T
                blocks.append(qk if kind == "q" else qk.T)
            per.append(torch.cat(blocks, dim=1))
        B[kind] = per
    return A, B


def reff(g):
    return float(torch.trace(g) ** 2 / torch.trace(g @ g))


def scores(A, B, d=128):
    s2 = np.zeros((4, 4)); z = np.zeros((4, 4)); ra = np.zeros(4); rb = np.zeros(4)
    for a in range(4):
        ga = A[a].T @ A[a]; ra[a] = reff(ga)
        for b in range(4):
            gb = B[b] @ B[b].T; rb[b] = reff(gb)
            s2[a, b] = float(torch.trace(ga @ gb) / (torch.trace(ga) * torch.trace(gb)))
            var = 2 * (1 / ra[a] - 1 / d) * (1 / rb[b] - 1 / d) / ((d - 1) * (d + 2))
            z[a, b] = (s2[a, b] - 1 / d) / np.sqrt(var)
    return np.sqrt(s2), z, ra, rb


np.set_printoptions(precision=2, suppress=True, linewidth=200)
out = {}
for seed in SEEDS:
    st = stats(seed)
    rec = {}
    for s in steps(seed):
        m = load(seed, s)
        e = {}
        for name, offs in (("off0", [0]), ("alloff", list(range(32)))):
            A, B = mats(m, offs)
            for kind in "qk":
                sc, z, ra, rb = scores(A, B[kind])
                e[f"{name}_{kind}_s"] = sc.tolist(); e[f"{name}_{kind}_z"] = z.tolist()
                e[f"{name}_{kind}_ra"] = ra.tolist(); e[f"{name}_{kind}_rb"] = rb.tolist()
        rec[s] = e
    out[seed] = rec
    print(seed, flush=True)
json.dump(out, open("/work/tmp/circuits/closed.json", "w"))

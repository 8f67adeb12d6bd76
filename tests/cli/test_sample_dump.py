"""What `sample.py --dump-attn all` writes, recomputed from the checkpoint's own q and k: attn.npz's maps and
value-weighted arrays of every layer, and the explorer's per-head statistics and role labels."""
from __future__ import annotations

import base64
import gzip
import json
import math
import re

import numpy as np
import torch

from data.tokenizer import CharTokenizer
from insight.roles import role_label
from pretrained.checkpoint import load_model
from tests.cli.test_sample_settings import CHARS, PROMPT, ckpt, run  # noqa: F401  (ckpt: the module's fixture)


def test_the_dump_of_every_layer_equals_softmax_of_the_checkpoints_own_q_k(capsys, ckpt, tmp_path):
    run(capsys, ckpt, "--dump-attn", "all", "--dump-dir", str(tmp_path / "d"), "--max-new-tokens", "1")
    model, _ = load_model(ckpt)
    ids = CharTokenizer(CHARS).encode(PROMPT)
    with torch.no_grad():
        internals = model.attention_internals(torch.tensor([ids]))
    T = len(ids)
    with np.load(tmp_path / "d" / "attn.npz") as npz:
        dump = {name: npz[name] for name in npz.files}
    assert dump["token_ids"].tolist() == ids and dump["tokens"].tolist() == list(PROMPT)
    meta = json.loads(re.search(r'id="attn-meta">(.*?)</script>', (tmp_path / "d" / "attention.html").read_text(),
                                re.S).group(1))
    for layer, it in internals.items():
        q, k, v = it.q[0].double(), it.k[0].double(), it.v[0].double()
        group = q.shape[0] // k.shape[0]
        for h in range(q.shape[0]):
            scores = q[h] @ k[h // group].T / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            w = torch.softmax(scores, dim=-1).numpy()
            assert np.allclose(dump[f"layer_{layer}"][h], w, atol=1e-6)
            w_o = it.out_weight[:, h * q.shape[-1]:(h + 1) * q.shape[-1]].double()
            norms = torch.linalg.vector_norm(v[h // group] @ w_o.T, dim=-1).numpy()  # ||v_j W_O^h||
            assert np.allclose(dump[f"value_norm_{layer}"][h], norms, rtol=1e-5, atol=1e-6)
            assert np.allclose(dump[f"value_weighted_{layer}"][h], w * norms[None, :], rtol=1e-5, atol=1e-6)
            # the explorer's statistics of this head, over query rows 1..T-1: each row's entropy over that of
            # uniform attention on its i + 1 keys, its weight on key 0, its mean distance i - j
            rows = range(1, T)
            entropy = np.mean([-(w[i][w[i] > 0] * np.log(w[i][w[i] > 0])).sum() / np.log(i + 1) for i in rows])
            sink = np.mean([w[i, 0] for i in rows])
            distance = np.mean([sum(w[i, j] * (i - j) for j in range(i + 1)) for i in rows])
            stats = meta["stats"][str(layer)]
            assert abs(stats["entropy"][h] - entropy) < 1e-5 and abs(stats["sink_mass"][h] - sink) < 1e-6
            assert abs(stats["mean_distance"][h] - distance) < 1e-5
        assert dump[f"heads_{layer}"].tolist() == list(range(q.shape[0]))
    roles = [[role_label(*(float(dump[f"head_{n}"][l, h]) for n in ("prev_token", "duplicate_token", "induction")))
              for h in range(4)] for l in range(2)]
    assert meta["roles"] == roles

"""insight.circuits.strongest_edges: each later head's strongest source per composition kind equals the largest z
of every earlier head found by a plain loop, K and V per kv head under GQA, and a NaN never wins."""
from __future__ import annotations

import numpy as np
import pytest

from insight.circuits import composition_zscores, head_name, strongest_edges
from tests.insight.test_circuits import tiny


@pytest.mark.parametrize("shape", ["gqa-rmsnorm-rope", "mha-layernorm-learned"])
def test_each_edge_is_the_largest_z_of_every_earlier_head(shape):
    model = tiny(shape)
    z = composition_zscores(model)
    L, H, K = model.config.n_layer, model.config.n_head, model.config.n_kv_head
    edges = strongest_edges(z, H)
    expected = []
    for layer in range(1, L):
        for head in range(H):
            for kind in ("q", "k", "v"):
                column = head if kind == "q" else head // (H // K)  # K and V per kv head
                best = max(((la, a) for la in range(layer) for a in range(H)),
                           key=lambda s: z[kind][s[0], s[1], layer, column])
                expected.append((kind, best, (layer, head), z[kind][best[0], best[1], layer, column]))
    assert edges == expected


def test_a_nan_never_wins_and_all_nan_gives_no_edge():
    z = {"k": np.full((2, 2, 2, 2), np.nan)}
    z["k"][0, 1, 1, :] = 3.0
    assert strongest_edges(z, 2) == [("k", (0, 1), (1, 0), 3.0), ("k", (0, 1), (1, 1), 3.0)]
    assert strongest_edges({"k": np.full((2, 2, 2, 2), np.nan)}, 2) == []


def test_a_query_head_takes_its_kv_heads_edge():
    z = {"v": np.zeros((2, 4, 2, 2))}  # 4 query heads, 2 kv heads
    z["v"][0, 3, 1, 1] = 5.0  # L0.H3 into kv head 1: query heads 2 and 3
    edges = strongest_edges(z, 4)
    assert [e for e in edges if e[3] == 5.0] == [("v", (0, 3), (1, 2), 5.0), ("v", (0, 3), (1, 3), 5.0)]
    assert head_name(1, 3) == "L1.H3"

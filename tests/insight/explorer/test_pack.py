"""insight/explorer/pack.py: each attention row as 8-bit codes of its lower triangle, scaled by the row's largest
weight, comes back within half a step; and the heads whose q, k, v fill the byte budget are chosen selected first,
a head whose kv head is already in costing only its q."""
from __future__ import annotations

import numpy as np
import torch

from insight.explorer.pack import choose_detail, dequantise_rows, detail_order, quantise_rows


def test_8bit_rows_come_back_within_half_a_step():
    torch.manual_seed(0)
    T = 30
    scores = torch.randn(3, T, T, dtype=torch.float64) * 3
    w = torch.softmax(scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), -1).float().numpy()
    codes, row_max = quantise_rows(w)
    assert codes.shape == (3, T * (T + 1) // 2) and codes.dtype == np.uint8
    np.testing.assert_array_equal(row_max, w.max(axis=-1))
    back = dequantise_rows(codes, row_max)
    assert (np.abs(back - w) <= row_max[..., None] / 510 * (1 + 1e-5)).all()
    assert (back[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    assert (codes.reshape(3, -1).max(axis=-1) == 255).all()  # each row's peak uses the full range


def test_detail_heads_are_chosen_selected_first_within_the_budget():
    order = detail_order([0, 1], {0: [2], 1: [1, 3]}, n_head=4)
    assert order[:3] == [(0, 2), (1, 1), (1, 3)] and len(order) == 8
    # n_rep 2: heads 0,1 read kv head 0 and heads 2,3 kv head 1; a q costs 1 unit, a new kv head's k + v 2
    assert choose_detail(order, 2, 1, budget=3) == {0: [2]}
    assert choose_detail(order, 2, 1, budget=9) == {0: [2], 1: [1, 3]}  # 3 + 3 + 3: the selected heads
    # 7: (1, 3) does not fit, but head 3 of layer 0 costs only its q (kv head 1 is in): 3 + 3 + 1
    assert choose_detail(order, 2, 1, budget=7) == {0: [2, 3], 1: [1]}
    assert choose_detail(order, 2, 1, budget=10) == {0: [2, 3], 1: [1, 3]}
    assert choose_detail(order, 2, 1, budget=2) == {}

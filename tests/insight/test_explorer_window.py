"""What the explorer page holds once its input is longer than its window: the first `window` tokens, every
array cut to them, and nothing of the rest. Expected values come from the model run on those first tokens
alone (causal attention never looks ahead, so its maps are the first rows and columns of the long input's),
decoded from the page as the browser does."""
from __future__ import annotations

import numpy as np
import pytest

from insight.explorer import ExplorerOptions, explorer_html
from insight.explorer.pack import dequantise_rows
from insight.stats import head_stats
from insight.value_weighted import internals_value_norms
from tests.insight.test_explorer import array, ids, lively_model, page_data


@pytest.mark.parametrize("T, window", [(50, 20), (21, 20), (20, 20), (12, 20)])
def test_the_page_holds_the_first_window_tokens_and_their_maps_only(T, window):
    model = lively_model(seed=3, block_size=64, n_kv_head=2)
    idx = ids(T, seed=5)
    tokens = [f"t{i}" for i in range(T)]  # every position its own label: a cut elsewhere shows
    W = min(T, window)
    meta, data, detail = page_data(explorer_html(model.attention_internals(idx), tokens, options=ExplorerOptions(window=window)))
    head = model.attention_internals(idx[:, :W])  # the model over the first W tokens alone
    assert (meta["n_tokens"], meta["window"], meta["labels"]) == (T, W, tokens[:W])
    for layer in (0, 1):
        weights = head[layer].weights[0].numpy()  # (n_head, W, W)
        row_max = array(data, meta["arrays"][f"scale.{layer}"])
        np.testing.assert_allclose(row_max, weights.max(axis=-1), rtol=1e-5, atol=1e-7)
        codes = array(data, meta["arrays"][f"attn.{layer}"])
        decoded = dequantise_rows(codes, row_max)
        assert decoded.shape == (4, W, W)
        assert np.abs(decoded - weights).max() <= weights.max() / 510 + 1e-6
        np.testing.assert_allclose(array(data, meta["arrays"][f"vnorm.{layer}"]),
                                   internals_value_norms(head[layer])[0].numpy(), rtol=1e-5, atol=1e-6)
        for name, values in head_stats(weights).items():  # the table is over the window, not the whole input
            np.testing.assert_allclose([np.nan if v is None else v for v in meta["stats"][str(layer)][name]],
                                       values, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(array(detail, meta["detail_arrays"][f"q.{layer}.1"]), head[layer].q[0, 1].numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(array(detail, meta["detail_arrays"][f"k.{layer}.1"]), head[layer].k[0, 1].numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_a_window_of_one_keeps_the_first_token():
    model = lively_model(seed=4)
    idx = ids(9, seed=2)
    meta, data, _ = page_data(explorer_html(model.attention_internals(idx), list("abcdefghi"), options=ExplorerOptions(window=1)))
    assert (meta["window"], meta["labels"]) == (1, ["a"])
    assert array(data, meta["arrays"]["attn.0"]).tolist() == [[255]] * 4  # query 0 sees key 0 only: weight 1
    np.testing.assert_allclose(array(data, meta["arrays"]["scale.0"]), np.ones((4, 1)), rtol=1e-6)
    assert meta["n_tokens"] == 9

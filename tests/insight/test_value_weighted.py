"""insight/value_weighted.py: ||alpha_ij v_j W_O^h|| per head, query and key, against a float64 loop written out
in numpy, on multi-head, grouped-query and multi-query attention."""
from __future__ import annotations

import numpy as np
import pytest

from insight.value_weighted import value_norms, value_weighted
from tests.insight.test_explorer import ARCHS, ids, lively_model


@pytest.mark.parametrize("arch", ["mha", "gqa", "mqa"])
def test_value_weighted_equals_a_float64_loop(arch):
    """||alpha_ij v_j W_O^h|| per head, query and key, by hand in numpy float64, head h reading kv head h // n_rep."""
    model = lively_model(seed=4, **ARCHS[arch])
    it = model.attention_internals(ids(12))[1]
    alpha, v, w_o = it.weights[0].double().numpy(), it.v[0].double().numpy(), it.out_weight.double().numpy()
    n_head, T, _ = alpha.shape
    n_rep, D = n_head // v.shape[0], v.shape[-1]
    expected = np.zeros((n_head, T, T))
    for h in range(n_head):
        w_o_h = w_o[:, h * D:(h + 1) * D]  # (d_model, D)
        for i in range(T):
            for j in range(T):
                expected[h, i, j] = np.linalg.norm(alpha[h, i, j] * (w_o_h @ v[h // n_rep, j]))
    got = value_weighted(it.weights, it.v, it.out_weight)[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    norms = value_norms(it.v, it.out_weight, n_head)[0].numpy()
    assert norms.shape == (n_head, T) and norms.std() > 0.1 * norms.mean()  # the norms differ: weighting matters
    # the ranking of keys changes for some query: value-weighting is not a rescaled copy of the weights
    assert (np.argmax(got, axis=-1) != np.argmax(alpha, axis=-1)).any()

"""insight/circuit_dump.py, what sample.py --dump-attn writes of the circuit: attn.npz's arrays against direct calls
of insight.circuits on the same model, path ablation exactly on each target's top-k sources by z, the rule that
chooses them, and the NaNs of a 1-token prompt."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from insight.circuit_dump import (OV_ATTENDED, OV_PROMOTED, PATH_NAMES, TOP_SOURCES, prompt_circuit_arrays,
                                  top_sources)
from insight.circuits import (COMPOSITION_KINDS, composition_scores, composition_zscores, direct_logit_attribution,
                              ov_promoted_tokens, path_ablation)
from insight.dump import dump_internals, dump_probe, prompt_circuit_scores, prompt_head_scores
from insight.explorer import HeadScores
from tests.insight.test_explorer import CHARS, ids, lively_model

L, H = 3, 4


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """A 3-layer GQA model (kv heads of 2 query heads), its dump over a 12-token prompt read back from attn.npz,
    and the role probe the dump used: layer 2's targets have 8 candidate sources, more than TOP_SOURCES."""
    model = lively_model(seed=4, n_layer=L, n_kv_head=2)
    idx = ids(12, seed=5)
    tokenizer = CharTokenizer(CHARS)
    scores, note = prompt_head_scores(model, idx, tokenizer)
    circuit = prompt_circuit_scores(model, idx, tokenizer)
    out = tmp_path_factory.mktemp("circuit_dump")
    dump_internals(model.attention_internals(idx, layers=[0]), {0: [0]}, [f"t{i}" for i in idx[0].tolist()], out,
                   scores=HeadScores(scores, note, circuit))
    with np.load(out / "attn.npz") as npz:
        arrays = {name: npz[name] for name in npz.files}
    return model, idx, dump_probe(model, tokenizer, idx.device)[0], arrays


def test_composition_arrays_are_circuits_own_with_a_kv_heads_columns_on_each_of_its_query_heads(dumped):
    model, _, _, npz = dumped
    for name, direct in (("circuit_composition", composition_scores(model)), ("circuit_z", composition_zscores(model))):
        assert npz[name].shape == (3, L, H, L, H) and npz[name].dtype == np.float32
        for k, kind in enumerate(COMPOSITION_KINDS):
            expected = direct[kind] if kind == "q" else np.repeat(direct[kind], 2, axis=-1)  # kv head g -> 2g, 2g+1
            np.testing.assert_allclose(npz[name][k], expected, rtol=1e-6)
            for la in range(L):
                for lb in range(L):  # NaN exactly where the source's layer is not before the target's
                    assert np.isnan(npz[name][k, la, :, lb]).all() == (la >= lb)


def test_path_ablation_is_run_on_each_targets_top_k_sources_by_z_and_nowhere_else(dumped):
    model, idx, probe, npz = dumped
    assert not np.isnan(npz["circuit_path_duplicate_token"]).all()  # the probe was used
    for k, kind in enumerate(COMPOSITION_KINDS):
        z = npz["circuit_z"][k]
        for lb in range(L):
            for b in range(H):
                chosen = top_sources(z, (lb, b)) if lb >= 1 else []
                assert len(chosen) == min(TOP_SOURCES, lb * H)
                direct = path_ablation(model, idx, probe, kind, (lb, b), chosen) if chosen else {}
                for name in PATH_NAMES:
                    column = npz[f"circuit_path_{name}"][k, :, :, lb, b]  # (L, H): every source of this target
                    mask = np.zeros((L, H), dtype=bool)
                    for i, (la, a) in enumerate(chosen):
                        mask[la, a] = True
                        assert column[la, a] == pytest.approx(direct[name][i], rel=1e-5, abs=1e-6), (kind, lb, b, name)
                    assert np.isnan(column[~mask]).all() and not np.isnan(column[mask]).any()
    assert (npz["circuit_path_induction"][2][~np.isnan(npz["circuit_path_induction"][2])] == 0).all()  # V: maps kept


def test_direct_logit_and_ov_tokens_are_circuits_own(dumped):
    model, idx, _, npz = dumped
    expected = direct_logit_attribution(model, idx, relative_to_mean=True)["heads"].mean(axis=0)
    np.testing.assert_allclose(npz["head_direct_logit"], expected, rtol=1e-5, atol=1e-7)
    assert npz["head_ov_token"].shape == (L, H, OV_ATTENDED)
    assert npz["head_ov_promoted"].shape == npz["head_ov_promoted_logit"].shape == (L, H, OV_ATTENDED, OV_PROMOTED)
    for layer, head in ((0, 0), (2, 3)):
        found = ov_promoted_tokens(model, idx, layer, head, top=OV_PROMOTED, attended=OV_ATTENDED)
        assert npz["head_ov_token"][layer, head].tolist() == [item["token"] for item in found]
        np.testing.assert_allclose(npz["head_ov_attention"][layer, head], [item["attention"] for item in found],
                                   rtol=1e-6)
        for a, item in enumerate(found):
            assert npz["head_ov_promoted"][layer, head, a].tolist() == [v for v, _ in item["promoted"]]
            np.testing.assert_allclose(npz["head_ov_promoted_logit"][layer, head, a], [p for _, p in item["promoted"]],
                                       rtol=1e-5)
    assert npz["head_description"].shape == (L, H)


def test_a_one_token_prompt_has_no_path_ablation_or_direct_logit_but_its_composition():
    model = lively_model(seed=4, n_layer=L, n_kv_head=2)
    arrays, note = prompt_circuit_arrays(model, ids(1), None)
    for name in PATH_NAMES:
        assert np.isnan(arrays[f"circuit_path_{name}"]).all()
    assert np.isnan(arrays["head_direct_logit"]).all()
    assert not np.isnan(arrays["circuit_z"][:, 0, :, 1]).any()  # from the weights alone
    assert (arrays["head_ov_token"][:, :, 0] >= 0).all() and (arrays["head_ov_token"][:, :, 1:] == -1).all()
    assert "NaN: a 1-token prompt has no next token" in note and "no role probe" in note


def test_without_a_probe_only_the_probes_role_changes_are_nan():
    model = lively_model(seed=4, n_layer=2)
    arrays, note = prompt_circuit_arrays(model, ids(8), None)
    measured = ~np.isnan(arrays["circuit_path_dloss"])
    assert measured.sum() == 3 * H * TOP_SOURCES  # layer 1's targets, 3 kinds, the top 3 of 4 sources each
    assert not np.isnan(arrays["circuit_path_prev_token"][measured]).any()
    assert np.isnan(arrays["circuit_path_duplicate_token"]).all() and np.isnan(arrays["circuit_path_induction"]).all()


def test_top_sources_takes_the_largest_z_inf_first_never_nan_ties_in_order():
    z = np.full((3, 2, 3, 2), np.nan)
    z[0, :, 2, 1] = [5.0, np.nan]
    z[1, :, 2, 1] = [np.inf, 5.0]
    assert top_sources(z, (2, 1), k=3) == [(1, 0), (0, 0), (1, 1)]  # inf, then the tie 5.0 in (layer, head) order
    assert top_sources(z, (2, 1), k=1) == [(1, 0)]
    assert top_sources(z, (1, 0), k=3) == []  # all NaN


@pytest.mark.parametrize("k", [1, 2])
def test_top_sources_k_is_the_number_of_sources(k):
    z = np.arange(2 * 2 * 2 * 2, dtype=float).reshape(2, 2, 2, 2)
    assert top_sources(z, (1, 0), k=k) == [(0, 1), (0, 0)][:k]


def test_the_arrays_are_float32_or_int64_and_the_models_mode_is_left_as_it_was():
    model = lively_model(seed=4, n_layer=2).train()
    arrays, _ = prompt_circuit_arrays(model, ids(6), None)
    assert model.training  # every measure restores the mode
    assert all(a.dtype in (np.float32, np.int64) for a in arrays.values())
    assert torch.is_grad_enabled()

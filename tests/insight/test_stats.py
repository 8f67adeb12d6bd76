"""Attention-map statistics on maps whose answers are known, on a real model's maps, and the heatmaps."""
from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from insight.heatmap import attention_grid_image, draw_heatmap, token_label
from insight.stats import (STAT_NAMES, attention_entropy, decay_exponent, decay_r2, distance_profile, head_stats,
                           mean_distance, sink_mass)
from model import GPT, ModelConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def uniform_causal(T: int, n_head: int = 1) -> torch.Tensor:
    """(n_head, T, T): row i = 1/(i+1) on keys j <= i."""
    w = torch.ones(T, T, dtype=torch.float64).tril()
    return (w / w.sum(dim=-1, keepdim=True)).expand(n_head, T, T).clone()


def power_law(T: int, gamma: float, c: float) -> torch.Tensor:
    """(1, T, T) rows summing to 1 with w[i, i-d] = c * d**-gamma for every d >= 1 and the rest of the row
    on the diagonal. Every row shares the constant c, so m(d) = c * d**-gamma exactly and the fitted
    gamma is exact (up to rounding): no per-row normaliser bends the power law."""
    i = torch.arange(T, dtype=torch.float64)
    d = i[:, None] - i[None, :]  # (T, T)
    w = torch.where(d >= 1, c * d.clamp_min(1) ** -gamma, torch.zeros_like(d))
    w = w + torch.diag(1.0 - w.sum(dim=-1))
    assert (w.diagonal() > 0).all(), "c too large: the diagonal would go negative"
    return w[None]


def test_uniform_attention_has_entropy_one_and_half_the_position_as_distance():
    T = 20
    w = uniform_causal(T, n_head=3)
    np.testing.assert_allclose(attention_entropy(w), 1.0, atol=1e-12)
    expected = np.mean([i / 2 for i in range(1, T)])  # rows 1..T-1: sum_j (i - j) / (i + 1) = i / 2
    np.testing.assert_allclose(mean_distance(w), expected, atol=1e-12)
    np.testing.assert_allclose(sink_mass(w), np.mean([1 / (i + 1) for i in range(1, T)]), atol=1e-12)


def test_all_weight_on_the_first_token_is_a_pure_sink():
    T = 16
    w = torch.zeros(2, T, T, dtype=torch.float64)
    w[:, :, 0] = 1.0
    stats = head_stats(w)
    np.testing.assert_allclose(stats["sink_mass"], 1.0)
    np.testing.assert_allclose(stats["entropy"], 0.0, atol=1e-12)
    np.testing.assert_allclose(stats["mean_distance"], np.mean(np.arange(1, T)))


def test_attention_to_self_only_is_distance_zero():
    w = torch.eye(10, dtype=torch.float64)[None]
    np.testing.assert_allclose(mean_distance(w), 0.0)
    np.testing.assert_allclose(attention_entropy(w), 0.0, atol=1e-12)
    assert math.isnan(decay_exponent(w)[0])  # m(d) = 0 for every d >= 1: nothing to fit


@pytest.mark.parametrize("gamma,c", [(2.0, 0.5), (1.0, 0.1), (0.5, 0.05)])
def test_power_law_decay_is_recovered(gamma, c):
    w = power_law(64, gamma, c)
    profile = distance_profile(w)[0]
    np.testing.assert_allclose(profile[1:], c * np.arange(1, 64.0) ** -gamma, rtol=1e-12)
    np.testing.assert_allclose(decay_exponent(w), gamma, atol=1e-9)


def test_power_law_with_per_row_normalisation_is_close():
    # w[i, i-d] = d**-2 / Z_i with distance 0 weight 1: Z_i = 1 + sum_{d<=i} d**-2 rises from 2 to at
    # most 1 + pi**2/6, so m(d) = d**-2 * mean_{i>=d} 1/Z_i is bent by a factor within [0.76, 1] of its
    # d = 1 value, and almost all of that change happens at small d (Z_i converges like 1/i): the fit
    # must stay within 0.1 of 2, steeper rather than flatter (larger d -> only rows with larger Z_i).
    T = 64
    i = torch.arange(T, dtype=torch.float64)
    d = i[:, None] - i[None, :]
    w = torch.where(d >= 1, d.clamp_min(1) ** -2.0, torch.zeros_like(d)) + torch.eye(T, dtype=torch.float64)
    w = w / w.sum(dim=-1, keepdim=True)
    gamma = decay_exponent(w[None])[0]
    assert 2.0 <= gamma < 2.1


def test_decay_needs_two_distances():
    # the fit uses keys j >= 1 only: T = 3 reaches d = 2 only through key 0, leaving d = 1 alone
    assert math.isnan(decay_exponent(uniform_causal(2))[0])
    assert math.isnan(decay_exponent(power_law(3, 2.0, 0.5))[0]) and math.isnan(decay_r2(power_law(3, 2.0, 0.5))[0])
    assert np.isfinite(decay_exponent(power_law(4, 2.0, 0.3))[0])


@pytest.mark.parametrize("gamma,c", [(2.0, 0.5), (1.0, 0.1), (0.5, 0.05)])
def test_decay_r2_is_one_on_an_exact_power_law(gamma, c):
    np.testing.assert_allclose(decay_r2(power_law(64, gamma, c)), 1.0, atol=1e-12)
    assert head_stats(power_law(64, gamma, c))["decay_r2"][0] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("sink", [0.3, 0.6, 0.9])
def test_decay_fit_leaves_out_key_0_so_a_sink_does_not_bend_gamma(sink):
    # a power law over keys j >= 1 plus `sink` on key 0 for every row (taken from the diagonal): the
    # profile with key 0 rises at long distances (only a few queries reach them, one of them through key
    # 0), the fit without it still finds gamma exactly
    T, gamma, c = 64, 1.5, 0.02
    w = power_law(T, gamma, c)[0]
    rows = torch.arange(1, T)
    w[rows, 0] = sink
    w = (w + torch.diag(1.0 - w.sum(dim=-1)))[None]  # (1, T, T)
    assert (w.diagonal(dim1=1, dim2=2) > 0).all() and torch.allclose(w.sum(dim=-1), torch.ones(1, T, dtype=w.dtype))
    with_key_0 = distance_profile(w)[0]
    assert with_key_0[T - 1] == pytest.approx(sink)  # d = T - 1: key 0 of the last query, alone
    np.testing.assert_allclose(distance_profile(w, skip_first_key=True)[0, 1:T - 1],
                               c * np.arange(1, T - 1.0) ** -gamma, rtol=1e-12)
    assert math.isnan(distance_profile(w, skip_first_key=True)[0, T - 1])
    np.testing.assert_allclose(decay_exponent(w), gamma, atol=1e-9)
    np.testing.assert_allclose(decay_r2(w), 1.0, atol=1e-12)


def test_decay_fit_equals_numpy_polyfit_on_the_profile_of_keys_1_on():
    # independent: the profile by explicit loops over queries, key 0 skipped, then numpy's least squares
    gen = torch.Generator().manual_seed(3)
    B, H, T = 2, 3, 16
    scores = torch.randn(B, H, T, T, generator=gen, dtype=torch.float64) * 3
    w = torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), dim=-1)
    gamma, r2 = decay_exponent(w), decay_r2(w)
    for h in range(H):
        m = [np.mean([w[b, h, i, i - d].item() for b in range(B) for i in range(d + 1, T)]) for d in range(1, T - 1)]
        x, y = np.log(np.arange(1, T - 1.0)), np.log(m)
        slope, intercept = np.polyfit(x, y, 1)
        residual = y - (slope * x + intercept)
        assert gamma[h] == pytest.approx(-slope, abs=1e-9)
        assert r2[h] == pytest.approx(1 - (residual ** 2).sum() / ((y - y.mean()) ** 2).sum(), abs=1e-9)
        assert 0.0 <= r2[h] < 1.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(2, 24), st.floats(0.0, 8.0), st.integers(0, 2**31 - 1))
def test_decay_r2_is_between_0_and_1_on_any_causal_map(B, H, T, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, T, T, generator=gen, dtype=torch.float64) * scale
    w = torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), dim=-1)
    r2, gamma = decay_r2(w), decay_exponent(w)
    assert (np.isnan(r2) == np.isnan(gamma)).all()
    assert (np.isnan(r2) == (T < 4)).all()  # keys j >= 1 give two distances from T = 4 on
    finite = r2[np.isfinite(r2)]
    assert ((finite >= -1e-12) & (finite <= 1 + 1e-12)).all()


def test_single_position_gives_nan_row_means():
    stats = head_stats(torch.ones(3, 1, 1))
    for name in STAT_NAMES:
        assert stats[name].shape == (3,) and np.isnan(stats[name]).all()


def test_batch_stats_are_the_mean_of_per_item_stats():
    torch.manual_seed(0)
    B, H, T = 3, 4, 12
    scores = torch.randn(B, H, T, T, dtype=torch.float64) * 2
    w = torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), dim=-1)
    batch = head_stats(w)
    items = [head_stats(w[b]) for b in range(B)]
    for name in ("entropy", "sink_mass", "mean_distance"):
        np.testing.assert_allclose(batch[name], np.mean([s[name] for s in items], axis=0), rtol=1e-12)
    # gamma is fitted to the pooled profile: the mean of the items' profiles
    np.testing.assert_allclose(distance_profile(w), np.mean([distance_profile(w[b]) for b in range(B)], axis=0),
                               rtol=1e-12)
    assert batch["decay_gamma"].shape == (H,)


def test_numpy_input_and_bad_shapes():
    w = uniform_causal(8, 2)
    for name, value in head_stats(w.numpy()).items():
        np.testing.assert_allclose(value, head_stats(w)[name])
    with pytest.raises(ValueError, match="n_head, T, T"):
        head_stats(torch.ones(4, 5))
    with pytest.raises(ValueError, match="n_head, T, T"):
        head_stats(torch.ones(2, 4, 5))


def test_stats_on_a_real_model_are_in_range():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=37, block_size=24, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu"))
    idx = torch.randint(0, 37, (2, 24))
    maps = model.attention_maps(idx)
    T = 24
    for layer, w in maps.items():
        assert w.shape == (2, 4, T, T)
        stats = head_stats(w)
        for name in STAT_NAMES:
            assert stats[name].shape == (4,) and stats[name].dtype == np.float64
            assert np.isfinite(stats[name]).all(), (layer, name, stats[name])
        # float32 rows sum to 1 only within rounding, so the entropy bound gets a rounding allowance
        assert ((stats["entropy"] >= 0) & (stats["entropy"] <= 1 + 1e-5)).all()
        assert ((stats["sink_mass"] >= 0) & (stats["sink_mass"] <= 1)).all()
        assert ((stats["mean_distance"] >= 0) & (stats["mean_distance"] <= T - 1)).all()
        # a fresh model attends almost uniformly: entropy near 1, distance near uniform's
        assert (stats["entropy"] > 0.8).all()


def test_token_labels_are_readable():
    assert token_label("\n") == "⏎"
    assert token_label(" the") == "␣the"
    assert token_label("\t") == "⇥"
    assert token_label("\x00") == "\\x00"
    assert token_label("\r") == "\\r"
    assert token_label("") == "∅"
    assert token_label("$x$") == r"\$x\$"
    assert token_label("abcdefghijkl") == "abcdefg…"


@pytest.mark.parametrize("n_head,T,with_tokens", [(1, 10, True), (6, 10, False), (6, 12, True), (1, 60, True)])
def test_draw_heatmap_writes_a_png(tmp_path, n_head, T, with_tokens):
    import matplotlib.image

    torch.manual_seed(n_head)
    w = torch.softmax(torch.randn(n_head, T, T).masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), -1)
    vocab = ["\n", " a", "b\t", "$", "\x00", "", "long-token-here", "ü"]
    tokens = [vocab[t % len(vocab)] for t in range(T)] if with_tokens else None
    path = tmp_path / "map.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a glyph missing from the font
        fig = draw_heatmap(w, tokens, title="layer 0", path=path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    width, height = fig.get_size_inches() * 100
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (round(height), round(width)) and image.shape[2] in (3, 4)
    assert width <= 1700 and height <= 1600
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"head {h}" for h in range(n_head)]


def test_draw_heatmap_selected_heads_and_errors(tmp_path):
    w = uniform_causal(8, 4)
    fig = draw_heatmap(w, heads=[3, 1])
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["head 3", "head 1"]
    with pytest.raises(ValueError, match="heads"):
        draw_heatmap(w, heads=[4])
    with pytest.raises(ValueError, match="tokens"):
        draw_heatmap(w, tokens=["a"] * 7)
    with pytest.raises(ValueError, match="batch item"):
        draw_heatmap(w[None])


def test_attention_grid_image_is_rgb_uint8():
    image = attention_grid_image(uniform_causal(10, 6), tokens=list("abcdefghij"), title="t")
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.min() < 100 and image.max() > 200  # something was drawn on the white background


def test_import_is_cheap_and_does_not_load_matplotlib():
    code = "import sys, insight.stats, insight.heatmap, insight.dump; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""Attention-map statistics and heatmaps where the easy cases say nothing: a decay fit over distances that
carry no weight (or no finite weight), and what a heatmap masks and colours. Expected values are written
out here: the power law's own exponent, the causal mask as numpy builds it, the shown heads' largest weight."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from insight.heatmap import draw_heatmap
from insight.stats import decay_exponent, distance_profile, head_stats


def sparse_power_law(T: int, gamma: float, c: float, keep) -> torch.Tensor:
    """(1, T, T) rows summing to 1: w[i, i-d] = c * d**-gamma for the distances d >= 1 with keep(d), 0 for the
    other distances, the rest of each row on the diagonal. So m(d) = c * d**-gamma exactly where kept, 0 elsewhere."""
    i = torch.arange(T, dtype=torch.float64)
    d = i[:, None] - i[None, :]  # (T, T)
    kept = torch.tensor([bool(keep(int(x))) for x in range(T)])[d.clamp_min(0).long()] & (d >= 1)
    w = torch.where(kept, c * d.clamp_min(1) ** -gamma, torch.zeros_like(d))
    w = w + torch.diag(1.0 - w.sum(dim=-1))
    assert (w.diagonal() > 0).all()
    return w[None]


def least_squares_gamma(distances: np.ndarray, m: np.ndarray) -> float:
    """-slope of log m on log d, by numpy's polyfit: shares no code with decay_exponent."""
    return -float(np.polyfit(np.log(distances), np.log(m), 1)[0])


@pytest.mark.parametrize("gamma, c, keep", [
    (2.0, 0.5, lambda d: d % 2 == 0),  # odd distances carry no weight
    (1.0, 0.1, lambda d: d in (3, 17, 40)),  # three distances only
    (0.5, 0.05, lambda d: d < 10 or d > 50),  # a gap in the middle
])
def test_decay_is_fitted_over_the_distances_that_carry_weight_only(gamma, c, keep):
    """Distances with m(d) = 0 have no logarithm: the fit skips them and recovers the power law of the
    others exactly (counting them, or their x values in the means, bends or breaks it)."""
    T = 64
    w = sparse_power_law(T, gamma, c, keep)
    profile = distance_profile(w)[0]
    kept = np.array([d for d in range(1, T) if keep(d)])
    np.testing.assert_allclose(profile[kept], c * kept.astype(float) ** -gamma, rtol=1e-12)
    assert (profile[[d for d in range(1, T) if not keep(d)]] == 0).all()
    np.testing.assert_allclose(decay_exponent(w), gamma, atol=1e-9)
    np.testing.assert_allclose(head_stats(w)["decay_gamma"], gamma, atol=1e-9)


def test_decay_skips_distances_whose_weight_is_not_finite_and_fits_each_head_on_its_own():
    """A NaN or inf weight spoils the one distance it sits at (m(d) not finite): that distance is skipped.
    Heads are fitted separately: a head with nothing usable is NaN without touching its neighbours."""
    T = 32
    clean = sparse_power_law(T, 1.5, 0.2, lambda d: True)[0]
    spoiled = clean.clone()
    spoiled[20, 20 - 7] = float("nan")  # distance 7
    spoiled[30, 30 - 11] = float("inf")  # distance 11
    sparse = sparse_power_law(T, 3.0, 0.4, lambda d: d % 3 == 1)[0]
    self_only = torch.eye(T, dtype=torch.float64)  # m(d) = 0 for every d >= 1: nothing to fit
    w = torch.stack([spoiled, sparse, self_only, clean])
    profile = distance_profile(w)
    assert not np.isfinite(profile[0, [7, 11]]).any() and np.isfinite(np.delete(profile[0], [7, 11])).all()
    usable = np.array([d for d in range(1, T) if d not in (7, 11)])
    expected = least_squares_gamma(usable, profile[0, usable])
    gammas = decay_exponent(w)
    np.testing.assert_allclose(gammas[0], expected, rtol=1e-10)
    np.testing.assert_allclose(gammas[[0, 1, 3]], [1.5, 3.0, 1.5], atol=1e-9)
    assert math.isnan(gammas[2])


def test_decay_needs_two_usable_distances_not_two_distances():
    """Many distances, but weight at one of them only: no line through one point, NaN."""
    w = sparse_power_law(16, 2.0, 0.3, lambda d: d == 5)
    assert math.isnan(decay_exponent(w)[0])
    assert np.isfinite(decay_exponent(sparse_power_law(16, 2.0, 0.3, lambda d: d in (5, 9)))[0])


# --- heatmaps ------------------------------------------------------------------------------------------------

def random_causal(n_head: int, T: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_head, T, T, generator=g)
    return torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), dim=-1)


@pytest.mark.parametrize("T, tokens", [(6, list("abcdef")), (13, None), (60, [str(t) for t in range(60)])])
def test_each_panel_masks_exactly_the_future_and_shows_the_head_it_names(T, tokens):
    """Every panel is head h's map with exactly the keys j > i masked (drawn in the grey 'bad' colour): the
    diagonal and the past are shown, the future never is, even where the input holds a value there."""
    from matplotlib.colors import to_rgba

    w = random_causal(4, T).clone()
    w[2] += torch.ones(T, T).triu(1) * 0.5  # head 2: values in the future, which must stay hidden
    heads = [3, 0, 2]
    fig = draw_heatmap(w, tokens, heads=heads)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == len(heads)
    future = np.arange(T)[None, :] > np.arange(T)[:, None]  # (T, T): key after query
    for image, h in zip(images, heads):
        shown = image.get_array()
        np.testing.assert_array_equal(np.ma.getmaskarray(shown), future)
        np.testing.assert_array_equal(shown.filled(np.nan)[~future], w[h].numpy()[~future])
        assert image.cmap.get_bad() == pytest.approx(to_rgba("#d9d9d9"))


def test_panels_share_one_colour_scale_from_zero_to_the_largest_weight_shown():
    """One scale for the heads drawn: 0 .. their largest value (a head left out does not stretch it). Every
    causal row 0 is [1, 0, ...], so the heads are scaled here to tell the heads' maxima apart."""
    w = random_causal(3, 9, seed=1) * torch.tensor([0.3, 1.0, 0.5])[:, None, None]
    for heads, vmax in (([0, 2], 0.5), ([0, 1, 2], 1.0), ([0], 0.3)):
        fig = draw_heatmap(w, heads=heads)
        limits = [ax.images[0].get_clim() for ax in fig.axes if ax.images]
        assert limits == [(0.0, pytest.approx(vmax, rel=1e-6))] * len(heads)

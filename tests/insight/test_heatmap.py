"""The heatmaps' colour scale and zoom: √weight colours with a colour bar labelled in weights, and the zoom's
crop, checked on the figures' own image data (what the PNG is rendered from)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from insight.heatmap import (PNG_COMPRESS_LEVEL, ZOOM_LAST, HeatmapCanvas, cell_labels, colour_bar_ticks, draw_heatmap,
                             draw_heatmap_zoom, token_label, weight_norm)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def causal_maps(n_head: int, T: int, seed: int = 0) -> torch.Tensor:
    """(n_head, T, T) peaked causal softmax rows: weights from ~1e-4 to ~1."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_head, T, T, generator=g) * 2.5
    return torch.softmax(scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), -1)


def images(fig):
    return [ax.images[0] for ax in fig.axes if ax.images]


def colour_bar_axes(fig):
    return next(ax for ax in fig.axes if not ax.images and ax.get_label() == "<colorbar>")


def test_small_weights_get_a_visible_share_of_the_colours():
    """On a scale to 1, weight 0.01 takes 10% of the colour range (1% on a linear scale) and 0.25 half."""
    norm = weight_norm(1.0)
    assert float(norm(0.01)) == pytest.approx(0.1, abs=1e-9)
    assert float(norm(0.01)) > 0.05
    assert float(norm(0.25)) == pytest.approx(0.5, abs=1e-9)
    assert float(norm(0.0)) == 0.0 and float(norm(1.0)) == 1.0
    assert float(weight_norm(0.5)(0.125)) == pytest.approx(0.5, abs=1e-9)  # relative to the largest weight


@pytest.mark.parametrize("draw", ["full", "zoom"])
def test_every_panel_is_coloured_by_the_square_root_of_its_weight(draw):
    """The colours drawn are viridis(√(w / largest weight)): a weight of 1% of the peak is drawn at 10% of
    the colour map, not at 1%. The colour bar's ticks are weights, placed at √(w / vmax) along it."""
    import matplotlib
    w = causal_maps(3, 20, seed=1)
    w[1, 19, 19] = 1.0  # the scale's top: a weight of exactly 1
    fig = draw_heatmap(w) if draw == "full" else draw_heatmap_zoom(w, None, last=12)
    shown = images(fig)
    assert len(shown) == 3
    vmax = max(float(im.get_array().max()) for im in shown)
    viridis = matplotlib.colormaps["viridis"]
    for im in shown:
        data = im.get_array()
        rgba = im.to_rgba(data)  # what the canvas paints for each cell
        visible = ~np.ma.getmaskarray(data)
        expected = viridis(np.sqrt(np.asarray(data.filled(0.0)) / vmax))
        np.testing.assert_allclose(rgba[visible] / 255.0 if rgba.dtype == np.uint8 else rgba[visible],
                                   expected[visible], atol=1 / 255 + 1e-6)
        linear = viridis(np.asarray(data.filled(0.0)) / vmax)
        small = visible & (np.asarray(data.filled(0.0)) < 0.05 * vmax) & (np.asarray(data.filled(0.0)) > 0.005 * vmax)
        assert small.any()  # the cells a linear scale would leave near-black
        assert np.abs(expected[small] - linear[small]).max() > 0.1
    bar = colour_bar_axes(fig)
    assert "weight" in bar.get_ylabel()
    ticks = bar.get_yticks()
    labels = [float(t.get_text()) for t in bar.get_yticklabels()]
    assert labels == pytest.approx(list(ticks), rel=0.01, abs=1e-12)  # labelled in weights
    low, high = bar.get_ylim()
    for t in ticks:  # where each tick sits along the bar: √ of its share of the scale
        y = bar.transAxes.inverted().transform(bar.transData.transform((0.0, t)))[1]
        assert y == pytest.approx(math.sqrt(t / vmax), abs=1e-6), (t, y, low, high)


@given(st.floats(min_value=1e-6, max_value=1.0))
@settings(max_examples=200, deadline=None)
def test_colour_bar_ticks_are_round_weights_spread_along_the_bar(vmax):
    ticks = colour_bar_ticks(vmax)
    assert ticks[0] == 0.0 and len(ticks) >= 2
    assert all(0.0 <= t <= vmax for t in ticks)
    positions = [math.sqrt(t / vmax) for t in ticks]
    assert all(b - a >= 0.1 for a, b in zip(positions, positions[1:]))  # no two labels on top of each other
    assert positions[-1] >= 0.85  # the top of the bar is labelled


@pytest.mark.parametrize("T,last", [(100, 64), (256, 64), (40, 64), (30, 12), (5, 1)])
def test_zoom_draws_exactly_the_last_queries_over_their_last_keys(tmp_path, T, last):
    w = causal_maps(4, T, seed=T)
    tokens = [["\n", " the", "ab", "$", "x"][t % 5] + str(t) for t in range(T)]
    path = tmp_path / "zoom.png"
    fig = draw_heatmap_zoom(w, tokens, path, "layer 1, step 7", last=last)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    n = min(last, T)
    shown = images(fig)
    assert [ax.get_title() for ax in fig.axes if ax.images] == [f"head {h}" for h in range(4)]
    future = np.triu(np.ones((n, n), dtype=bool), 1)
    for h, im in enumerate(shown):
        data = im.get_array()
        assert data.shape == (n, n)
        np.testing.assert_array_equal(np.ma.getmaskarray(data), future)  # the masked future, nothing else
        np.testing.assert_array_equal(data.data[~future], w[h, T - n:, T - n:].numpy()[~future])
    labels = [token_label(t) for t in tokens[T - n:]]
    for ax in fig.axes:
        if not ax.images:
            continue
        for axis in ("x", "y"):  # every panel: its keys' tokens under it, its queries' beside it, cell by cell
            assert cell_labels(ax, axis) == [(i, label, pytest.approx(cell_labels(ax, axis)[0][2]))
                                             for i, label in enumerate(labels)]
            assert cell_labels(ax, axis)[0][2] >= 7.0
        assert not ax.get_xticklabels() and not ax.get_yticklabels()  # no tick machinery underneath
    assert f"last {n} queries" in fig._suptitle.get_text() and "layer 1, step 7" in fig._suptitle.get_text()
    assert f"{T - n}..{T - 1}" in fig._suptitle.get_text() or n == 1


def test_zoom_default_is_64_and_bad_arguments_are_refused():
    assert ZOOM_LAST == 64
    w = causal_maps(2, 80)
    fig = draw_heatmap_zoom(w, None)
    assert images(fig)[0].get_array().shape == (64, 64)
    assert [text for _, text, _ in cell_labels(fig.axes[0], "x")][:2] == ["16", "17"]  # positions without tokens
    assert images(draw_heatmap_zoom(w, None, heads=[1]))[0].get_array().data[-1, -1] == w[1, -1, -1]
    with pytest.raises(ValueError, match="last=0"):
        draw_heatmap_zoom(w, None, last=0)
    with pytest.raises(ValueError, match="tokens"):
        draw_heatmap_zoom(w, ["a"] * 79)
    with pytest.raises(ValueError, match="batch item"):
        draw_heatmap_zoom(w[None], None)
    with pytest.raises(ValueError, match="heads"):
        draw_heatmap_zoom(w, None, heads=[2])


# --- HeatmapCanvas: the same PNGs as a whole draw, again and again --------------------------------------------

def png_pixels(path) -> np.ndarray:
    from matplotlib.image import imread
    return imread(path)  # (H, W, 4) floats


def tokens_of(T: int) -> list[str]:
    return [f"t{i}" if i % 3 else " x" for i in range(T)]


@pytest.mark.parametrize("zoom", [False, True])
def test_a_canvas_redrawing_new_maps_writes_the_pixels_a_whole_draw_writes(tmp_path, zoom):
    """Drawn after other maps (a larger peak, so other colour-bar ticks), each picture is pixel for pixel the one
    draw_heatmap / draw_heatmap_zoom writes for its maps and title: nothing of an earlier map is left, and the
    kept labels are the ones a whole draw paints."""
    T = 70 if zoom else 30
    tokens = tokens_of(T)
    canvas = HeatmapCanvas(tokens, zoom=zoom, last=40)
    for step, peak in ((0, 1.0), (1, 0.3), (2, 0.9)):
        w = causal_maps(4, T, seed=step) * peak
        title = f"layer 1, step {step}"
        canvas.draw(w, title, tmp_path / f"canvas_{step}.png")
        whole = tmp_path / f"whole_{step}.png"
        draw_heatmap_zoom(w, tokens, whole, title, last=40) if zoom else draw_heatmap(w, tokens, title, whole)
        np.testing.assert_array_equal(png_pixels(tmp_path / f"canvas_{step}.png"), png_pixels(whole))
    assert not np.array_equal(png_pixels(tmp_path / "canvas_0.png"), png_pixels(tmp_path / "canvas_1.png"))


@pytest.mark.parametrize("zoom", [False, True])
def test_one_canvas_serving_several_layers_in_turn_writes_each_layers_whole_draw(tmp_path, zoom):
    """As a training run's snapshots use it: one canvas per picture for every drawn layer, the layers' maps and
    titles alternating at each step; every picture is the one a whole draw of that layer's maps writes."""
    T = 70 if zoom else 30
    tokens = tokens_of(T)
    canvas = HeatmapCanvas(tokens, zoom=zoom, last=40)
    for step in (0, 1):
        for layer, peak in ((0, 1.0), (2, 0.4)):
            w = causal_maps(4, T, seed=10 * step + layer) * peak
            title = f"layer {layer}, step {step}"
            canvas.draw(w, title, tmp_path / f"canvas_{layer}_{step}.png")
            whole = tmp_path / f"whole_{layer}_{step}.png"
            draw_heatmap_zoom(w, tokens, whole, title, last=40) if zoom else draw_heatmap(w, tokens, title, whole)
            np.testing.assert_array_equal(png_pixels(tmp_path / f"canvas_{layer}_{step}.png"), png_pixels(whole))


def test_a_canvas_draws_a_new_shape_or_a_title_appearing_whole_again(tmp_path):
    """Maps of another length, or a title where there was none (and back), get the layout a whole draw gives them:
    the same pixels, of the new size."""
    canvas = HeatmapCanvas(None, heads=[2, 0])
    cases = [(causal_maps(3, 12, seed=1), ""), (causal_maps(3, 20, seed=2), ""), (causal_maps(3, 20, seed=3), "t"),
             (causal_maps(3, 20, seed=4), "")]
    for k, (w, title) in enumerate(cases):
        canvas.draw(w, title, tmp_path / f"c{k}.png")
        draw_heatmap(w, None, title, tmp_path / f"w{k}.png", heads=[2, 0])
        np.testing.assert_array_equal(png_pixels(tmp_path / f"c{k}.png"), png_pixels(tmp_path / f"w{k}.png"))
    assert not np.array_equal(png_pixels(tmp_path / "c2.png"), png_pixels(tmp_path / "c3.png"))  # the title


def test_a_canvas_checks_its_maps_like_a_whole_draw():
    with pytest.raises(ValueError, match="last=0"):
        HeatmapCanvas(None, zoom=True, last=0)
    canvas = HeatmapCanvas(["a"] * 8, zoom=True)
    with pytest.raises(ValueError):
        canvas.draw(causal_maps(2, 9), "x")  # 9 positions, 8 tokens


def zlib_level_class(path) -> int:
    """The compression level class zlib writes into its stream header (FLEVEL, RFC 1950): 0 for levels 0-1,
    1 for 2-5, 2 for 6 (Pillow's default), 3 for 7-9."""
    data = path.read_bytes()
    idat = data.index(b"IDAT") + 4
    return data[idat + 1] >> 6


@pytest.mark.parametrize("zoom", [False, True])
def test_pngs_are_written_at_the_chosen_zlib_level(tmp_path, zoom):
    assert PNG_COMPRESS_LEVEL == 3
    w = causal_maps(2, 70)
    draw_heatmap(w, None, "", tmp_path / "a.png")
    HeatmapCanvas(None, zoom=zoom).draw(w, "", tmp_path / "b.png")
    assert zlib_level_class(tmp_path / "a.png") == zlib_level_class(tmp_path / "b.png") == 1

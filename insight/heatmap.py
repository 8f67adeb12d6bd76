"""Heatmaps of attention maps: every head of a layer as one grid of pictures, with token labels.

Colour follows √weight (matplotlib's PowerNorm(0.5)), the colour bar labelled in weights: on a linear
scale a 256-key row's typical weight (~0.004) and a previous-token diagonal of 0.2 among peaks of 1
are all near-black, while √ maps 0.01 to a tenth of the scale and 0.25 to half of it.

    draw_heatmap(weights, tokens, title, path)        # every head, the whole map (numbered ticks beyond 48 tokens)
    draw_heatmap_zoom(weights, tokens, path, title)   # the last 64 queries over their last 64 keys, token labels
    HeatmapCanvas(tokens, zoom).draw(weights, title, path)  # either one again and again, as training snapshots do:
                                                            # the same PNGs, the unchanging labels drawn once

Drawing uses matplotlib's object API (Figure + the Agg canvas), imported lazily: importing this module
stays cheap, nothing touches pyplot's global state or needs a display, and a figure is freed as soon
as it is no longer referenced (no plt.close needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from common.writes import write_file
from insight.stats import ArrayLike

if TYPE_CHECKING:
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

LABEL_MAX_T = 48  # token labels on the axes up to this many positions; numbered ticks beyond
ZOOM_LAST = 64  # draw_heatmap_zoom's default: the last 64 queries over their last 64 keys
COLOUR_GAMMA = 0.5  # colour ∝ weight ** 0.5
_LABEL_PT = 6.0  # the smallest tick label that reads: 6 pt (8 px at dpi 100)
_SPECIAL = {"\n": "⏎", " ": "␣", "\t": "⇥", "$": r"\$"}  # '$' would start matplotlib mathtext
CELL_LABEL_X, CELL_LABEL_Y = "cell-label-x", "cell-label-y"  # the gid of a panel's token/position labels
# zlib level 3, not Pillow's 6: a 64-token zoom of 4 heads (1843 x 1847) encoded in 0.044 s instead of 0.36, 5%
# larger (260 against 249 kB); the pixels are the same
PNG_COMPRESS_LEVEL = 3
_PNG_OPTIONS = {"compress_level": PNG_COMPRESS_LEVEL}
FIGURE_TITLE = "figure-title"  # the gid of a grid's title
COLOUR_BAR = "<colorbar>"  # the label of a grid's colour bar axes
_TICK_CANDIDATES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def token_label(token: str, max_len: int = 8) -> str:
    """A readable axis label for a token: newline -> '⏎', space -> '␣', tab -> '⇥', other control
    characters as escapes ('\\r', '\\x00'), empty -> '∅', cut to max_len characters with '…'."""
    if token == "":
        return "∅"
    out = []
    for ch in token:
        if ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif not ch.isprintable():
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= max_len else text[: max_len - 1] + "…"


def weight_norm(vmax: float) -> "Normalize":
    """The colour scale of every heatmap: 0 .. vmax mapped through √ (PowerNorm(0.5)), so a weight of
    0.01 on a scale to 1 takes a tenth of the colours instead of a hundredth."""
    from matplotlib.colors import PowerNorm
    return PowerNorm(gamma=COLOUR_GAMMA, vmin=0.0, vmax=max(float(vmax), 1e-12))


def colour_bar_ticks(vmax: float) -> list[float]:
    """Round weights for the colour bar, spread evenly along the √ scale: 0, then values from 0.001 .. 1 at
    least an eighth of the bar apart (of the bar's length, which is √(w / vmax)), and vmax's own position
    when no round value is near the top."""
    vmax = max(float(vmax), 1e-12)
    ticks = [0.0]
    for t in _TICK_CANDIDATES:
        if t <= vmax and math.sqrt(t / vmax) - math.sqrt(ticks[-1] / vmax) >= 0.125:
            ticks.append(t)
    if 1.0 - math.sqrt(ticks[-1] / vmax) >= 0.125:
        ticks.append(min(float(f"{vmax:.2g}"), vmax))
    return ticks


def _maps(weights: ArrayLike, tokens: Sequence[str] | None, who: str) -> np.ndarray:
    w = torch.as_tensor(weights).detach().float().cpu().numpy()
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"{who} takes (n_head, T, T) weights (pick one batch item), got {w.shape}")
    if tokens is not None and len(tokens) != w.shape[1]:
        raise ValueError(f"{len(tokens)} tokens for T={w.shape[1]} positions")
    return w


def _heads(heads: Sequence[int] | None, n_head: int) -> list[int]:
    heads = list(range(n_head)) if heads is None else [int(h) for h in heads]
    if not heads or any(not 0 <= h < n_head for h in heads):
        raise ValueError(f"heads={heads}: must be a non-empty list in 0..{n_head - 1}")
    return heads


def _label_cells(ax, axis: str, labels: _CellLabels) -> None:
    """A panel's labels.names[i] beside cell labels.ticks[i], under it ("x") or left of it ("y"), 2 pt away, as
    plain Text artists. Not matplotlib's ticks: a Tick is a label, two marker lines and a layout of its own, and
    making and measuring the 512 of a 64-token zoom of 4 heads took 1.0 s of its 1.45 s (cProfile)."""
    from matplotlib.transforms import offset_copy
    x = axis == "x"  # x: the cell's centre in data coordinates on the panel's bottom edge (axes coordinates)
    where = offset_copy(ax.get_xaxis_transform() if x else ax.get_yaxis_transform(), fig=ax.figure,
                        x=0 if x else -2, y=-2 if x else 0, units="points")
    for t, name in zip(labels.ticks, labels.names):
        ax.text(*((t, 0) if x else (0, t)), name, transform=where, fontsize=labels.fontsize,
                rotation=90 if x and labels.rotate else 0, ha="center" if x else "right", va="top" if x else "center",
                gid=CELL_LABEL_X if x else CELL_LABEL_Y)


def cell_labels(ax, axis: str) -> list[tuple[float, str, float]]:
    """The labels a panel of draw_heatmap / draw_heatmap_zoom shows along `axis` ("x": keys, "y": queries): (the
    cell they label, in data coordinates, text, font size) from first to last cell."""
    gid = CELL_LABEL_X if axis == "x" else CELL_LABEL_Y
    return sorted((t.get_position()[0 if axis == "x" else 1], t.get_text(), t.get_fontsize()) for t in ax.texts
                  if t.get_gid() == gid)


@dataclass(frozen=True)
class _CellLabels:
    """How a grid's panels are labelled: names[i] beside cell ticks[i], at fontsize, the x labels rotated
    a quarter turn with rotate. The layout sizes its margins from these, so they travel together."""
    ticks: list[int]
    names: list[str]
    fontsize: float
    rotate: bool


@dataclass(frozen=True)
class _Captions:
    """The texts around a grid: the figure's title ("" for none) and the two axis labels."""
    title: str
    xlabel: str
    ylabel: str


def _draw_grid(panels: np.ndarray, heads: list[int], panel: float, labels: _CellLabels, captions: _Captions,
               every_panel: bool = False) -> "Figure":
    """panels (len(heads), n, n), the causal maps or their causal crops (the future is the upper triangle),
    as a near-square grid titled "head h", each panel `panel` inches square; tick labels on the outer edges
    of the grid (every panel's edges with every_panel); one √ colour scale.

    The layout is computed here, from the panel size and the longest tick label, not by matplotlib's
    constrained layout: that measures every label's extent at each save, half of the drawing time of a
    labelled grid (a training run draws one per layer at every snapshot)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = panels.shape[-1]
    ncols = math.ceil(math.sqrt(len(heads)))
    nrows = math.ceil(len(heads) / ncols)
    # inches: the widest tick label (a glyph is at most ~0.62 em wide), one line of text, a small gap
    label_long = max((len(t) for t in labels.names), default=1) * labels.fontsize * 0.62 / 72 + 0.06
    label_line = labels.fontsize * 1.3 / 72 + 0.06
    y_label_w = label_long  # y tick labels beside a panel
    x_label_h = label_long if labels.rotate else label_line  # x tick labels under it
    title_h, gap = 0.28, 0.12  # a panel's "head h" title; space between neighbouring panels
    cell_w = panel + gap + (y_label_w if every_panel else 0.0)
    cell_h = panel + title_h + gap + (x_label_h if every_panel else 0.0)
    left = 0.3 + (0.0 if every_panel else y_label_w)  # the grid's y label, then the outer tick labels
    bottom = 0.3 + (0.0 if every_panel else x_label_h)
    top = 0.45 if captions.title else 0.1
    bar_w, bar_pad, bar_labels = 0.15, 0.15, 0.75  # the colour bar, its gap, its ticks and label
    # whole pixels at dpi 100 (a saved PNG is exactly figsize x dpi)
    width = math.ceil(100 * (left + ncols * cell_w + bar_pad + bar_w + bar_labels)) / 100
    height = math.ceil(100 * (bottom + nrows * cell_h + top)) / 100
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    images = []
    for k, h in enumerate(heads):
        row, col = divmod(k, ncols)
        x0 = left + col * cell_w + (y_label_w if every_panel else 0.0)
        y0 = height - top - (row + 1) * cell_h + (x_label_h if every_panel else 0.0) + gap
        ax = fig.add_axes((x0 / width, y0 / height, panel / width, panel / height))
        images.append(ax.imshow(np.zeros((n, n)), cmap=cmap, interpolation="nearest", aspect="auto"))
        ax.set_title(f"head {h}", fontsize=9)
        ax.set(xticks=[], yticks=[])
        if k + ncols >= len(heads) or every_panel:  # the bottom row's keys, or every panel's
            _label_cells(ax, "x", labels)
        if col == 0 or every_panel:
            _label_cells(ax, "y", labels)
    grid_top = height - top
    grid_h = nrows * cell_h - title_h - gap
    bar_h = grid_h * min(1.0, 0.4 + 0.3 * nrows) * 0.8
    bar_x = left + ncols * cell_w + bar_pad
    bar_ax = fig.add_axes((bar_x / width, (grid_top - title_h - (grid_h + bar_h) / 2) / height,
                           bar_w / width, bar_h / height), label=COLOUR_BAR)
    fig.colorbar(images[-1], cax=bar_ax, label="attention weight (colour ∝ √weight)")
    _show_maps(images, panels)
    fig.supxlabel(captions.xlabel, fontsize=9, x=(left + ncols * cell_w / 2) / width, y=0.08 / height, va="bottom")
    fig.supylabel(captions.ylabel, fontsize=9, x=0.06 / width, y=(bottom + nrows * cell_h / 2) / height, ha="left")
    if captions.title:
        fig.suptitle(captions.title, fontsize=11, y=1 - 0.08 / height, va="top", gid=FIGURE_TITLE)
    return fig


def _show_maps(images: list, panels: np.ndarray) -> None:
    """Put panels (len(images), n, n) into the grid's images, the future (upper triangle) masked, on one √ colour
    scale from 0 to their largest weight, and label the colour bar (the last image's) for that scale."""
    n = panels.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)  # (n, n): keys a query cannot see
    vmax = max(float(np.nanmax(panels)), 1e-12)
    norm = weight_norm(vmax)
    for image, panel in zip(images, panels):
        image.set_data(np.ma.masked_array(panel, mask=future))
        image.set_norm(norm)
    bar = images[-1].colorbar
    bar.update_normal(images[-1])
    ticks_w = colour_bar_ticks(vmax)
    bar.set_ticks(ticks_w, labels=[f"{t:.2g}" for t in ticks_w])


def draw_heatmap(weights: ArrayLike, tokens: Sequence[str] | None = None, title: str = "",
                 path: str | Path | None = None, heads: Sequence[int] | None = None) -> "Figure":
    """Attention maps (n_head, T, T) as a near-square grid of heatmaps, one per head, titled "head h".
    tokens (length T, shown via `token_label`) label both outer axes of the grid when T <= LABEL_MAX_T
    and the panels can be made big enough for 6 pt labels within the size cap (fewer heads: bigger
    panels); otherwise ticks are numbered positions (draw fewer `heads`, or `draw_heatmap_zoom`, to get
    the tokens back). One √ colour scale (`weight_norm`), 0 .. the largest weight shown, with one colour bar
    in weights; the masked future (upper triangle) light grey. heads: which to draw (default all). Returns
    the Figure, also saved as a PNG at dpi 100 when path is given."""
    w = _maps(weights, tokens, "draw_heatmap")
    fig, _ = _full_grid(w, tokens, title, _heads(heads, w.shape[0]))
    return save_png(fig, path)


def draw_heatmap_zoom(weights: ArrayLike, tokens: Sequence[str] | None, path: str | Path | None = None,
                      title: str = "", last: int = ZOOM_LAST, heads: Sequence[int] | None = None) -> "Figure":
    """The corner of the maps (n_head, T, T) where the latest queries meet their nearest keys: queries
    T-n..T-1 over keys T-n..T-1, n = min(last, T), every head (or `heads`), each tick of every panel
    labelled with its token (`token_label`, 7.5 pt: panels grow with n, not capped like draw_heatmap's). This is
    where a previous-token diagonal or an induction stripe shows at block 256, where the full map gives
    each cell a pixel or less. A crop's rows hold only part of each query's weight (the rest is on
    earlier keys), so the colour scale (√, as draw_heatmap's) runs to the largest weight in the crop.
    Returns the Figure; saved as a PNG at dpi 100 when path is given. The images' data arrays are
    exactly weights[h, T-n:, T-n:] (future masked)."""
    w = _maps(weights, tokens, "draw_heatmap_zoom")
    fig, _ = _zoom_grid(w, tokens, title, _zoom_last(last), _heads(heads, w.shape[0]))
    return save_png(fig, path)


@dataclass(frozen=True)
class _Crop:
    """What a grid shows of maps (n_head, T, T): the heads, queries and keys from `start` on; and what its figure
    title adds to the caller's title (the zoom's "last n queries × ..." line)."""
    heads: list[int]
    start: int
    title_suffix: str

    def panels(self, w: np.ndarray) -> np.ndarray:  # (len(heads), T - start, T - start)
        return w[self.heads][:, self.start:, self.start:]

    def title(self, title: str) -> str:
        return f"{title}: {self.title_suffix}" if title and self.title_suffix else title or self.title_suffix


def _full_grid(w: np.ndarray, tokens: Sequence[str] | None, title: str, heads: list[int]) -> tuple["Figure", _Crop]:
    """draw_heatmap's figure, and what it shows."""
    T = w.shape[1]
    ncols = math.ceil(math.sqrt(len(heads)))
    nrows = math.ceil(len(heads) / ncols)
    max_panel = min(5.0, 16.0 / ncols, 14.0 / nrows)  # inches per heatmap: whole figure at most ~17 x 15
    label_panel = max(2.5, T / 9.6)  # fits T labels at 6 pt (8 px at dpi 100), the least that reads
    labelled = tokens is not None and T <= LABEL_MAX_T and label_panel <= max_panel
    panel = label_panel if labelled else min(2.5, max_panel)
    fontsize = min(8.0, 0.8 * panel * 72 / T) if labelled else 7.0
    ticks = list(range(T)) if labelled else list(range(0, T, max(1, math.ceil(T / 8))))  # ~8 numbered ticks
    names = [token_label(t) for t in tokens] if labelled else [str(t) for t in ticks]
    crop = _Crop(heads, 0, "")
    fig = _draw_grid(crop.panels(w), heads, panel, _CellLabels(ticks, names, fontsize, rotate=labelled),
                     _Captions(crop.title(title), "key", "query"))
    return fig, crop


def _zoom_last(last: int) -> int:
    if int(last) < 1:
        raise ValueError(f"last={last}: the zoom needs at least one query")
    return int(last)


def _zoom_grid(w: np.ndarray, tokens: Sequence[str] | None, title: str, last: int,
               heads: list[int]) -> tuple["Figure", _Crop]:
    """draw_heatmap_zoom's figure, and what it shows."""
    T = w.shape[1]
    n = min(last, T)
    start = T - n
    panel = max(2.5, n / 7.7)  # n labels at 7.5 pt, a label every 0.8 of its height
    fontsize = min(8.0, 0.8 * panel * 72 / n)
    ticks = list(range(n))
    names = ([token_label(t) for t in tokens[start:]] if tokens is not None
             else [str(start + i) for i in ticks])
    span = f"positions {start}..{T - 1}" if n > 1 else f"position {start}"
    crop = _Crop(heads, start, f"last {n} queries × their last {n} keys ({span} of {T})")
    captions = _Captions(crop.title(title), f"key ({span})", f"query ({span})")
    fig = _draw_grid(crop.panels(w), heads, panel, _CellLabels(ticks, names, fontsize, rotate=True), captions,
                     every_panel=True)
    return fig, crop


class HeatmapCanvas:
    """The pictures of one layer's maps at many steps, as a training run's snapshots draw them: draw_heatmap's
    (zoom=False) or draw_heatmap_zoom's (zoom=True), for maps that keep their shape, tokens and heads.

    The first picture is drawn whole, and everything in it that no map changes -- the token labels, the panels'
    titles, the axis captions -- is kept as pixels. A later picture paints over a copy of those the parts a map
    does change: each panel's image, then its frame (the order a whole draw paints them), the colour bar and the
    figure's title. The PNG is the one draw_heatmap / draw_heatmap_zoom would write for those maps, pixel for
    pixel, without laying out and rendering the labels again: a 64-token zoom of 4 heads carries 512 of them,
    ~0.7 s of its ~1.1 s. A new shape, or a title where there was none (or none where there was one), is drawn
    whole again. Holds the figure and one copy of its pixels (4 bytes a pixel) between pictures."""

    def __init__(self, tokens: Sequence[str] | None = None, zoom: bool = False,
                 heads: Sequence[int] | None = None, last: int = ZOOM_LAST):
        self.tokens, self.zoom, self.heads, self.last = tokens, zoom, heads, _zoom_last(last)
        self._drawn = None  # (weights' shape, titled?, figure, crop, background pixels)

    def draw(self, weights: ArrayLike, title: str = "", path: str | Path | None = None) -> "Figure":
        """The picture of `weights` (n_head, T, T) under `title`, saved as a PNG at dpi 100 when path is given."""
        w = _maps(weights, self.tokens, "HeatmapCanvas.draw")
        if self._drawn is None or self._drawn[:2] != (w.shape, bool(title)):
            heads = _heads(self.heads, w.shape[0])
            fig, crop = (_zoom_grid(w, self.tokens, title, self.last, heads) if self.zoom
                         else _full_grid(w, self.tokens, title, heads))
            for artist in _changing_artists(fig):
                artist.set_animated(True)  # left out of canvas.draw(): the kept pixels hold the rest
            fig.canvas.draw()
            self._drawn = (w.shape, bool(title), fig, crop, fig.canvas.copy_from_bbox(fig.bbox))
        else:
            fig, crop, background = self._drawn[2:]
            fig.canvas.restore_region(background)
            _show_maps([ax.images[0] for ax in _panel_axes(fig)], crop.panels(w))
            for text in fig.texts:
                if text.get_gid() == FIGURE_TITLE:
                    text.set_text(crop.title(title))
        for artist in _changing_artists(fig):
            fig.draw_artist(artist)
        if path is not None:
            from matplotlib.image import imsave
            pixels = np.asarray(fig.canvas.buffer_rgba())  # (H, W, 4) uint8
            write_file(path, lambda f: imsave(f, pixels, format="png", dpi=100, pil_kwargs=_PNG_OPTIONS))
        return fig


def _panel_axes(fig: "Figure") -> list:
    return [ax for ax in fig.axes if ax.get_label() != COLOUR_BAR]


def _changing_artists(fig: "Figure") -> list:
    """What a new map changes in a grid, in the order a whole draw paints it: each panel's image and then its
    frame, the colour bar (a whole axes), the figure's title."""
    out = []
    for ax in _panel_axes(fig):
        out += [*ax.images, *ax.spines.values()]
    return out + [ax for ax in fig.axes if ax.get_label() == COLOUR_BAR] + [
        text for text in fig.texts if text.get_gid() == FIGURE_TITLE]


def attention_grid_image(weights: ArrayLike, tokens: Sequence[str] | None = None, title: str = "",
                         heads: Sequence[int] | None = None) -> np.ndarray:
    """The `draw_heatmap` figure rendered to an RGB array (H, W, 3) uint8, e.g. for wandb.Image."""
    fig = draw_heatmap(weights, tokens, title, heads=heads)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)


def save_png(fig: "Figure", path: str | Path | None) -> "Figure":
    """`fig`, written (when path is given) as a PNG at dpi 100 and zlib level PNG_COMPRESS_LEVEL, whole, through
    common/writes.py (a link at `path` is replaced)."""
    if path is not None:
        write_file(path, lambda f: fig.savefig(f, format="png", dpi=100, pil_kwargs=_PNG_OPTIONS))
    return fig

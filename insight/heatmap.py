"""Heatmaps of attention maps: every head of a layer as one grid of pictures, with token labels.

Drawing uses matplotlib's object API (Figure + the Agg canvas), imported lazily: importing this module
stays cheap, nothing touches pyplot's global state or needs a display, and a figure is freed as soon
as it is no longer referenced (no plt.close needed).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from insight.stats import ArrayLike

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LABEL_MAX_T = 48  # token labels on the axes up to this many positions; numbered ticks beyond
_SPECIAL = {"\n": "⏎", " ": "␣", "\t": "⇥", "$": r"\$"}  # '$' would start matplotlib mathtext


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


def draw_heatmap(weights: ArrayLike, tokens: Sequence[str] | None = None, title: str = "",
                 path: str | Path | None = None, heads: Sequence[int] | None = None) -> "Figure":
    """Draw attention maps (n_head, T, T) as a near-square grid of heatmaps, one per head, titled "head h".

    tokens (length T, shown via `token_label`) label both outer axes of the grid when T <= LABEL_MAX_T
    and the panels can be made big enough for 6 pt labels within the size cap (fewer heads: bigger
    panels); otherwise ticks are numbered positions (draw fewer `heads` to get the tokens back).
    Colours share one scale, 0 .. the largest weight shown, with one colour bar; the masked future
    (upper triangle) is light grey. heads picks which heads to draw (default all). Always returns
    the Figure (a pyplot-free Agg figure: freed once unreferenced); when path is given it is also
    saved there as a PNG at dpi 100.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w = torch.as_tensor(weights).detach().float().cpu().numpy()
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"draw_heatmap takes (n_head, T, T) weights (pick one batch item), got {w.shape}")
    n_head, T, _ = w.shape
    heads = list(range(n_head)) if heads is None else [int(h) for h in heads]
    if not heads or any(not 0 <= h < n_head for h in heads):
        raise ValueError(f"heads={heads}: must be a non-empty list in 0..{n_head - 1}")
    if tokens is not None and len(tokens) != T:
        raise ValueError(f"{len(tokens)} tokens for T={T} positions")
    ncols = math.ceil(math.sqrt(len(heads)))
    nrows = math.ceil(len(heads) / ncols)
    max_panel = min(5.0, 16.0 / ncols, 14.0 / nrows)  # inches per heatmap: whole figure at most ~17 x 15
    label_panel = max(2.5, T / 9.6)  # fits T labels at 6 pt (8 px at dpi 100), the least that reads
    labelled = tokens is not None and T <= LABEL_MAX_T and label_panel <= max_panel
    panel = label_panel if labelled else min(2.5, max_panel)
    labels = [token_label(t) for t in tokens] if labelled else None
    fontsize = min(8.0, 0.8 * panel * 72 / T) if labelled else 7.0
    ticks = list(range(T)) if labelled else list(range(0, T, max(1, math.ceil(T / 8))))  # ~8 numbered ticks
    names = labels if labelled else [str(t) for t in ticks]

    fig = Figure(figsize=(ncols * panel + 1.0, nrows * panel + 0.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): keys a query cannot see
    vmax = max(float(np.nanmax(w[heads])), 1e-12)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    image = None
    for k, (ax, h) in enumerate(zip(axes, heads)):
        image = ax.imshow(np.ma.masked_array(w[h], mask=future), cmap=cmap, vmin=0.0, vmax=vmax,
                          interpolation="nearest", aspect="equal")
        ax.set_title(f"head {h}", fontsize=9)
        bottom, left = k + ncols >= len(heads), k % ncols == 0  # label only the outer edges of the grid
        ax.set_xticks(ticks, names if bottom else [], rotation=90 if labelled else 0, fontsize=fontsize)
        ax.set_yticks(ticks, names if left else [], fontsize=fontsize)
        ax.tick_params(length=0)
    for ax in axes[len(heads):]:
        ax.set_axis_off()
    fig.supxlabel("key", fontsize=9)
    fig.supylabel("query", fontsize=9)
    fig.colorbar(image, ax=list(axes[: len(heads)]), shrink=min(1.0, 0.4 + 0.3 * nrows) * 0.8,
                 aspect=20 * nrows, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=11)
    if path is not None:
        fig.savefig(path, format="png", dpi=100)
    return fig


def attention_grid_image(weights: ArrayLike, tokens: Sequence[str] | None = None, title: str = "",
                         heads: Sequence[int] | None = None) -> np.ndarray:
    """The `draw_heatmap` figure rendered to an RGB array (H, W, 3) uint8, e.g. for wandb.Image."""
    fig = draw_heatmap(weights, tokens, title, heads=heads)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)

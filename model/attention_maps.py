"""Attention-map statistics and heatmaps: what the attention of a trained GPT looks like, per head.

`GPT.attention_maps` returns causal weights (B, n_head, T, T). A picture of every head of every layer
is too much to read at every logging step, so this module boils each head down to four numbers that
can be logged during training (cheap, vectorised, on whatever device the weights live) and draws the
full maps as a grid of heatmaps when a picture is wanted.

Statistics (all per head; row i is query position i, which sees keys j <= i):
  entropy        mean over queries of H(row i) / log(i + 1): 1 = uniform over the visible keys, 0 = one key.
  sink_mass      mean over queries of w[i, 0]: how much attention is parked on the first token.
  mean_distance  mean over queries of sum_j w[i, j] (i - j), in tokens.
  decay_gamma    gamma of the power law m(d) ~ d**(-gamma), m(d) = mean weight at distance d = i - j.
Query row 0 sees only key 0 (its entropy is 0/0, its sink mass is always 1, its distance always 0),
so it carries no information: all three per-row means are over rows 1..T-1 (NaN when T == 1).

Drawing uses matplotlib's object API (Figure + the Agg canvas), imported lazily: importing this module
stays cheap, nothing touches pyplot's global state or needs a display, and a figure is freed as soon
as it is no longer referenced (no plt.close needed).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ArrayLike = Union[torch.Tensor, np.ndarray]

STAT_NAMES = ("entropy", "sink_mass", "mean_distance", "decay_gamma")
LABEL_MAX_T = 48  # token labels on the axes up to this many positions; numbered ticks beyond


def _as_maps(weights: ArrayLike) -> torch.Tensor:
    """(n_head, T, T) or (B, n_head, T, T) -> (B, n_head, T, T), float32 or wider, detached."""
    w = torch.as_tensor(weights).detach()
    if w.dim() == 3:
        w = w.unsqueeze(0)
    if w.dim() != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"attention weights must be (n_head, T, T) or (B, n_head, T, T), got {tuple(w.shape)}")
    return w.to(torch.promote_types(w.dtype, torch.float32))


def _row_mean(per_row: torch.Tensor) -> np.ndarray:
    """(B, n_head, T) per-query values -> (n_head,): mean over rows 1..T-1, then over the batch."""
    if per_row.shape[-1] < 2:
        return np.full(per_row.shape[1], np.nan)
    return per_row[..., 1:].mean(dim=(0, 2)).double().cpu().numpy()


def attention_entropy(weights: ArrayLike) -> np.ndarray:
    """Normalised attention entropy per head, (n_head,).

    Row i's entropy -sum_j w_ij log w_ij (0 log 0 = 0) divided by log(i + 1), the entropy of uniform
    attention over the i + 1 visible keys; averaged over query rows 1..T-1 (row 0 has log 1 = 0) and
    over the batch. 1 = uniform, 0 = all weight on one key.
    """
    w = _as_maps(weights)  # (B, H, T, T)
    T = w.shape[-1]
    h = -torch.special.xlogy(w, w).sum(dim=-1)  # (B, H, T) in nats
    norm = torch.log(torch.arange(1, T + 1, device=w.device, dtype=w.dtype)).clamp_min(1e-30)  # (T,): log(i+1)
    return _row_mean(h / norm)


def sink_mass(weights: ArrayLike) -> np.ndarray:
    """Mean weight on key 0 per head, (n_head,), over query rows 1..T-1 (row 0's is always 1) and the batch."""
    w = _as_maps(weights)
    return _row_mean(w[..., :, 0])  # (B, H, T)


def mean_distance(weights: ArrayLike) -> np.ndarray:
    """Mean attention distance in tokens per head, (n_head,): sum_j w_ij (i - j), averaged over query
    rows 1..T-1 (row 0's is always 0) and the batch. Uniform causal attention gives i/2 on row i."""
    w = _as_maps(weights)
    T = w.shape[-1]
    pos = torch.arange(T, device=w.device, dtype=w.dtype)  # (T,)
    dist = pos * w.sum(dim=-1) - w @ pos  # (B, H, T): i * sum_j w_ij - sum_j w_ij j
    return _row_mean(dist)


def distance_profile(weights: ArrayLike) -> np.ndarray:
    """m(d) per head, (n_head, T): mean over the batch and over queries i >= d of w[i, i - d], d = 0..T-1."""
    w = _as_maps(weights)
    B, H, T, _ = w.shape
    i = torch.arange(T, device=w.device)
    d = i[:, None] - i[None, :]  # (T, T): distance i - j
    d = torch.where(d >= 0, d, torch.full_like(d, T))  # the future goes to an overflow bin T
    sums = torch.zeros(H, T + 1, device=w.device, dtype=w.dtype)
    sums.scatter_add_(1, d.reshape(1, T * T).expand(H, -1), w.sum(dim=0).reshape(H, T * T))  # (H, T+1)
    counts = (B * (T - torch.arange(T, device=w.device))).to(w.dtype)  # (T,): B * (T - d) queries reach distance d
    return (sums[:, :T] / counts).double().cpu().numpy()


def decay_exponent(weights: ArrayLike) -> np.ndarray:
    """Power-law decay exponent gamma per head, (n_head,), positive when attention decays with distance.

    Fits log m(d) = c - gamma * log d by least squares over d = 1..T-1 (m from `distance_profile`,
    pooled over the batch), skipping distances with m(d) <= 0 or not finite; weights ~ d**-2 give
    gamma = 2. NaN for a head with fewer than 2 usable distances.
    """
    m = distance_profile(weights)[:, 1:]  # (H, T-1): d = 1..T-1
    x = np.log(np.arange(1, m.shape[1] + 1, dtype=np.float64))  # (T-1,)
    ok = np.isfinite(m) & (m > 0)  # (H, T-1)
    y = np.log(np.where(ok, m, 1.0))
    n = ok.sum(axis=1)  # (H,)
    safe_n = np.maximum(n, 1)
    x_mean = (ok * x).sum(axis=1) / safe_n
    y_mean = (ok * y).sum(axis=1) / safe_n
    dx = np.where(ok, x - x_mean[:, None], 0.0)
    dy = np.where(ok, y - y_mean[:, None], 0.0)
    sxx = (dx * dx).sum(axis=1)
    slope = (dx * dy).sum(axis=1) / np.where(sxx > 0, sxx, 1.0)
    return np.where((n >= 2) & (sxx > 0), -slope, np.nan)


def head_stats(weights: ArrayLike) -> dict[str, np.ndarray]:
    """All of STAT_NAMES for weights (n_head, T, T) or (B, n_head, T, T): {name: (n_head,) float64}.

    entropy, sink_mass and mean_distance are the batch mean of the per-item values; decay_gamma is
    fitted once to the distance profile pooled over the batch (steadier than averaging B fits)."""
    w = _as_maps(weights)
    return {"entropy": attention_entropy(w), "sink_mass": sink_mass(w),
            "mean_distance": mean_distance(w), "decay_gamma": decay_exponent(w)}


# --------------------------------------------------------------------------------------------------
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


def parse_layer_heads(spec: str, n_layer: int, n_head: int) -> dict[int, list[int]]:
    """'all' | '0,2' (whole layers) | '1:3,1:0' (layer:head pairs) -> {layer: [heads]}, checked against the
    model. Raises ValueError naming the bad part and the valid range."""
    spec = spec.strip()
    if spec == "all":
        return {layer: list(range(n_head)) for layer in range(n_layer)}
    selected: dict[int, list[int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        layer_text, _, head_text = part.partition(":")
        try:
            layer = int(layer_text)
            head = int(head_text) if head_text else None
        except ValueError:
            raise ValueError(f"'{part}' is not a layer or layer:head: use all, 0,2 or 1:3") from None
        if not 0 <= layer < n_layer:
            raise ValueError(f"layer {layer} is out of range: the model has layers 0..{n_layer - 1}")
        if head is not None and not 0 <= head < n_head:
            raise ValueError(f"head {head} is out of range: each layer has heads 0..{n_head - 1}")
        heads = selected.setdefault(layer, [])
        for h in ([head] if head is not None else range(n_head)):
            if h not in heads:
                heads.append(h)
    if not selected:
        raise ValueError(f"'{spec}' selects no layer: use all, 0,2 or 1:3")
    return selected


def dump_attention(weights_by_layer: dict[int, torch.Tensor], heads_by_layer: dict[int, list[int]],
                   tokens: Sequence[str], out_dir: str | Path,
                   token_ids: Sequence[int] | None = None) -> list[Path]:
    """Write `attn.npz` (per layer `layer_L`: all heads (n_head, T, T) float32, `heads_L`: the selected heads;
    `tokens`: the token strings; `token_ids`: the ids, when given - exact where a numpy string array is not,
    e.g. it drops a token's trailing NUL) and one heatmap `layer_L.png` of the selected heads per layer.
    weights_by_layer holds (n_head, T, T) maps, e.g. GPT.attention_maps(idx)[L][0]."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"tokens": np.array(list(tokens), dtype=str)}
    if token_ids is not None:
        if len(token_ids) != len(tokens):
            raise ValueError(f"{len(token_ids)} token ids for {len(tokens)} tokens")
        arrays["token_ids"] = np.array(list(token_ids), dtype=np.int64)
    written = []
    for layer, heads in sorted(heads_by_layer.items()):
        w = weights_by_layer[layer].detach().float().cpu().numpy()  # (n_head, T, T)
        arrays[f"layer_{layer}"] = w
        arrays[f"heads_{layer}"] = np.array(heads, dtype=np.int64)
        png = out_dir / f"layer_{layer}.png"
        draw_heatmap(w, tokens, title=f"layer {layer}", path=png, heads=heads)
        written.append(png)
    np.savez(out_dir / "attn.npz", **arrays)
    return [out_dir / "attn.npz", *written]

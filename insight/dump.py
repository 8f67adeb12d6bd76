"""Attention over a prompt, written to disk (sample.py --dump-attn): `attn.npz`, a heatmap per layer and
`attention.html`, the interactive explorer (insight/explorer/).

attn.npz holds, for each dumped layer L (T = the prompt's tokens):
    layer_L             (n_head, T, T) float32  the attention weights alpha_ij (rows sum to 1, future 0)
    heads_L             (k,) int64              the selected heads (the PNG draws these; every head is stored)
    value_norm_L        (n_head, T) float32     ||v_j W_O^h||: the length of key j's value vector once head h
                                                writes it into the residual stream (W_O^h: head h's columns
                                                of the output projection)
    value_weighted_L    (n_head, T, T) float32  alpha_ij * ||v_j W_O^h|| = ||alpha_ij v_j W_O^h||: how much
                                                key j moves query i's output (Kobayashi et al. 2020)
and `tokens` (each token's text), `token_ids` (exact ids). The value arrays are written when the dump
is made from GPT.attention_internals (`dump_internals`, what sample.py does).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from insight.explorer import write_explorer
from insight.heatmap import draw_heatmap
from insight.value_weighted import internals_value_norms
from model.attention import AttentionInternals


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
                   token_ids: Sequence[int] | None = None,
                   value_norms: dict[int, torch.Tensor] | None = None) -> list[Path]:
    """Write `attn.npz` (per layer `layer_L`: all heads (n_head, T, T) float32, `heads_L`: the selected heads;
    `tokens`: the token strings; `token_ids`: the ids, when given - exact where a numpy string array is not,
    e.g. it drops a token's trailing NUL) and one heatmap `layer_L.png` of the selected heads per layer.
    weights_by_layer holds (n_head, T, T) maps, e.g. GPT.attention_maps(idx)[L][0]. value_norms, when
    given, holds (n_head, T) ||v_j W_O^h|| per layer (insight.value_weighted): then `value_norm_L` and
    `value_weighted_L` are written too (see the module docstring)."""
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
        if value_norms is not None:
            norms = value_norms[layer].detach().float().cpu().numpy()  # (n_head, T)
            arrays[f"value_norm_{layer}"] = norms
            arrays[f"value_weighted_{layer}"] = w * norms[:, None, :]  # (n_head, T, T)
        png = out_dir / f"layer_{layer}.png"
        draw_heatmap(w, tokens, title=f"layer {layer}", path=png, heads=heads)
        written.append(png)
    np.savez(out_dir / "attn.npz", **arrays)
    return [out_dir / "attn.npz", *written]


def dump_internals(internals: dict[int, AttentionInternals], heads_by_layer: dict[int, list[int]],
                   tokens: Sequence[str], out_dir: str | Path, token_ids: Sequence[int] | None = None,
                   title: str = "attngpt attention", n_layer: int | None = None) -> list[Path]:
    """What sample.py --dump-attn writes, from GPT.attention_internals(idx, layers) of one prompt (B = 1):
    `attn.npz` with the value-weighted arrays, a heatmap per layer and `attention.html` (the explorer,
    its selected heads first). Returns the paths written."""
    out_dir = Path(out_dir)
    written = dump_attention({layer: it.weights[0] for layer, it in internals.items()}, heads_by_layer, tokens,
                             out_dir, token_ids=token_ids,
                             value_norms={layer: internals_value_norms(it)[0] for layer, it in internals.items()})
    html = write_explorer(out_dir / "attention.html", internals, tokens, heads_by_layer, title=title, n_layer=n_layer)
    return [*written, html]

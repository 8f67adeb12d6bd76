"""Attention maps over a prompt, written to disk: `attn.npz` and a heatmap per layer (sample.py --dump-attn)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from insight.heatmap import draw_heatmap


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

"""The explorer's data, packed small: 8-bit attention weights, float32 q/k/v for a byte budget, gzip.

Weights: each query row of each head is stored as 8-bit codes of its lower triangle (keys 0..i),
scaled by the row's largest weight: weight = code / 255 * row_max. The error is at most half a step,
row_max / 510 (a weight of 1/256 on a uniform row of 256 keys keeps ~0.2% accuracy; a row with a peak
keeps its peak exact to 0.2%). Every head of every layer is stored: the file holds the whole model view.

Step-by-step detail: q, k, v of a head in float32 (the softmax redone from rounded q and k would not
match the model's weights), so at GPT-2 small's shape (64 dims) one head costs 64 kB of q and, once
per kv head, 128 kB of k and v over 256 tokens. They are kept for as many heads as the byte budget
allows after the weights, the selected heads first in layer order, then the others.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass, field

import numpy as np

STEPS = 255  # 8-bit codes 0..255


def quantise_rows(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_head, T, T) causal weights -> (codes (n_head, T(T+1)/2) uint8: the lower triangles row after row,
    row_max (n_head, T) float32). Decoded by `dequantise_rows`; error <= row_max / 510 per weight."""
    w = np.asarray(weights, dtype=np.float32)
    n_head, T, _ = w.shape
    row_max = w.max(axis=-1)  # (n_head, T): > 0, every causal row sums to 1
    rows, cols = np.tril_indices(T)  # row-major: (0,0), (1,0), (1,1), (2,0), ...
    scaled = w[:, rows, cols] / np.maximum(row_max[:, rows], np.finfo(np.float32).tiny)
    codes = np.rint(np.clip(scaled, 0.0, 1.0) * STEPS).astype(np.uint8)
    return codes, row_max.astype(np.float32)


def dequantise_rows(codes: np.ndarray, row_max: np.ndarray) -> np.ndarray:
    """The inverse of `quantise_rows`, up to rounding: (n_head, T, T) float32, zero above the diagonal."""
    n_head, T = row_max.shape
    rows, cols = np.tril_indices(T)
    w = np.zeros((n_head, T, T), dtype=np.float32)
    w[:, rows, cols] = codes.astype(np.float32) / STEPS * row_max[:, rows]
    return w


@dataclass
class Blob:
    """Named arrays laid end to end, each at a multiple of 8 bytes (a Float32Array needs 4-byte offsets);
    `specs` says where: {name: [offset, dtype, shape]}. `gzipped()` is what the page embeds."""
    parts: list[bytes] = field(default_factory=list)
    specs: dict[str, list] = field(default_factory=dict)
    size: int = 0

    def add(self, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.dtype not in (np.uint8, np.float32):
            raise TypeError(f"{name}: the page reads uint8 and float32, got {array.dtype}")
        self.specs[name] = [self.size, str(array.dtype), list(array.shape)]
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()  # the page reads little-endian
        pad = -len(data) % 8
        self.parts.append(data + b"\0" * pad)
        self.size += len(data) + pad

    def gzipped(self) -> bytes:
        return gzip.compress(b"".join(self.parts), compresslevel=6, mtime=0) if self.parts else b""


def detail_order(layers: list[int], selected: dict[int, list[int]], n_head: int) -> list[tuple[int, int]]:
    """The (layer, head) pairs in the order they get float32 q/k/v: the selected heads of each layer
    first (in layer order), then the other heads."""
    first = [(layer, h) for layer in layers for h in selected[layer]]
    rest = [(layer, h) for layer in layers for h in range(n_head) if h not in selected[layer]]
    return first + rest


def choose_detail(order: list[tuple[int, int]], n_rep: int, head_bytes: int, budget: int) -> dict[int, list[int]]:
    """Greedily the pairs of `order` whose q (head_bytes) and, once per kv head, k and v (2 * head_bytes)
    fit in `budget` bytes: {layer: [heads]} (a pair that does not fit is skipped; a later one may, when
    its kv head is already in)."""
    chosen: dict[int, list[int]] = {}
    kv_in: set[tuple[int, int]] = set()
    used = 0
    for layer, h in order:
        cost = head_bytes + (0 if (layer, h // n_rep) in kv_in else 2 * head_bytes)
        if used + cost <= budget:
            used += cost
            kv_in.add((layer, h // n_rep))
            chosen.setdefault(layer, []).append(h)
    return chosen

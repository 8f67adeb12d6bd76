"""Preallocated key/value buffers for fast generation.

Without a cache, every new token recomputes k and v for the whole context: O(T) work per layer per
token for the projections, O(T^2) overall. With one, each token's k, v are computed once and written
at its position; a step only projects the new token. The buffers have a static shape
(B, n_kv_head, max_len, head_dim) and are written by index (`input_pos`), so the same graph serves
every step and `torch.compile` / CUDA graphs can capture it. GQA stores only the shared kv heads,
so the cache is n_head / n_kv_head times smaller than a multi-head one.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class KVCache(nn.Module):
    def __init__(self, batch_size: int, n_kv_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        shape = (batch_size, n_kv_head, max_len, head_dim)
        # not part of the model's state: never saved in checkpoints
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def max_len(self) -> int:
        return self.k_cache.shape[2]

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv_head, T, head_dim) at positions input_pos (T,); return the full buffers
        (B, n_kv_head, max_len, head_dim). Positions not yet written hold zeros, and the caller's mask
        hides them."""
        self.k_cache.index_copy_(2, input_pos, k.to(self.k_cache.dtype))
        self.v_cache.index_copy_(2, input_pos, v.to(self.v_cache.dtype))
        return self.k_cache, self.v_cache

    def reset(self) -> None:
        """Zero both buffers in place (they keep their identity, which compiled code guards on)."""
        self.k_cache.zero_()
        self.v_cache.zero_()

    def nbytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

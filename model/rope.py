"""Rotary position embeddings (RoPE, Su et al. 2021).

Channels are taken in pairs (2i, 2i+1) as one complex number, which is rotated by the angle
pos * theta^(-2i/head_dim): a complex multiply by exp(i * angle). Then q_m . k_n depends on the
positions only through m - n: attention sees relative distance for free. (The LLaMA reference layout;
one complex multiply on a contiguous (B, T, heads, head_dim) tensor is several times faster on a CPU
than the "rotate half" layout on the head-transposed tensor.)
"""
from __future__ import annotations

import torch


def rope_frequencies(head_dim: int, max_len: int, theta: float = 10000.0,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """exp(i * pos * theta^(-2j/head_dim)) for pos < max_len, j < head_dim/2: complex64 (max_len, head_dim // 2).
    Angles are computed in float64 so long contexts stay exact."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64, device=device), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, n_heads, head_dim) by freqs (T, head_dim // 2) complex: one rotation per position,
    shared by all heads. Computed in float32 whatever x's dtype, returned in x's dtype."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, n_heads, head_dim/2)
    rotated = pairs * freqs[:, None, :]  # broadcast over batch and heads
    return torch.view_as_real(rotated).flatten(-2).type_as(x)

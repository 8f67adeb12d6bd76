"""Rotary position embeddings (RoPE, Su et al. 2021).

Channels are taken in pairs (2i, 2i+1) as one complex number, which is rotated by the angle
pos * theta^(-2i/head_dim): a complex multiply by exp(i * angle). Then q_m . k_n depends on the
positions only through m - n: attention sees relative distance for free. (The LLaMA reference layout:
pairs of neighbouring channels, rather than the "rotate half" layout of Hugging Face's Llama.)

The table holds cos and sin as a real float32 tensor, (max_len, head_dim/2, 2). Eager code reads it as
complex numbers and rotates with one complex multiply on the contiguous (B, T, heads, head_dim) tensor
(several times faster on a CPU than the same rotation written as six real ops); compiled code does the
same arithmetic on real tensors, which the compiler fuses into one kernel (it does not generate code
for complex operators). Both give the same numbers (tests/test_model.py).
"""
from __future__ import annotations

import torch


def rope_frequencies(head_dim: int, max_len: int, theta: float = 10000.0,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """(cos, sin) of pos * theta^(-2j/head_dim) for pos < max_len, j < head_dim/2: float32 (max_len, head_dim // 2, 2).
    Angles are computed in float64 so long contexts stay exact."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64, device=device), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, n_heads, head_dim) by freqs (T, head_dim // 2, 2) = (cos, sin): one rotation per position,
    shared by all heads. Computed in float32 whatever x's dtype, returned in x's dtype."""
    rotate = rotate_real if torch.compiler.is_compiling() else rotate_complex
    return rotate(x.float().reshape(*x.shape[:-1], -1, 2), freqs).flatten(-2).type_as(x)


def rotate_complex(pairs: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """pairs (B, T, n_heads, head_dim/2, 2) float32 rotated as complex numbers by freqs (T, head_dim/2, 2)."""
    rotated = torch.view_as_complex(pairs) * torch.view_as_complex(freqs)[:, None, :]  # broadcast over B, heads
    return torch.view_as_real(rotated)


def rotate_real(pairs: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The same rotation as rotate_complex, in real arithmetic: (a + ib)(c + is) = (ac - bs) + i(as + bc)."""
    cos, sin = freqs[:, None, :, 0], freqs[:, None, :, 1]  # (T, 1, head_dim/2)
    real, imag = pairs[..., 0], pairs[..., 1]
    return torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)

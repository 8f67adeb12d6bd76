"""Rotary position embeddings (RoPE, Su et al. 2021).

Each pair of channels (i, i + head_dim/2) of q and k is rotated by the angle pos * theta^(-2i/head_dim).
Then q_m . k_n depends on positions only through m - n: attention sees relative distance for free.
"""
from __future__ import annotations

import torch


def rope_tables(head_dim: int, max_len: int, theta: float = 10000.0,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles for positions 0..max_len-1, each (max_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    positions = torch.arange(max_len, device=device, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)  # (max_len, head_dim/2); float64 so long contexts stay exact
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, n_heads, T, head_dim) by the angles of its T positions: cos, sin are (T, head_dim // 2).

    The "rotate half" layout: channel i pairs with channel i + head_dim/2 (GPT-NeoX, LLaMA in HF).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

"""The two normalisations a block can use before attention and the MLP."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean and the bias (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's nn.LayerNorm has no bias=False before 2.1)."""

    def __init__(self, dim: int, bias: bool = False, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def make_norm(kind: str, dim: int, bias: bool, eps: float | None = None) -> nn.Module:
    """eps None: the norm's own default (RMSNorm 1e-6, LayerNorm 1e-5)."""
    if kind == "rmsnorm":
        return RMSNorm(dim) if eps is None else RMSNorm(dim, eps=eps)
    return LayerNorm(dim, bias=bias) if eps is None else LayerNorm(dim, bias=bias, eps=eps)

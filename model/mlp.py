"""The position-wise feed-forward half of a block: GPT-2's GELU MLP or LLaMA's SwiGLU."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import ModelConfig


class GeluMLP(nn.Module):
    """d_model -> hidden -> GELU -> d_model."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.hidden_dim, bias=config.bias)
        self.fc_out = nn.Linear(config.hidden_dim, config.d_model, bias=config.bias)  # a residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(F.gelu(self.fc_in(x), approximate="tanh")))


class SwiGLU(nn.Module):
    """(SiLU(x W_gate) * x W_up) W_down (Shazeer 2020): a gated MLP, better per parameter than GELU."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # gate and up in one matmul: one kernel launch instead of two (small models are launch-bound)
        self.fc_in = nn.Linear(config.d_model, 2 * config.hidden_dim, bias=config.bias)
        self.fc_out = nn.Linear(config.hidden_dim, config.d_model, bias=config.bias)  # a residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc_in(x).chunk(2, dim=-1)
        return self.dropout(self.fc_out(F.silu(gate) * up))


def make_mlp(config: ModelConfig) -> nn.Module:
    return SwiGLU(config) if config.mlp == "swiglu" else GeluMLP(config)

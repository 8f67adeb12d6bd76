"""Optimizers and the learning-rate schedule.

AdamW decays only 2-D weights (matmuls and embeddings): decaying norm gains and biases pulls them to 0,
which hurts and buys nothing. `optimizer: muon` hands the 2-D weights inside the blocks to Muon
(orthogonalised momentum, torch.optim.Muon) and keeps AdamW for embeddings, the LM head, norms and
biases, which Muon is not meant for.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from training.config import TrainConfig


class Optimizers:
    """One or two torch optimizers stepped together, with a shared schedule and one state dict."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        for opt in optimizers:
            for group in opt.param_groups:
                group["peak_lr"] = group["lr"]

    def set_lr_factor(self, factor: float) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["peak_lr"] * factor

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> list[dict[str, Any]]:
        return [opt.state_dict() for opt in self.optimizers]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        """Load the optimizers' moments and step counts; the hyperparameters stay this run's (torch's
        load_state_dict would bring back the saved lr, betas and weight decay, so a setting changed for the
        resumed run would be silently ignored)."""
        if len(states) != len(self.optimizers):
            raise ValueError(f"optimizer state holds {len(states)} optimizers, this run uses {len(self.optimizers)}")
        for opt, state in zip(self.optimizers, states):
            settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            opt.load_state_dict(state)
            for group, ours in zip(opt.param_groups, settings):
                group.update(ours)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers for g in opt.param_groups]


def build_optimizers(model: nn.Module, cfg: TrainConfig) -> Optimizers:
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    if cfg.optimizer == "adamw":
        return Optimizers([adamw(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], cfg)])
    # Muon: 2-D weights inside the blocks (not the embedding tables or the LM head)
    hidden = [p for name, p in params.items() if p.dim() == 2 and name.startswith("blocks.")]
    hidden_ids = {id(p) for p in hidden}
    rest_decay = [p for p in decay if id(p) not in hidden_ids]
    muon = torch.optim.Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
    rest = adamw([{"params": rest_decay, "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}], cfg)
    return Optimizers([muon, rest])


def adamw(param_groups: list[dict[str, Any]], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with its fused kernel (one pass over all parameters; CUDA, and CPU since torch 2.4), else the
    multi-tensor (foreach) path. On a CPU a small model's step is bound by per-op overhead: for a 0.75M-parameter
    model (4 layers x 128, GQA 4/2, ModelConfig defaults otherwise) fused takes 0.9 ms, torch's default
    for-loop 3.8 ms and foreach 5.3 ms (`python benchmarks/optimizer_step.py`, benchmarks/RESULTS.md)."""
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    try:
        return torch.optim.AdamW(param_groups, fused=True, **kwargs)
    except RuntimeError:  # a device without the fused kernel (e.g. MPS before torch 2.5)
        return torch.optim.AdamW(param_groups, foreach=True, **kwargs)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak learning rate at `step` (0-based): linear warmup, then cosine to min_lr.

    Warmup starts at 1/warmup_iters of the peak, never at 0 (a step at lr 0 is a wasted step).
    """
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    min_factor = (cfg.min_lr if cfg.min_lr is not None else cfg.lr / 10) / cfg.lr
    if step < cfg.warmup_iters:
        return (step + 1) / cfg.warmup_iters
    if step >= decay_iters:
        return min_factor
    progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return min_factor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_factor)

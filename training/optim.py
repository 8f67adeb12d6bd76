"""Optimizers and the learning-rate schedule.

AdamW decays only 2-D weights (matmuls and embeddings): decaying norm gains and biases pulls them to 0,
which hurts and buys nothing. `optimizer: muon` hands the 2-D weights inside the blocks to Muon
(orthogonalised momentum, training/muon.py) and keeps AdamW for embeddings, the LM head, norms and
biases, which Muon is not meant for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from model.config import ModelConfig
from training.config import TrainConfig
from training.muon import Muon


class Optimizers:
    """One or two torch optimizers stepped together, with a shared schedule and one state dict."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], schedule: "Schedule"):
        self.optimizers, self.schedule = optimizers, schedule
        for opt in optimizers:
            for group in opt.param_groups:
                group["peak_lr"] = group["lr"]

    def set_step(self, step: int) -> None:
        """Every group's learning rate for `step` (0-based): its peak times the schedule's factor."""
        factor = self.schedule.factor(step)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["peak_lr"] * factor

    def set_compute_dtype(self, autocast_dtype: torch.dtype | None) -> None:
        """Muon's Newton-Schulz iteration runs in the run's compute dtype: bfloat16 where the run autocasts to
        it (chosen by measurement under `dtype: auto`), else float32 (float16 lacks the range)."""
        for opt in self.optimizers:
            if isinstance(opt, Muon):
                opt.set_ns_dtype(torch.bfloat16 if autocast_dtype == torch.bfloat16 else torch.float32)

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


def fused_row_splits(name: str, config: ModelConfig) -> tuple[int, ...] | None:
    """Row counts of the matrices fused into parameter `name` (q|k|v in the attention's input projection,
    gate|up in SwiGLU's), or None for a matrix of one piece."""
    if name.endswith("attn.qkv_proj.weight"):
        return (config.n_head * config.head_dim, config.n_kv_head * config.head_dim,
                config.n_kv_head * config.head_dim)
    if name.endswith("mlp.fc_in.weight") and config.mlp == "swiglu":
        return (config.hidden_dim, config.hidden_dim)
    return None


EMBEDDING_TABLES = ("tok_emb.", "pos_emb.")  # the parameters train.embedding_lr sets (a tied LM head is tok_emb)


def build_optimizers(model: nn.Module, cfg: TrainConfig) -> Optimizers:
    """AdamW alone, or Muon on the blocks' 2-D weights and AdamW on the rest. AdamW's groups, in this order:
    the embedding tables (at train.embedding_lr), the other 2-D weights (the LM head; every matrix without
    Muon), both with weight decay, then norms and biases without it. Empty groups are left out."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    embeddings = [p for name, p in params.items() if name.startswith(EMBEDDING_TABLES)]
    decay = [p for name, p in params.items() if p.dim() >= 2 and not name.startswith(EMBEDDING_TABLES)]
    no_decay = [p for p in params.values() if p.dim() < 2]
    schedule = Schedule.of(cfg)
    if cfg.optimizer == "adamw":
        return Optimizers([adamw(embeddings, decay, no_decay, cfg)], schedule)
    # Muon: 2-D weights inside the blocks (not the embedding tables or the LM head), grouped by how their rows
    # split into fused parts
    model_config: ModelConfig = model.config
    by_splits: dict[tuple[int, ...] | None, list[nn.Parameter]] = {}
    for name, p in params.items():
        if p.dim() == 2 and name.startswith("blocks."):
            by_splits.setdefault(fused_row_splits(name, model_config), []).append(p)
    hidden_ids = {id(p) for group in by_splits.values() for p in group}
    rest_decay = [p for p in decay if id(p) not in hidden_ids]
    muon = Muon([{"params": group, "splits": splits} for splits, group in by_splits.items()], lr=cfg.muon_lr,
                momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
    return Optimizers([muon, adamw(embeddings, rest_decay, no_decay, cfg)], schedule)


def adamw(embeddings: list[nn.Parameter], decay: list[nn.Parameter], no_decay: list[nn.Parameter],
          cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the embedding tables (at cfg.embedding_lr, default cfg.lr), the other weights with decay and
    those without (build_optimizers), with its fused kernel (one pass over all parameters; CUDA, and CPU since
    torch 2.4), else the multi-tensor (foreach) path. On a CPU a small model's step is bound by per-op
    overhead: for a 0.75M-parameter model (4 layers x 128, GQA 4/2, ModelConfig defaults otherwise) fused
    takes 0.9 ms, torch's default for-loop 3.8 ms and foreach 5.3 ms (`python benchmarks/optimizer_step.py`, benchmarks/RESULTS.md)."""
    groups = [{"params": embeddings, "weight_decay": cfg.weight_decay, "lr": cfg.embedding_lr or cfg.lr},
              {"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    param_groups = [group for group in groups if group["params"]]
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    try:
        return torch.optim.AdamW(param_groups, fused=True, **kwargs)
    except RuntimeError:  # a device without the fused kernel (e.g. MPS before torch 2.5)
        return torch.optim.AdamW(param_groups, foreach=True, **kwargs)


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule as a multiplier of the peak rate, settled once from the `train:` section
    (`of`): linear warmup, then `kind` down to min_factor at decay_iters (default max_iters), min_factor after.

    cosine: half a cosine from the warmup's end to decay_iters. wsd: the peak held until cooldown_start, the last
    cooldown_frac of the steps before decay_iters, then a straight line down (the cooldown, never shorter than one
    step, and never starting inside the warmup).
    Warmup starts at 1/warmup_iters of the peak, never at 0 (a step at lr 0 is a wasted step)."""

    kind: str  # "cosine" | "wsd"
    warmup_iters: int
    decay_iters: int
    min_factor: float  # min_lr / lr
    cooldown_start: int  # wsd only

    @classmethod
    def of(cls, cfg: TrainConfig) -> "Schedule":
        decay_iters = cfg.lr_decay_iters or cfg.max_iters
        min_factor = (cfg.min_lr if cfg.min_lr is not None else cfg.lr / 10) / cfg.lr
        cooldown_start = max(cfg.warmup_iters, decay_iters - max(1, round(cfg.cooldown_frac * decay_iters)))
        return cls(cfg.lr_schedule, cfg.warmup_iters, decay_iters, min_factor, cooldown_start)

    def factor(self, step: int) -> float:
        """Multiplier of the peak learning rate at `step` (0-based)."""
        if step < self.warmup_iters:
            return (step + 1) / self.warmup_iters
        if step >= self.decay_iters:
            return self.min_factor
        if self.kind == "wsd":
            if step < self.cooldown_start:
                return 1.0
            progress = (step - self.cooldown_start) / max(1, self.decay_iters - self.cooldown_start)
            return 1.0 - progress * (1.0 - self.min_factor)
        progress = (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        return self.min_factor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - self.min_factor)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """The schedule's multiplier of the peak learning rate at `step` (0-based) for the `train:` section `cfg`."""
    return Schedule.of(cfg).factor(step)

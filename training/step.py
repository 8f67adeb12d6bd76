"""One optimizer step's worth of work, shared by the training loop and benchmarks/train_throughput.py.

Split in two so the loop can look at the loss and gradient norm (non-finite check) before the
weights change: `accumulate_gradients` (forward + backward over the micro-batches, then clipping) and
`apply_gradients` (the optimizer step).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from training.config import TrainConfig
from training.optim import Optimizers
from training.runtime import Runtime


def accumulate_gradients(model: nn.Module, params_model: nn.Module, next_batch: Callable[[], tuple],
                         rt: Runtime, tc: TrainConfig, scaler: torch.amp.GradScaler | None = None,
                         optimizers: Optimizers | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Average gradients over tc.grad_accum micro-batches, clip their global norm to tc.grad_clip (0 = no
    clipping).

    model: what runs forward (maybe compiled and/or DDP-wrapped); params_model: the plain module whose
    parameters are clipped. Returns (mean loss, gradient norm before clipping), 0-d tensors.
    Under DDP, gradients are only all-reduced on the last micro-batch (no_sync before)."""
    grad_accum = tc.grad_accum
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(grad_accum):
        x, y = next_batch()
        # DDP all-reduces on the last micro-batch only; FSDP (no no_sync) reduce-scatters after every one, so
        # gradients accumulate sharded and in fp32 (training/parallel.py)
        with model.no_sync() if rt.ddp and micro < grad_accum - 1 and hasattr(model, "no_sync") else nullcontext():
            with rt.autocast():
                _, loss = model(x, y)
            loss = loss / grad_accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
        loss_sum += loss.detach()
    if scaler is not None:
        for opt in optimizers.optimizers:
            scaler.unscale_(opt)  # clip the true gradients, not the scaled ones
    grad_norm = torch.nn.utils.clip_grad_norm_(params_model.parameters(), tc.grad_clip or math.inf)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor norm over the shards; the whole value, on every rank
        grad_norm = grad_norm.full_tensor()
    return loss_sum, grad_norm


def apply_gradients(optimizers: Optimizers, scaler: torch.amp.GradScaler | None = None) -> None:
    if scaler is not None:
        for opt in optimizers.optimizers:
            scaler.step(opt)
        scaler.update()
    else:
        optimizers.step()
    optimizers.zero_grad()

"""Muon: SGD momentum whose update is orthogonalised, for the 2-D weights inside the transformer blocks.

Each step keeps a momentum buffer per matrix (Nesterov by default), replaces the update G = U S V^T by
roughly U V^T (every direction moved by the same amount, whatever its gradient scale), and applies it at
lr * sqrt(max(1, rows / cols)). Orthogonalising exactly would need an SVD; a quintic Newton-Schulz
iteration of 5 matmul steps gets singular values into about [0.7, 1.2] instead of exactly 1, which trains
as well. Embeddings, the LM head, norms and biases stay with AdamW (training/optim.py).

Written here rather than taken from torch.optim.Muon (torch >= 2.9), which runs the iteration in bfloat16
always: on a CPU without bf16 instructions, whose bf16 matmuls run at ~1% of float32's speed, that turned
a 0.36 s training step of small.yaml into 1.07 s. Here the iteration runs in `ns_dtype`: the run's compute dtype, which `dtype: auto`
measures (float32, or bfloat16 where it is faster).

Fused matrices are orthogonalised part by part: the attention's q/k/v projection is one Linear, SwiGLU's
gate and up projections another, but each part is a map of its own, and orthogonalising the stack would
couple their scales. A parameter group's `splits` gives the row counts of the parts.

Under FSDP2 a parameter is a DTensor sharded by rows: the update is gathered whole, orthogonalised the
same way on every process, and each process keeps its own rows (no further communication).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

# (a, b, c) of x <- a x + b (x x^T) x + c (x x^T)^2 x: chosen for the steepest slope at 0, so small singular
# values grow fast, at the price of not converging exactly to 1 (Keller Jordan's Muon)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(update: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32,
                  eps: float = 1e-7) -> torch.Tensor:
    """About U V^T of each matrix U S V^T in `update` (rows, cols) or a stack of them (n, rows, cols), by
    `steps` quintic Newton-Schulz iterations in `dtype`; returned in update's dtype. Singular values end in
    roughly [0.7, 1.2] (not exactly 1, by design)."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(dtype).reshape(-1, *update.shape[-2:])  # (n, rows, cols)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # iterate on the wide orientation: the Gram matrix is then the smaller one
    # Frobenius norm >= spectral norm: every singular value now <= 1
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT  # (n, short, short)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b gram + c gram^2, one fused kernel
        x = torch.baddbmm(x, poly, x, beta=a)  # a x + poly x (1.4x faster here than the same in separate ops)
    return (x.mT if tall else x).reshape(update.shape).to(update.dtype)


def orthogonalize_parts(updates: Sequence[torch.Tensor], splits: Sequence[Sequence[int] | None], steps: int,
                        dtype: torch.dtype) -> list[torch.Tensor]:
    """orthogonalize() of each block of rows of each update (splits[i]: the row counts of updates[i], None: the
    whole matrix), each block scaled by sqrt(max(1, rows / cols)) of its own shape. Blocks of one shape are
    stacked and iterated together, one batched matmul instead of one per matrix (fewer kernel launches; on a
    2-core CPU as fast as one at a time for small.yaml's matrices: benchmarks/muon_step.py)."""
    parts = [list(u.split(list(s))) if s else [u] for u, s in zip(updates, splits)]
    by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}  # shape -> [(update index, part index)]
    for i, blocks in enumerate(parts):
        for j, block in enumerate(blocks):
            by_shape.setdefault(tuple(block.shape), []).append((i, j))
    for (rows, cols), where in by_shape.items():
        stacked = orthogonalize(torch.stack([parts[i][j] for i, j in where]), steps, dtype)
        stacked = stacked * math.sqrt(max(1.0, rows / cols))
        for (i, j), block in zip(where, stacked.unbind()):
            parts[i][j] = block
    return [torch.cat(blocks) if len(blocks) > 1 else blocks[0] for blocks in parts]


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters (module doc). Group options: lr, momentum, weight_decay (decoupled, at lr),
    nesterov, ns_steps, ns_dtype, splits (row counts of fused parts, summing to the rows; None: one part).
    State per parameter: momentum_buffer, the parameter's shape and dtype."""

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 nesterov: bool = True, ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, ns_steps=ns_steps,
                        ns_dtype=ns_dtype, splits=None)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes 2-D weights only, got a parameter of shape {tuple(p.shape)}")
                if group["splits"] is not None and sum(group["splits"]) != p.size(0):
                    raise ValueError(f"splits {group['splits']} do not add up to the {p.size(0)} rows of a "
                                     f"parameter of shape {tuple(p.shape)}")

    def set_ns_dtype(self, dtype: torch.dtype) -> None:
        """Run the Newton-Schulz iteration in `dtype` from now on (the run's compute dtype, once chosen)."""
        for group in self.param_groups:
            group["ns_dtype"] = dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("Muon.step takes no closure")
        # groups of one ns_steps and ns_dtype are orthogonalised together (every group, in a run)
        by_setting: dict[tuple[int, torch.dtype], list[tuple[dict[str, Any], torch.nn.Parameter, torch.Tensor]]] = {}
        for group in self.param_groups:
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - momentum)  # buf <- momentum * buf + (1 - momentum) * grad
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                by_setting.setdefault((group["ns_steps"], group["ns_dtype"]), []).append((group, p, update))
        for (steps, dtype), items in by_setting.items():
            updates = _orthogonalize_params([u for _, _, u in items], [g["splits"] for g, _, _ in items], steps, dtype)
            for (group, p, _), update in zip(items, updates):
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])


def _orthogonalize_params(updates: list[torch.Tensor], splits: list[Sequence[int] | None], steps: int,
                          dtype: torch.dtype) -> list[torch.Tensor]:
    """orthogonalize_parts of plain tensors, or of row-sharded DTensors gathered whole (module doc)."""
    if not updates or type(updates[0]).__name__ != "DTensor":
        return orthogonalize_parts(updates, splits, steps, dtype)
    from torch.distributed.tensor import distribute_tensor
    wholes = orthogonalize_parts([u.full_tensor() for u in updates], splits, steps, dtype)
    # every process computed the same matrices: each takes its own shard of them, no data sent (src_data_rank=None)
    return [distribute_tensor(w, u.device_mesh, u.placements, src_data_rank=None) for w, u in zip(wholes, updates)]

"""The baseline speed ratios are taken against: nanoGPT's model and optimizer as nanoGPT runs them on a CPU.

Written here from nanoGPT's published design (model.py and train.py of karpathy/nanoGPT), independent of
attngpt's model/, so that "Nx nanoGPT" compares against the recipe people actually run:
  - GPT-2 architecture: learned absolute positions, pre-norm blocks, LayerNorm without bias (`bias=False`, what
    its shakespeare-char config trains), GELU MLP 4x wide (nn.GELU(), the exact erf form), tied embeddings;
  - attention: q, k, v from one Linear (`c_attn`), then the fused F.scaled_dot_product_attention(is_causal=True);
  - init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layer));
  - loss: logits at every position, F.cross_entropy(ignore_index=-1);
  - AdamW with weight decay on >= 2-D weights only, `fused=True` only on CUDA: on a CPU, PyTorch's default
    for CPU tensors (the per-parameter loop); fp32; eager (its CPU command line passes --compile=False);
  - a step: loss.backward(), clip_grad_norm_(1.0), optimizer.step(), zero_grad(set_to_none=True);
  - learning rate: linear warmup then cosine decay to min_lr (its get_lr).
On a GPU nanoGPT's train.py runs the same step differently (its defaults): the forward under bfloat16 autocast,
torch.compile, fused AdamW; `train_step(autocast=torch.bfloat16)` on a compiled model is that step.
`NANOGPT_CPU` and `CPU_RECIPE` are the shape and recipe of nanoGPT's README command for a CPU.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class NanoShape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    batch_size: int
    vocab_size: int = 65  # tinyshakespeare's characters


NANOGPT_CPU = NanoShape(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)

# nanoGPT's CPU recipe (README): config/train_shakespeare_char.py's settings with --device=cpu --compile=False
# --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0
CPU_RECIPE = dict(lr=1e-3, min_lr=1e-4, warmup_iters=100, beta1=0.9, beta2=0.99, weight_decay=0.1, grad_clip=1.0,
                  eval_interval=250, eval_iters=20)


class NanoAttention(nn.Module):
    def __init__(self, s: NanoShape):
        super().__init__()
        self.n_head = s.n_head
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class NanoBlock(nn.Module):
    def __init__(self, s: NanoShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.n_embd, bias=False)
        self.attn = NanoAttention(s)
        self.ln_2 = nn.LayerNorm(s.n_embd, bias=False)
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, s: NanoShape):
        super().__init__()
        self.shape = s
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.h = nn.ModuleList(NanoBlock(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd, bias=False)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * s.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizer(self, lr: float = 1e-3, weight_decay: float = 0.1, betas=(0.9, 0.99)) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = next(self.parameters()).device.type == "cuda"
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **({"fused": True} if fused else {}))


def nanogpt_lr(step: int, max_iters: int, lr: float, min_lr: float, warmup_iters: int) -> float:
    """nanoGPT's get_lr: linear warmup from lr/warmup_iters, cosine down to min_lr at max_iters."""
    if step < warmup_iters:
        return lr * (step + 1) / (warmup_iters + 1)
    if step > max_iters:
        return min_lr
    ratio = (step - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def train_step(model: NanoGPT, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               grad_clip: float = 1.0, autocast: torch.dtype | None = None) -> tuple[float, float]:
    """One nanoGPT training step; returns (loss, grad norm) as floats (its CPU recipe logs every step).
    autocast: the forward under torch.autocast in that dtype, the backward outside it (nanoGPT's `ctx` on a GPU)."""
    with torch.autocast(x.device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext():
        _, loss = model(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), norm.item()

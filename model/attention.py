"""Causal self-attention, written out: softmax(Q K^T / sqrt(d_k)) V.

`scaled_dot_product_attention` is the formula of the seed texts, step by step, and returns the
attention weights it computed: the maps this project draws. `CausalSelfAttention` wraps it in the
projections of a transformer layer, with grouped-query attention (GQA): `n_head` query heads share
`n_kv_head` key/value heads (MQA at 1, plain multi-head attention at `n_head`).

A fused path (`attn_impl="sdpa"`, PyTorch's F.scaled_dot_product_attention) serves speed; it must
equal the from-scratch path (tests/test_attention.py), and whenever weights are asked for, the
from-scratch path runs instead, since the fused kernels never materialise them.
"""
from __future__ import annotations

import math
from contextlib import nullcontext as _no_context
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.device import torch_version
from model.config import ModelConfig
from model.rope import apply_rope


# F.scaled_dot_product_attention takes enable_gqa from PyTorch 2.5 on; with 2.4 k, v are repeated instead
SDPA_HAS_GQA = torch_version() >= (2, 5)


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool (t_q, t_k), True where query i may look at key j.

    Aligned bottom-right: the queries are the *last* t_q positions of the t_k keys, so query i sits
    at absolute position t_k - t_q + i and sees keys j <= t_k - t_q + i. With t_q == t_k this is the
    usual lower triangle; with t_q < t_k (decoding against a cache) the new tokens see all the past.
    (PyTorch's SDPA `is_causal=True` aligns top-left instead when t_q != t_k: pytorch issue 108108.)
    """
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def stable_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the last dim, shifted by the row max so exp() never overflows.

    exp(s - max) / sum(exp(s - max)) equals exp(s) / sum(exp(s)) exactly in real arithmetic, but its
    exponents are all <= 0, so scores of 800 (exp(800) = inf in float64) still give finite weights.
    A row whose every entry is masked (-inf) gets all-zero weights instead of NaN.
    """
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)  # masked entries: exp(-inf) = 0 exactly
    total = exp.sum(dim=-1, keepdim=True)
    return exp / total.clamp_min(torch.finfo(exp.dtype).tiny)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention from scratch. Returns (output, weights).

    q: (..., T_q, d_k)   k: (..., T_k, d_k)   v: (..., T_k, d_v)   (leading dims broadcast)
    mask: bool, True = may attend (as in F.scaled_dot_product_attention), broadcastable to
          (..., T_q, T_k); or a float mask added to the scores.
    causal: hide future keys, aligned bottom-right (see `causal_mask`).
    dropout_p: dropout on the weights used for mixing (the returned weights are before dropout).

    output: (..., T_q, d_v)   weights: (..., T_q, T_k), each row sums to 1, masked entries exactly 0.
    The softmax runs in at least float32, also under bf16 autocast: its weights are what we inspect.
    """
    d_k = q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d_k)  # (..., T_q, T_k): how much each query matches each key
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if causal:
        t_q, t_k = scores.shape[-2], scores.shape[-1]
        scores = scores.masked_fill(~causal_mask(t_q, t_k, scores.device), float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = stable_softmax(scores)  # (..., T_q, T_k)
    mixing = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = mixing.to(v.dtype) @ v  # (..., T_q, d_v): each query's weighted average of the values
    return out, weights


@dataclass
class AttentionInternals:
    """What one attention layer computed over a sequence (GPT.attention_internals): enough to redo its
    arithmetic by hand. Query head h reads kv head h // (n_head // n_kv_head), and writes into the
    residual stream through W_O^h = out_weight[:, h * head_dim:(h + 1) * head_dim]."""
    q: torch.Tensor  # (B, n_head, T, head_dim), RoPE applied as the model applies it
    k: torch.Tensor  # (B, n_kv_head, T, head_dim), RoPE applied
    v: torch.Tensor  # (B, n_kv_head, T, head_dim)
    weights: torch.Tensor  # (B, n_head, T, T) float32: softmax(q k^T / sqrt(head_dim)), future masked to -inf
    out_weight: torch.Tensor  # (d_model, n_head * head_dim): out_proj.weight, y = concat_h(out_h) @ out_weight.T
    out_bias: torch.Tensor | None  # (d_model,): out_proj.bias (added once per query, not per key), or None


@dataclass
class HeadPatch:
    """Chosen heads' outputs replaced before out_proj mixes them: head h's output for batch row b is
    out[b, h] (T, head_dim), what W_O^h = out_proj.weight[:, h * head_dim:(h + 1) * head_dim] reads.

    Batch rows may patch different heads (keep has one row per batch row), so one forward pass can try
    several interventions side by side; a single row (1, n_head) applies to every batch row."""
    keep: torch.Tensor  # bool (B or 1, n_head): False = this head's output is replaced in this batch row
    values: torch.Tensor | None = None  # broadcastable to (B, n_head, T, head_dim), e.g. (1, n_head, 1, head_dim)
    #                                     a mean over positions; None = zeros

    def apply(self, out: torch.Tensor) -> torch.Tensor:
        """out (B, n_head, T, head_dim) -> the same with the replaced heads' outputs swapped in."""
        keep = self.keep.to(out.device)[:, :, None, None]  # (B or 1, n_head, 1, 1)
        if self.values is None:
            return out * keep.to(out.dtype)
        return torch.where(keep, out, self.values.to(device=out.device, dtype=out.dtype))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, n_kv_head, T, head_dim) -> (B, n_kv_head * n_rep, T, head_dim), each kv head repeated n_rep times
    in a row, so query head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, n_kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, n_kv, n_rep, t, d).reshape(b, n_kv * n_rep, t, d)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                    dropout_p: float = 0.0, float32: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention over q (B, n_head, T, head_dim) and the shared k, v (B, n_kv_head, T_k,
    head_dim): under the bool mask (T, T_k) if given, causal (the kernel's own, top-left aligned) if `causal`,
    else over every key (a decoded token's query against its written prefix). Returns (B, n_head, T,
    head_dim) in q's dtype.

    float32: run the kernel on float32 copies with autocast off, where q comes in a lower precision. CPU flash
    attention's bfloat16 backward is slower than its float32 one at small head sizes (head_dim 32, GQA 4/2:
    small.yaml's training step 1.20x faster with the upcast, benchmarks/RESULTS.md); the result is the float32
    kernel's, rounded once to q's dtype."""
    dtype, n_rep = q.dtype, q.size(1) // k.size(1)
    upcast = float32 and dtype != torch.float32
    with torch.autocast(q.device.type, enabled=False) if upcast else _no_context():
        if upcast:
            q, k, v = q.float(), k.float(), v.float()
        if n_rep > 1 and SDPA_HAS_GQA:
            # the kernel reads each shared kv head for its group of query heads: no expanded copy of k, v
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                 dropout_p=dropout_p, enable_gqa=True)  # (B, n_head, T, head_dim)
        else:
            out = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask,
                                                 is_causal=causal, dropout_p=dropout_p)
    return out.to(dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with grouped-query key/value heads and optional RoPE."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        self.attn_impl = config.attn_impl
        self.dropout_p = config.dropout
        # q, k and v in one matmul (one kernel launch); the k and v parts have only n_kv_head heads
        self.qkv_proj = nn.Linear(config.d_model, (config.n_head + 2 * config.n_kv_head) * config.head_dim,
                                  bias=config.bias)
        self.out_proj = nn.Linear(config.n_head * config.head_dim, config.d_model, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.kv_cache = None  # a model.kv_cache.KVCache while generating with a cache
        self.head_patch: HeadPatch | None = None  # heads whose outputs are replaced (module doc); None = none
        # the fused kernel on float32 copies of q, k, v under a lower-precision autocast (fused_attention); set
        # by `dtype: auto` where it measured faster (training/autotune.py), never part of the model's config
        self.fused_float32 = False

    def project_qkv(self, x: torch.Tensor, rope: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> q (B, n_head, T, head_dim), k and v (B, n_kv_head, T, head_dim): what the
        attention compares and mixes, with RoPE (complex (T, head_dim/2), or None) applied to q and k.
        forward uses it, and so does GPT.attention_internals: what is inspected is what runs."""
        B, T, _ = x.shape
        n_qk = self.n_head + self.n_kv_head
        qkv = self.qkv_proj(x).view(B, T, n_qk + self.n_kv_head, self.head_dim)  # (B, T, heads of q|k|v, head_dim)
        qk, v = qkv[:, :, :n_qk], qkv[:, :, n_qk:]
        if rope is not None:
            qk = apply_rope(qk, rope)  # q and k rotated in one go
        q = qk[:, :, :self.n_head].transpose(1, 2)  # (B, n_head, T, head_dim)
        k = qk[:, :, self.n_head:].transpose(1, 2)  # (B, n_kv_head, T, head_dim)
        return q, k, v.transpose(1, 2)  # v: (B, n_kv_head, T, head_dim)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, d_model). rope: (T, head_dim/2, 2) cos/sin rotations for the positions of x (model/rope.py).
        mask: None for plain causal attention over x itself; with a KV cache, bool (T, T_k) rows of the
        causal table at `input_pos`, the absolute positions of x's tokens, where k/v are written, cut to the
        T_k slots attended over: the written prefix max(input_pos) + 1, or the whole buffer (GPT._hidden).
        Returns (y (B, T, d_model), weights (B, n_head, T, T_k) if need_weights else None)."""
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x, rope)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)  # (B, n_kv_head, max_len, head_dim)
            if mask is not None:  # attend only over the slots the mask covers (T, T_k): the written prefix
                k, v = k[:, :, :mask.shape[-1]], v[:, :, :mask.shape[-1]]
            # a cache kept in another dtype than the model computes in (e.g. bf16 to halve its memory) is read
            # back in q's dtype; free when they match
            k, v = k.to(q.dtype), v.to(q.dtype)
        dropout_p = self.dropout_p if self.training else 0.0
        n_rep = self.n_head // self.n_kv_head

        weights = None
        if need_weights or self.attn_impl == "manual":
            # Group the query heads by the kv head they share: (B, n_kv_head, n_rep, T, head_dim);
            # k and v broadcast over the group axis, so shared heads are never copied.
            q_grouped = q.view(B, self.n_kv_head, n_rep, T, self.head_dim)
            out, weights = scaled_dot_product_attention(
                q_grouped, k.unsqueeze(2), v.unsqueeze(2), mask=mask, causal=mask is None, dropout_p=dropout_p)
            out = out.view(B, self.n_head, T, self.head_dim)
            weights = weights.view(B, self.n_head, T, -1) if need_weights else None
        else:
            # Eager decoding of one token: its query sits at the newest written position and the mask row is
            # the written prefix, all True (GPT._hidden cuts it there), so the fused kernel needs no mask;
            # applying one costs ~5% of an eager CPU decode step (benchmarks/RESULTS.md). Compiled code keeps
            # the row, which on CUDA is a whole-buffer row with unwritten slots to hide.
            sdpa_mask = None if T == 1 and mask is not None and not torch.compiler.is_compiling() else mask
            out = fused_attention(q, k, v, sdpa_mask, causal=mask is None, dropout_p=dropout_p,
                                  float32=self.fused_float32)

        if self.head_patch is not None:
            out = self.head_patch.apply(out)  # (B, n_head, T, head_dim)
        y = out.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # heads side by side again
        return self.resid_dropout(self.out_proj(y)), weights

"""attngpt's network, top to bottom: a decoder-only transformer on a from-scratch causal attention block.

    tokens (B, T) -> token embedding (+ learned positions) -> n_layer pre-norm blocks -> final norm -> LM head
           -> logits (B, T, vocab_size)
    each block: x = x + attention(norm(x)); x = x + mlp(norm(x))

Read in this order (each section builds on the ones above it):
    1. the attention formula from scratch, softmax(Q K^T / sqrt(d_k)) V, returning the weights this project draws
    2. the fast paths, the same numbers without the weights: PyTorch's fused kernel
       (F.scaled_dot_product_attention), and for training where it times faster the formula as chunked batched
       matmuls (both proven equal to section 1 by tests/model/test_gpt_attention.py; whenever weights are asked for,
       the from-scratch path runs instead)
    3. RoPE, rotary position embeddings
    4. the KV cache
    5. CausalSelfAttention: the q|k|v projections around the formula, grouped-query attention (GQA): n_head
       query heads share n_kv_head key/value heads (MQA at 1, plain multi-head attention at n_head)
    6. norms and MLPs
    7. Block and GPT: the forward pass, the loss, the KV cache's setup
    8. insight hooks: what insight/ reads and changes (the residual stream, attention internals, head patches);
       the forward pass does not need them

The shapes and choices come from model/config.py (ModelConfig); generation lives in model/generate.py.
Nothing here reads or writes a file: checkpoints and Hugging Face folders are pretrained/'s.
"""
from __future__ import annotations

import math
from contextlib import nullcontext as _no_context
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.device import torch_version
from common.errors import UserError
from model.config import ModelConfig
from model.packed import PackedLinear, weight_key


# --------------------------------------------------------------------------------------------------------------------
# 1. Attention from scratch: softmax(Q K^T / sqrt(d_k)) V, the formula of the seed texts, step by step
# --------------------------------------------------------------------------------------------------------------------

def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool (t_q, t_k), True where query i may look at key j.

    Aligned bottom-right: the queries are the *last* t_q positions of the t_k keys, so query i sits
    at absolute position t_k - t_q + i and sees keys j <= t_k - t_q + i. With t_q == t_k this is the
    usual lower triangle; with t_q < t_k (decoding against a cache) the new tokens see all the past.
    (PyTorch's SDPA `is_causal=True` aligns top-left instead when t_q != t_k: pytorch issue 108108.)"""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def stable_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the last dim, shifted by the row max so exp() never overflows.

    exp(s - max) / sum(exp(s - max)) equals exp(s) / sum(exp(s)) exactly in real arithmetic, but its
    exponents are all <= 0, so scores of 800 (exp(800) = inf in float64) still give finite weights.
    A row whose every entry is masked (-inf) gets all-zero weights instead of NaN."""
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)  # masked entries: exp(-inf) = 0 exactly
    total = exp.sum(dim=-1, keepdim=True)
    return exp / total.clamp_min(torch.finfo(exp.dtype).tiny)


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 causal: bool = False, dropout_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention from scratch. Returns (output, weights).

    q: (..., T_q, d_k)   k: (..., T_k, d_k)   v: (..., T_k, d_v)   (leading dims broadcast)
    mask: bool, True = may attend (as in F.scaled_dot_product_attention), broadcastable to
          (..., T_q, T_k); or a float mask added to the scores.
    causal: hide future keys, aligned bottom-right (see `causal_mask`).
    dropout_p: dropout on the weights used for mixing (the returned weights are before dropout).

    output: (..., T_q, d_v)   weights: (..., T_q, T_k), each row sums to 1, masked entries exactly 0.
    The softmax runs in at least float32, also under bf16 autocast: its weights are what we inspect."""
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

# --------------------------------------------------------------------------------------------------------------------
# 2. The fast paths: PyTorch's fused kernel, and the formula as chunked batched matmuls (neither returns weights)
# --------------------------------------------------------------------------------------------------------------------

# F.scaled_dot_product_attention takes enable_gqa from PyTorch 2.5 on; with 2.4 k, v are repeated instead
SDPA_HAS_GQA = torch_version() >= (2, 5)


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
    upcast = float32 and torch.finfo(dtype).bits < 32  # float64 stays float64
    # autocast turned off only where it is on: entering the context costs a few microseconds, twelve times a token
    with torch.autocast(q.device.type, enabled=False) if upcast and torch.is_autocast_enabled(q.device.type) \
            else _no_context():
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


MATMUL_CHUNK = 128  # query rows per chunk of matmul_attention: fewer, larger matmuls against less masked work

# The fast paths an attention layer can take for plain causal attention over its input (attn_impl sdpa), by name:
#   "fused": F.scaled_dot_product_attention on q, k, v as autocast gives them;
#   "fused float32": the same kernel on float32 copies (fused_attention's float32);
#   "matmul": matmul_attention, in the autocast's dtype.
ATTENTION_KERNELS = ("fused", "fused float32", "matmul")


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                     chunk: int = MATMUL_CHUNK) -> torch.Tensor:
    """Causal self-attention of q (B, n_head, T, head_dim) over k, v (B, n_kv_head, T, head_dim) as batched
    matmuls: softmax(Q K^T / sqrt(d_k) + causal bias) V, section 1's formula without keeping the weights.
    Returns (B, n_head, T, head_dim) in the matmuls' dtype (under autocast, the autocast's).

    Why it exists: at small head sizes CPU flash attention runs far below the machine's matmul rate (head_dim
    32, T 256: its forward and backward took 2.4-2.7x as long as this in bfloat16, 1.8x on float32 copies,
    benchmarks/RESULTS.md), and batched bfloat16 matmuls win even though they write the scores out. Two things
    keep them cheap:
      - the n_rep query heads that share a kv head are stacked along T, (B * n_kv_head, n_rep * rows,
        head_dim), so each shared k, v is read by one matmul and never repeated (GQA and MQA as they are);
      - the queries go in chunks of `chunk` rows and a chunk is scored only against the keys up to its last
        row: the blocks above the diagonal, masked anyway, are never computed (~a quarter of the work at T 256).
    The mask enters as an additive bias (0 or -inf) inside the first matmul (baddbmm), and `dropout_p` drops
    weights as section 1 does (training only: the caller passes 0.0 in eval)."""
    B, n_head, T, head_dim = q.shape
    n_kv = k.size(1)
    n_rep = n_head // n_kv
    k = k.reshape(B * n_kv, T, head_dim)
    v = v.reshape(B * n_kv, T, head_dim)
    q = q.reshape(B, n_kv, n_rep, T, head_dim)  # query head h = kv head h // n_rep, as repeat_kv reads it
    outs = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)  # queries start..end-1 see keys 0..end-1 at most
        # query row r (position start + r) sees key j <= start + r: -inf strictly above that diagonal
        bias = torch.full((end - start, end), float("-inf"), dtype=q.dtype, device=q.device).triu_(start + 1)
        q_rows = q[:, :, :, start:end].reshape(B * n_kv, n_rep * (end - start), head_dim)
        scores = torch.baddbmm(bias.repeat(n_rep, 1), q_rows, k[:, :end].transpose(1, 2),
                               alpha=1.0 / math.sqrt(head_dim))  # (B * n_kv, n_rep * rows, end)
        weights = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = torch.bmm(weights, v[:, :end])  # (B * n_kv, n_rep * rows, head_dim)
        outs.append(out.view(B, n_head, end - start, head_dim))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]

# --------------------------------------------------------------------------------------------------------------------
# 3. Rotary position embeddings (RoPE, Su et al. 2021)
# Channels are taken in pairs (2i, 2i+1) as one complex number, which is rotated by the angle
# pos * theta^(-2i/head_dim): a complex multiply by exp(i * angle). Then q_m . k_n depends on the
# positions only through m - n: attention sees relative distance for free. (The LLaMA reference layout:
# pairs of neighbouring channels, rather than the "rotate half" layout of Hugging Face's Llama.)
#
# The table holds cos and sin as a real float32 tensor, (max_len, head_dim/2, 2). Eager code reads it as
# complex numbers and rotates with one complex multiply on the contiguous (B, T, heads, head_dim) tensor
# (several times faster on a CPU than the same rotation written as six real ops); compiled code does the
# same arithmetic on real tensors, which the compiler fuses into one kernel (it does not generate code
# for complex operators). Both give the same numbers (tests/model/test_gpt.py).
# --------------------------------------------------------------------------------------------------------------------

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

# --------------------------------------------------------------------------------------------------------------------
# 4. The KV cache: preallocated key/value buffers for fast generation
# Without a cache, every new token recomputes k and v for the whole context: O(T) work per layer per
# token for the projections, O(T^2) overall. With one, each token's k, v are computed once and written
# at its position; a step only projects the new token. The buffers have a static shape
# (B, n_kv_head, max_len, head_dim) and are written by index (`input_pos`), so the same graph serves
# every step and `torch.compile` / CUDA graphs can capture it. GQA stores only the shared kv heads,
# so the cache is n_head / n_kv_head times smaller than a multi-head one.
# Its dtype may differ from the model's: a bfloat16 cache under a float32 model halves its memory and is read back
# in float32; a float32 cache under a bfloat16 model (eager CPU decoding, model/generate.py's decode_cache_dtype)
# holds the same numbers widened, and the fused kernel attends over it in float32, which CPU flash attention runs
# faster than bfloat16 for one query.
# --------------------------------------------------------------------------------------------------------------------

def check_slot(slot: int, slots: int) -> None:
    """IndexError unless a KV cache of `slots` positions has slot `slot` (a negative one would index from the end)."""
    if not 0 <= slot < slots:
        raise IndexError(f"position {slot} is outside the cache's {slots} slots")


class KVCache(nn.Module):
    def __init__(self, batch_size: int, n_kv_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        shape = (batch_size, n_kv_head, max_len, head_dim)
        # keys and values in one buffer (2, B, n_kv_head, max_len, head_dim), so that a decode step writes both of
        # a slot in one copy (model/decode.py); not part of the model's state: never saved in checkpoints
        self.register_buffer("kv", torch.zeros((2, *shape), dtype=dtype, device=device), persistent=False)

    @property
    def k_cache(self) -> torch.Tensor:
        return self.kv[0]  # (B, n_kv_head, max_len, head_dim), a view

    @property
    def v_cache(self) -> torch.Tensor:
        return self.kv[1]

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv_head, T, head_dim) at positions input_pos (T,); return the full buffers
        (B, n_kv_head, max_len, head_dim). Positions not yet written hold zeros, and the caller's mask
        hides them. Each half of the buffer is viewed again after the other is written: under grad, a view taken
        before an in-place write to its base would be stale."""
        one_slot = self.kv.shape[1:3] + (1,) + self.kv.shape[4:]  # what index_copy_ would accept for one position
        if k.shape == one_slot and k.device.type == "cpu" and not torch.compiler.is_compiling():
            return self._write_slot(int(input_pos), k[:, :, 0], v[:, :, 0])
        self.k_cache.index_copy_(2, input_pos, k.to(self.kv.dtype))
        self.v_cache.index_copy_(2, input_pos, v.to(self.kv.dtype))
        return self.k_cache, self.v_cache

    def _write_slot(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, n_kv_head, head_dim) into slot `slot`. copy_ converts to the cache's dtype as it writes, one
        kernel per tensor, where index_copy_ needs a converted copy first (its source must have the buffer's
        dtype)."""
        check_slot(slot, self.kv.shape[3])
        self.k_cache.select(2, slot).copy_(k)
        self.v_cache.select(2, slot).copy_(v)
        return self.k_cache, self.v_cache

    def reset(self) -> None:
        """Zero the buffer in place (it keeps its identity, which compiled code guards on)."""
        self.kv.zero_()

# --------------------------------------------------------------------------------------------------------------------
# 5. Causal self-attention: the projections around the formula, grouped-query heads, RoPE, the cache
# --------------------------------------------------------------------------------------------------------------------

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
        self.kv_cache = None  # a KVCache (section 4) while generating with a cache
        self.head_patch: HeadPatch | None = None  # heads whose outputs are replaced (module doc); None = none
        # which fast path plain causal attention over x takes (ATTENTION_KERNELS): set by `dtype: auto` to what
        # measured fastest (training/autotune.py), a setting of the machine, never part of the model's config
        self.attention_kernel = "fused"
        # one decoded query over the cache on a kernel of our own (model/decode_attention.py's DecodeAttention), set
        # by use_decode_attention where it timed faster than the fused kernel; None: the fused kernel
        self.decode_kernel = None

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

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None, need_weights: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, d_model). rope: (T, head_dim/2, 2) cos/sin rotations for the positions of x (model/gpt.py).
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
        # a float32 cache under a narrower model is attended over by the fused kernel in float32, as it is stored
        # (section 4); any other cache is read back in q's dtype, free when they match
        wide_cache = k.dtype == torch.float32 and q.dtype != torch.float32
        dropout_p = self.dropout_p if self.training else 0.0
        n_rep = self.n_head // self.n_kv_head

        # Eager decoding of one token (generate's eager CPU steps take model/decode.py instead): its query sits at
        # the newest written position and the mask row is the written prefix, all True (GPT._hidden cuts it
        # there), so no mask is applied; applying one costs ~5% of an eager CPU decode step (benchmarks/RESULTS.md).
        # Compiled code keeps the row, which on CUDA is a whole-buffer row with unwritten slots to hide.
        one_query = T == 1 and mask is not None and not torch.compiler.is_compiling()

        weights = None
        if (one_query and self.decode_kernel is not None and not need_weights and self.attn_impl != "manual"
                and dropout_p == 0.0 and self.decode_kernel.takes(q, k, v)):
            out = self.decode_kernel(q, k, v)  # (B, n_head, 1, head_dim), from the cache as it is stored
        elif need_weights or self.attn_impl == "manual":
            # Group the query heads by the kv head they share: (B, n_kv_head, n_rep, T, head_dim);
            # k and v broadcast over the group axis, so shared heads are never copied.
            k, v = k.to(q.dtype), v.to(q.dtype)
            q_grouped = q.view(B, self.n_kv_head, n_rep, T, self.head_dim)
            out, weights = scaled_dot_product_attention(
                q_grouped, k.unsqueeze(2), v.unsqueeze(2), mask=mask, causal=mask is None, dropout_p=dropout_p)
            out = out.view(B, self.n_head, T, self.head_dim)
            weights = weights.view(B, self.n_head, T, -1) if need_weights else None
        else:
            sdpa_mask = None if one_query else mask
            if not wide_cache:
                k, v = k.to(q.dtype), v.to(q.dtype)
            if mask is None and self.attention_kernel == "matmul":  # causal over x itself: training, evals
                out = matmul_attention(q, k, v, dropout_p)
            else:
                out = fused_attention(q, k, v, sdpa_mask, causal=mask is None, dropout_p=dropout_p,
                                      float32=self.attention_kernel == "fused float32" or wide_cache)

        if self.head_patch is not None:
            out = self.head_patch.apply(out)  # (B, n_head, T, head_dim)
        y = out.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # heads side by side again
        y = self.out_proj(y)
        return (self.resid_dropout(y) if self.training else y), weights  # dropout: identity in eval, its call skipped

# --------------------------------------------------------------------------------------------------------------------
# 6. The rest of a block: the two norms and the two MLPs
# --------------------------------------------------------------------------------------------------------------------

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


class GeluMLP(nn.Module):
    """d_model -> hidden -> GELU -> d_model."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.hidden_dim, bias=config.bias)
        self.fc_out = nn.Linear(config.hidden_dim, config.d_model, bias=config.bias)  # a residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))
        return self.dropout(y) if self.training else y


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
        y = self.fc_out(F.silu(gate) * up)
        return self.dropout(y) if self.training else y


def make_mlp(config: ModelConfig) -> nn.Module:
    return SwiGLU(config) if config.mlp == "swiglu" else GeluMLP(config)

# --------------------------------------------------------------------------------------------------------------------
# 7. Block and GPT
# --------------------------------------------------------------------------------------------------------------------

def _all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of x is finite, by its smallest and largest entries, found in one reduction: both are
    finite exactly when every entry is, and a NaN anywhere makes both NaN (aminmax propagates it). A decode step's
    check over GPT-2's 50304 bfloat16 logits: ~5 us, against ~13 for a float64 sum and more for isfinite(x).all()'s
    two passes."""
    if x.numel() == 0:
        return True
    # detached only where autograd would record the reduction: a decode step's logits take no gradient, and the
    # detach is one more op after the LM head has emptied the caches
    smallest, largest = torch.aminmax(x.detach() if x.requires_grad else x)
    return math.isfinite(float(smallest)) and math.isfinite(float(largest))  # Python floats: no more tensor ops


BLOCK_MATMULS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc_in", "mlp.fc_out")  # each block's matmul layers, in order
HEAD_COLUMNS_MAX_ROWS = 8  # up to this many rows (decode steps of small batches) use GPT.head_columns on a CPU


class Block(nn.Module):
    """One transformer layer: attention then MLP, each on a normalised copy of the residual stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.mlp_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.mlp = make_mlp(config)

    def forward(self, x, rope=None, mask=None, input_pos=None, need_weights=False):
        attn_out, weights = self.attn(self.attn_norm(x), rope, mask, input_pos, need_weights)
        x = x + attn_out
        x = x + self.mlp(self.mlp_norm(x))
        return x, weights


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model) if config.pos == "learned" else None
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # one matrix maps tokens to vectors and vectors back to token scores (Press & Wolf 2017)
            self.lm_head.weight = self.tok_emb.weight
        if config.pos == "rope":
            # (cos, sin) per position and channel pair, float32 (block_size, head_dim/2, 2); derived, so not saved
            self.register_buffer("rope_freqs", rope_frequencies(config.head_dim, config.block_size,
                                                                config.rope_theta), persistent=False)
        self.causal_table = None  # bool (max_len, max_len), set with the KV cache
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's initialisation, in one place.

        - every Linear and Embedding weight ~ N(0, 0.02), biases 0: small enough that the first
          logits are near uniform (initial loss ~ ln(vocab_size));
        - the two projections that write into the residual stream (attention out_proj, MLP fc_out)
          get std 0.02 / sqrt(2 * n_layer): the stream sums 2 * n_layer of them, so its variance at
          init stays independent of depth (GPT-2 paper, section 2.3);
        - norm weights 1, norm biases 0."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("out_proj", "fc_out")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for name, param in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(param) if name.endswith("weight") else nn.init.zeros_(param)

    def _apply(self, fn, *args, **kwargs):
        """`model.to(torch.bfloat16)` would cast the RoPE table too, losing the precision long contexts need
        (and the float32 layout eager RoPE reads as complex numbers): rebuild it, float32, on the new device
        after any such conversion. Pooled KV caches and a compiled decode step belong to the old device and
        dtype: dropped."""
        for cached in ("_kv_pool", "_compiled_decode", "_head_columns"):
            self.__dict__.pop(cached, None)
        had_rope = self._buffers.pop("rope_freqs", None) is not None
        module = super()._apply(fn, *args, **kwargs)
        if had_rope:
            self.register_buffer("rope_freqs", rope_frequencies(
                self.config.head_dim, self.config.block_size, self.config.rope_theta,
                device=self.tok_emb.weight.device), persistent=False)
        return module

    # ----------------------------------------------------------------------------------------------
    def _hidden(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None,
                record: set[int] | frozenset[int] = frozenset(), kv_len: int | None = None,
                head: slice | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """idx (B, T) -> final hidden states (B, T, d_model) and the attention weights of the layers in
        `record`, each (B, n_head, T, T_k). Weights are only computed for those layers.
        kv_len: with a KV cache, how many of its slots the queries attend over. By default eager code takes
        the written prefix, max(input_pos) + 1, and compiled code the whole buffer; a compiled CPU decode
        step passes it as a dynamic size (model/generate.py).
        head: the positions whose logits (B, T', vocab_size) to return instead of the hidden states (forward).

        Every pass outside training ends with one check that what it returns is finite (`_check_finite`):
        sampling, evaluation and the attention dumps all run through here."""
        x, rope, mask = self._inputs(idx, input_pos, kv_len)
        maps: dict[int, torch.Tensor] = {}
        for layer, block in enumerate(self.blocks):
            x, weights = block(x, rope, mask, input_pos, need_weights=layer in record)
            if weights is not None:
                maps[layer] = weights
        out = self.final_norm(x)
        if head is not None:
            out = self.logits(out[:, head])
        if not self.training and not torch.compiler.is_compiling():
            self._check_finite(out, idx, input_pos, kv_len)
        return out, maps

    def _inputs(self, idx: torch.Tensor, input_pos: torch.Tensor | None, kv_len: int | None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What block 0 receives for idx (B, T) at input_pos (see _hidden): the embedded tokens (B, T, d_model),
        the RoPE rotations (T, head_dim/2, 2) or None, and the attention mask (T, T_k) or None (plain causal)."""
        T = idx.shape[1]
        caching = self.blocks[0].attn.kv_cache is not None
        if input_pos is None:
            if caching:
                raise ValueError("a KV cache is set up: pass input_pos, the positions of idx's tokens")
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
            positions = torch.arange(T, device=idx.device)
            mask = None  # plain causal attention over idx itself
        else:
            positions = input_pos  # (T,) absolute positions of idx's tokens
            # With a cache, query row i sees the keys written at positions <= input_pos[i] (bottom-right
            # aligned causal attention over the buffer); without one, idx only sees itself.
            mask = self.causal_table[input_pos] if caching else None
            if caching and kv_len is None and not torch.compiler.is_compiling():
                # eager: the written prefix; one position (a decode step) read as it is, without a reduction
                kv_len = int(input_pos if input_pos.numel() == 1 else input_pos.max()) + 1
            if caching and kv_len is not None:
                mask = mask[:, :kv_len]
        return self._embed(idx, positions), self._rope(T, input_pos), mask

    def _check_finite(self, out: torch.Tensor, idx: torch.Tensor, input_pos: torch.Tensor | None,
                      kv_len: int | None) -> None:
        """Raise a UserError naming where the pass first went non-finite, if `out` holds an inf or a NaN.

        Finite weights (every checkpoint reader checks them) can still overflow: a product or a sum past the
        largest number of the dtype computed in (65504 in float16). Downstream of it the softmax gives NaN
        weights, sampling draws from NaN probabilities and argmax picks token 0. One reduction per pass; only
        when it fails is the pass replayed, layer by layer with its attention weights, to find the first
        layer whose weights or output are not finite (a KV cache is rewritten with the same keys and values)."""
        if _all_finite(out):
            return
        x, rope, mask = self._inputs(idx, input_pos, kv_len)
        where, params = "the token embedding", [self.tok_emb.weight]
        if bool(torch.isfinite(x).all()):
            where, params = "the final norm and LM head", [self.final_norm.weight, self.lm_head.weight]
            for layer, block in enumerate(self.blocks):
                x, weights = block(x, rope, mask, input_pos, need_weights=True)
                if not (bool(torch.isfinite(weights).all()) and bool(torch.isfinite(x).all())):
                    part = "attention weights" if not bool(torch.isfinite(weights).all()) else "output"
                    where, params = f"layer {layer}'s {part}", list(block.parameters())
                    break
        device = idx.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.tok_emb.weight.dtype
        largest = max(float(p.detach().abs().max()) for p in params)
        fix = ("the weights are too large even for float32: use an earlier checkpoint, or retrain with a lower "
               "train.lr" if dtype == torch.float32 else
               "compute in float32 (sample.py --dtype float32; dtype: float32 in a run's config)")
        raise UserError(f"the model's numbers overflow: non-finite values (inf or NaN) first appear in {where}, "
                        f"computing in {str(dtype).removeprefix('torch.')} (its largest weight {largest:.3g}): {fix}")

    def _embed(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) at absolute positions (T,) -> the residual stream entering block 0, (B, T, d_model)."""
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        return self.emb_dropout(x) if self.training else x

    def _rope(self, T: int, input_pos: torch.Tensor | None = None) -> torch.Tensor | None:
        """The RoPE rotations (T, head_dim/2, 2) of positions 0..T-1, or of input_pos; None without RoPE."""
        if self.config.pos != "rope":
            return None
        return self.rope_freqs[:T] if input_pos is None else self.rope_freqs[input_pos]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, vocab_size), mean cross-entropy against targets or None).
        Targets equal to -1 are ignored. With a KV cache, input_pos (T,) gives idx's positions.
        last_only: logits of the last position only, (B, 1, vocab_size): all that sampling needs, and
        the vocab-wide lm_head is the largest matmul of a prefill (the hidden states are the same)."""
        if last_only and targets is not None:
            raise ValueError("last_only gives one position's logits: it cannot compute a loss over targets")
        # (B, T, vocab_size), or (B, 1, vocab_size) with last_only
        logits, _ = self._hidden(idx, input_pos, head=slice(-1, None) if last_only else slice(None))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, d_model) -> logits (B, T, vocab_size) through the LM head.

        Decoding on a CPU (no grad, a handful of rows) multiplies by the head's weight stored column-major
        instead, x @ W^T with W^T contiguous: the product then streams the vocab-wide matrix once, row after row
        of W^T, where F.linear computes vocab_size short dot products, about twice as slow on a CPU for one row
        (benchmarks/RESULTS.md). The same numbers in another summation order; the copy is made once and kept
        until the weight changes (its version counter moves on any in-place update). A head replaced by another
        kind of layer (model/packed.py's prepared one) runs as that layer."""
        if x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling() \
                and x.shape[:-1].numel() <= HEAD_COLUMNS_MAX_ROWS and isinstance(self.lm_head, nn.Linear):
            return x @ self.head_columns()
        return self.lm_head(x)

    def matmul_slots(self) -> list[tuple[str, nn.Module, str]]:
        """Where each matmul layer a forward pass runs sits, in the order it runs them: (dotted name, parent module,
        attribute), each block's BLOCK_MATMULS, then the LM head. For code that swaps such a layer for one of the
        same interface (model/packed.py, model/quantize.py) or times them (model/generate.py)."""
        slots = [(f"blocks.{i}.{path}", block.get_submodule(path.split(".")[0]), path.split(".")[1])
                 for i, block in enumerate(self.blocks) for path in BLOCK_MATMULS]
        return slots + [("lm_head", self, "lm_head")]

    def head_is_linear(self) -> bool:
        """Whether the LM head multiplies by a float weight that head_columns() can copy (what compiled decoding
        uses): an nn.Linear, or one whose weight model/packed.py prepacked (the same Parameter); an int8 head
        (model/quantize.py) is not, and runs as its own module."""
        return isinstance(self.lm_head, (nn.Linear, PackedLinear))

    def head_columns(self) -> torch.Tensor:
        """The LM head's weight transposed and contiguous, (d_model, vocab_size): cached, rebuilt after any
        change to the weight (a training step, load_state_dict, a cast or a move)."""
        weight = self.lm_head.weight
        key = (*weight_key(weight), weight.device)
        cached = self.__dict__.get("_head_columns")
        if cached is None or cached[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # a plain tensor, even when made while generating
                cached = self.__dict__["_head_columns"] = (key, weight.detach().t().contiguous())
        return cached[1]

    # ----------------------------------------------------------------------------------------------
    def setup_kv_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                       device: torch.device | str | None = None) -> int:
        """Give every layer a preallocated KV cache; returns its total size in bytes.

        dtype: the cache's own, the model's by default; a narrower one (bfloat16 under a float32 model) halves
        its memory, and attention reads it back in the dtype it computes in; a float32 one under a narrower model
        is attended over in float32 by the fused kernel (section 4).

        Caches of the same shape, dtype and device as the last ones are reused (zeroed), not reallocated:
        compiled decode steps (model/generate.py) guard on the cache buffers they were traced with."""
        max_len = self.config.block_size if max_len is None else max_len
        if not 1 <= max_len <= self.config.block_size:
            raise ValueError(f"max_len={max_len}: must be in 1..block_size={self.config.block_size}")
        param = self.tok_emb.weight
        dtype = dtype or param.dtype
        device = torch.device(device or param.device)
        key = (batch_size, max_len, dtype, device)
        pool = self.__dict__.get("_kv_pool")  # (key, caches, causal table) of the last setup
        if pool is not None and pool[0] == key:
            caches, self.causal_table = pool[1], pool[2]
            for cache in caches:
                cache.reset()
        else:
            # plain tensors even when made inside generate's inference mode: the pool serves every later caller,
            # and an inference tensor could not be zeroed outside that mode
            with torch.inference_mode(False):
                caches = [KVCache(batch_size, self.config.n_kv_head, max_len, self.config.head_dim, dtype=dtype,
                                  device=device) for _ in self.blocks]
                self.causal_table = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
            self.__dict__["_kv_pool"] = (key, caches, self.causal_table)
        for block, cache in zip(self.blocks, caches):
            block.attn.kv_cache = cache
        return sum(cache.kv.nbytes for cache in caches)

    def clear_kv_cache(self) -> None:
        """Back to plain forward passes (the buffers stay pooled for the next setup_kv_cache)."""
        for block in self.blocks:
            block.attn.kv_cache = None
        self.causal_table = None

    def set_attention_kernel(self, kernel: str) -> None:
        """The fast path of every layer's plain causal attention (ATTENTION_KERNELS): a speed setting of the
        machine, not of the model. Decoding against a KV cache always takes the fused kernel."""
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel {kernel!r} is not one of {', '.join(ATTENTION_KERNELS)}")
        for block in self.blocks:
            block.attn.attention_kernel = kernel

    # ----------------------------------------------------------------------------------------------
    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (a tied LM head counts once). exclude_embeddings drops the token and
        position tables, as scaling-law papers count."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, for MFU (PaLM paper, appendix B).

        6 per weight of every matmul (2 forward, 4 backward), the LM head included even when tied;
        plus attention's two matmuls (QK^T and weights @ V): 12 * n_layer * n_head * head_dim * seq_len,
        counted over the full square as is customary, though the causal half is masked."""
        c = self.config
        seq_len = c.block_size if seq_len is None else seq_len
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6.0 * matmul_params + 12.0 * c.n_layer * c.n_head * c.head_dim * seq_len

    # ----------------------------------------------------------------------------------------------------------------
    # 8. Insight hooks (the rest of this section follows the class: AttentionInternals, HeadPatch)
    # ----------------------------------------------------------------------------------------------------------------
    def residual_stream(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream of a plain forward pass over idx (B, T): n_layer + 1 tensors (B, T, d_model),
        entry l the input of block l and the last one the last block's output (before the final norm).
        With `hidden_from` it lets an intervention in layer l re-run layers l.. only (insight/ablation.py)."""
        T = idx.shape[1]
        self._check_plain_pass("residual_stream", T)
        stream = [self._embed(idx, torch.arange(T, device=idx.device))]  # (B, T, d_model) each
        rope = self._rope(T)
        for block in self.blocks:
            stream.append(block(stream[-1], rope)[0])
        return stream

    def _check_plain_pass(self, name: str, T: int) -> None:
        if self.blocks[0].attn.kv_cache is not None:
            raise ValueError(f"{name} runs without a KV cache: call clear_kv_cache() first")
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")

    def hidden_from(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, d_model) from x (B, T, d_model), the residual stream entering block
        `layer` (residual_stream(idx)[layer]): blocks layer..n_layer-1 (plain causal attention over x's T
        positions 0..T-1, no cache) and the final norm. hidden_from(0, residual_stream(idx)[0]) computes
        what forward(idx) does. Pass logits() the result for token scores."""
        self._layer_list([layer])
        self._check_plain_pass("hidden_from", x.shape[1])
        rope = self._rope(x.shape[1])
        for block in self.blocks[layer:]:
            x = block(x, rope)[0]
        return self.final_norm(x)

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor, layers: list[int] | None = None) -> dict[int, torch.Tensor]:
        """Attention weights {layer: (B, n_head, T, T)} of `layers` (default all) for idx (B, T), computed
        by the from-scratch path whatever attn_impl is. Runs in eval mode (no dropout), then restores."""
        layers = self._layer_list(layers)
        was_training = self.training
        self.eval()
        try:
            _, maps = self._hidden(idx, record=set(layers))
        finally:
            self.train(was_training)
        return {layer: maps[layer].float() for layer in layers}

    @torch.no_grad()
    def attention_internals(self, idx: torch.Tensor, layers: list[int] | None = None) -> dict[int, AttentionInternals]:
        """Everything the attention of `layers` (default all) computed over idx (B, T), by the from-scratch
        path in eval mode: per layer q, k (RoPE applied), v, the weights (as attention_maps returns them)
        and out_proj's weight and bias (see AttentionInternals). For inspection: the step-by-step
        arithmetic and value-weighted attention (insight/) are computed from these. q, k, v are what the
        layer's own projection (CausalSelfAttention.project_qkv) returns for the input it received."""
        layers = self._layer_list(layers)
        found: dict[int, AttentionInternals] = {}

        def capture(layer: int):
            def hook(attn, args, kwargs, output):
                x = args[0] if args else kwargs["x"]
                rope = args[1] if len(args) > 1 else kwargs.get("rope")
                q, k, v = attn.project_qkv(x, rope)
                bias = attn.out_proj.bias
                # copies: under FSDP the gathered weights are freed once the block's forward ends
                found[layer] = AttentionInternals(q=q, k=k, v=v, weights=output[1].float(),
                                                  out_weight=attn.out_proj.weight.detach().clone(),
                                                  out_bias=None if bias is None else bias.detach().clone())
            return hook

        handles = [self.blocks[layer].attn.register_forward_hook(capture(layer), with_kwargs=True)
                   for layer in layers]
        was_training = self.training
        self.eval()
        try:
            self._hidden(idx, record=set(layers))
        finally:
            self.train(was_training)
            for handle in handles:
                handle.remove()
        return {layer: found[layer] for layer in layers}

    def _layer_list(self, layers: list[int] | None) -> list[int]:
        """layers (default all), each checked against n_layer."""
        layers = list(range(self.config.n_layer)) if layers is None else list(layers)
        for layer in layers:
            if not 0 <= layer < self.config.n_layer:
                raise ValueError(f"layer {layer} out of range: the model has layers 0..{self.config.n_layer - 1}")
        return layers


# --------------------------------------------------------------------------------------------------------------------
# 8. Insight hooks, continued: what one layer computed, and the heads an intervention replaces
# --------------------------------------------------------------------------------------------------------------------

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

"""GPT's eager one-token decode step on a CPU, written out flat: the numbers of the model's forward pass through its
KV cache, with every weight, cache buffer and kernel looked up once per generation instead of at every call.

Why a second way to run the same layers: decoding one token with GPT-2 small on a 2-core CPU is ~50 matmuls that
stream the weights and ~400 small ops between them. Run through the modules, each of those small ops also pays for
the way there: an nn.Module call (hooks looked for), the checks a layer makes to pick its path (training? compiling?
a packed copy of this weight, of this version? a cache? weights wanted?), a Parameter fetched through
Module.__getattr__. A few microseconds each, and several times that once the weights a matmul streamed have emptied
the caches: ~0.6-0.8 ms of a ~6.5 ms step of GPT-2 small in bfloat16, the two ways alternated token by token in one
generation (benchmarks/RESULTS.md). Here the choices are made once, when the step is built (`EagerDecodeStep`), and a
step is only the arithmetic, in the order and with the kernels of the module path:

    x = token embedding (+ learned position)                                   (B, 1, d_model)
    per block:  q|k|v = qkv_proj(attn_norm(x)), RoPE on q and k;  k, v written into the cache slot `pos`
                x = x + out_proj(attention of q over the cache's slots 0..pos)   (no mask: the fused kernel, or
                                                                  the layer's decode_kernel where it has one)
                x = x + mlp(mlp_norm(x))
    logits = LM head(final_norm(x))                                             (B, 1, vocab_size)

so the logits are the module path's, bit for bit (tests/model/test_decode.py, for generated configurations).

Where it applies (`EagerDecodeStep.applies`): a CPU model in eval mode with a KV cache set up, without grad (as
generate runs), outside autocast and torch.compile, attention through the fused kernel (attn_impl "sdpa": "manual"
runs the from-scratch formula, which only the module path has), and no hook on any module (a hook expects its
module to be called). Anywhere else generate runs the modules.

What is read once, and what at every step: weights, biases, norm and cache tensors are held by reference, so a
weight changed in place (by an on_token callback that trains) is read as it is at the next step, as in the module
path. Copies derived from a weight, a prepared one (model/packed.py: oneDNN-packed, or for ATen's matrix-vector
kernel with the bias as a column) and the LM head's column-major one (GPT.head_columns), are checked against the
versions of what they were made from at every step, one comparison each, and the step is built again where one is
stale. A layer, a head patch, a hook or a weight's tensor (`.data =`, `.to()`) swapped in during a generation is
seen at the next generate call.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as module_globals

from model.gpt import (GPT, HEAD_COLUMNS_MAX_ROWS, SDPA_HAS_GQA, CausalSelfAttention, GeluMLP, LayerNorm, RMSNorm,
                       SwiGLU, _all_finite, apply_rope, check_slot, repeat_kv)
from model.packed import MATVEC, PackedLinear
from model.quantize import Int8Linear

Kernel = Callable[[torch.Tensor], torch.Tensor]


def norm_kernel(norm: nn.Module) -> Kernel:
    """x (..., d) -> norm(x), the aten op F.layer_norm or F.rms_norm calls, on the norm's own tensors (without the
    functional's Python wrapper, a few microseconds 25 times a step); any other module as itself."""
    if isinstance(norm, LayerNorm):
        shape, weight, bias, eps = (norm.weight.shape[0],), norm.weight, norm.bias, norm.eps
        return lambda x: torch.layer_norm(x, shape, weight, bias, eps)
    if isinstance(norm, RMSNorm):
        shape, weight, eps = (norm.weight.shape[0],), norm.weight, norm.eps
        return lambda x: torch.rms_norm(x, shape, weight, eps)
    return norm


def onednn_pointwise() -> Callable:
    """oneDNN's packed linear, the operator itself (OpOverload._op, where this torch has it), without the ~0.6 us of
    the op packet's Python __call__ around it, 49 times a GPT-2 step."""
    pointwise = torch.ops.mkldnn._linear_pointwise.default
    return getattr(pointwise, "_op", pointwise)


def linear_kernel(linear: nn.Module, dtype: torch.dtype, batch: int, derived: list[torch.Tensor]
                  ) -> Kernel:
    """x (batch, 1, in) -> linear(x) as the layer itself computes it for an input of `dtype` without grad on a CPU:
    a PackedLinear on its prepared copy (its weight, and for matvec its bias, appended to `derived`, their
    versions checked at every step; matvec at a batch above 1 on its oneDNN-packed rows copy where it has one)
    or, where its kernel does not apply (a dtype oneDNN does not pack here; matvec at a batch above 1 without a
    rows copy), F.linear, as PackedLinear.forward chooses; an nn.Linear by F.linear; an
    Int8Linear (model/quantize.py) by its one-row kernel at batch 1, else by its forward; any other layer by its
    own forward."""
    if isinstance(linear, PackedLinear):
        weight, bias = linear.weight, linear.bias
        if weight.dtype == dtype and linear.rows_kernel_runs(dtype, batch):  # a matvec layer's rows copy
            rows, pointwise = linear.rows_weight(), onednn_pointwise()
            derived.append(weight)
            return lambda x: pointwise(x, rows, bias, "none", [], "")
        if weight.dtype != dtype or not linear.kernel_runs(dtype, batch):
            return functools.partial(F.linear, weight=weight, bias=bias)
        packed = linear.packed_weight()  # made again here if the weight changed since
        derived.append(weight)
        if linear.kernel == MATVEC:
            if bias is not None:  # the matvec copy holds the bias too
                derived.append(bias)
            return linear.matvec
        pointwise = onednn_pointwise()
        return lambda x: pointwise(x, packed, bias, "none", [], "")
    if isinstance(linear, nn.Linear):
        return functools.partial(F.linear, weight=linear.weight, bias=linear.bias)
    if isinstance(linear, Int8Linear) and batch == 1:
        return linear.one_row_kernel() or linear.forward
    return linear.forward


def mlp_kernel(mlp: nn.Module, dtype: torch.dtype, batch: int, derived: list[torch.Tensor]) -> Kernel:
    """x (batch, 1, d_model) -> mlp(x) in eval mode (no dropout), its two matmuls as linear_kernel runs them; any
    other MLP module as itself."""
    if isinstance(mlp, (GeluMLP, SwiGLU)):
        fc_in, fc_out = (linear_kernel(mlp.fc_in, dtype, batch, derived),
                         linear_kernel(mlp.fc_out, dtype, batch, derived))
        if isinstance(mlp, GeluMLP):
            return lambda x: fc_out(F.gelu(fc_in(x), approximate="tanh"))

        def swiglu(x: torch.Tensor) -> torch.Tensor:
            gate, up = fc_in(x).chunk(2, dim=-1)
            return fc_out(F.silu(gate) * up)
        return swiglu
    return mlp


def head_kernel(model: GPT, batch: int, derived: list[torch.Tensor]) -> Kernel:
    """final hidden states (batch, 1, d_model) -> logits as GPT.logits computes them on a CPU without grad: up to
    HEAD_COLUMNS_MAX_ROWS rows of an nn.Linear head by its column-major copy (its weight appended to
    `derived`), any other head as linear_kernel runs it."""
    dtype = model.tok_emb.weight.dtype
    if isinstance(model.lm_head, nn.Linear) and batch <= HEAD_COLUMNS_MAX_ROWS:
        derived.append(model.lm_head.weight)
        return functools.partial(torch.matmul, other=model.head_columns())
    return linear_kernel(model.lm_head, dtype, batch, derived)


class LayerStep:
    """One block's part of a decode step: its tensors and kernels, looked up once (EagerDecodeStep)."""
    __slots__ = ("attn_norm", "qkv_proj", "out_proj", "mlp_norm", "mlp", "kv", "k_cache", "v_cache", "head_patch",
                 "dtype", "attn_dtype", "cast_cache", "upcast", "n_head", "n_kv_head", "head_dim", "n_rep",
                 "decode_kernel", "itemsize")

    def __init__(self, block: nn.Module, dtype: torch.dtype, derived: list[torch.Tensor]):
        attn: CausalSelfAttention = block.attn
        self.kv = attn.kv_cache.kv  # (2, B, n_kv_head, max_len, D): keys, then values
        batch = self.kv.shape[1]
        self.attn_norm, self.mlp_norm = norm_kernel(block.attn_norm), norm_kernel(block.mlp_norm)
        self.qkv_proj = linear_kernel(attn.qkv_proj, dtype, batch, derived)
        self.out_proj = linear_kernel(attn.out_proj, dtype, batch, derived)
        self.mlp = mlp_kernel(block.mlp, dtype, batch, derived)
        self.k_cache, self.v_cache = self.kv[0], self.kv[1]  # (B, n_kv_head, max_len, D) each
        self.head_patch = attn.head_patch
        self.n_head, self.n_kv_head, self.head_dim = attn.n_head, attn.n_kv_head, attn.head_dim
        self.n_rep = attn.n_head // attn.n_kv_head
        # the dtype attention runs in, as the module path picks it (model/gpt.py, sections 4-5): float32 for a
        # float32 cache under a narrower model or the fused float32 kernel setting (a float64 model stays float64),
        # else the model's; decided here so that a step converts only what differs
        wide_cache = self.kv.dtype == torch.float32 and dtype != torch.float32
        float32 = (wide_cache or attn.attention_kernel == "fused float32") and torch.finfo(dtype).bits < 32
        self.dtype, self.attn_dtype = dtype, torch.float32 if float32 else dtype
        self.cast_cache = self.kv.dtype != self.attn_dtype  # k, v read back in attn_dtype
        self.upcast = self.attn_dtype != dtype  # q widened, the output narrowed back
        # our kernel where the module path takes it (the same test on tensors of this step's dtypes and layout:
        # q a view of the qkv output, k and v of the cache), bound to this cache: a step passes q and the length
        kernel, query = attn.decode_kernel, torch.empty(batch, 1, self.n_head, self.head_dim, dtype=dtype)
        query, one_slot = query.transpose(1, 2), (self.k_cache.narrow(2, 0, 1), self.v_cache.narrow(2, 0, 1))
        takes = kernel is not None and kernel.takes(query, *one_slot)
        self.decode_kernel = kernel.over(query, *one_slot) if takes else None
        self.itemsize = dtype.itemsize  # of the projection's output, where the new rows are read

    def __call__(self, x: torch.Tensor, rope: torch.Tensor | None, pos: int) -> torch.Tensor:
        """x (B, 1, d_model), the residual stream at position pos -> the block's output, (B, 1, d_model)."""
        B = x.shape[0]
        qkv = self.qkv_proj(self.attn_norm(x)).view(B, 1, -1, self.head_dim)  # (B, 1, heads of q|k|v, D)
        # (B, n_head, 1, D): the new k, v into slot pos, then q's attention over slots 0..pos
        out = (self.copied_and_attended if self.decode_kernel is None else self.written_and_attended)(qkv, rope, pos)
        if self.head_patch is not None:
            out = self.head_patch.apply(out)
        x = x + self.out_proj(out.reshape(B, 1, self.n_head * self.head_dim))  # the heads side by side
        return x + self.mlp(self.mlp_norm(x))

    def copied_and_attended(self, qkv: torch.Tensor, rope: torch.Tensor | None, pos: int) -> torch.Tensor:
        """qkv (B, 1, heads of q|k|v, D) -> (B, n_head, 1, D): the new k, v copied into slot pos, converted to the
        cache's dtype as they are copied, and the fused kernel over slots 0..pos. Views by narrow and select rather
        than indexing, whose parsing costs more than the view here."""
        B, n_head, n_kv_head, head_dim = qkv.shape[0], self.n_head, self.n_kv_head, self.head_dim
        n_qk = n_head + n_kv_head
        if rope is None:  # k and v side by side in qkv: both in one copy, (B, 2, n_kv_head, D) -> (2, B, ...)
            kv_new = qkv.narrow(2, n_head, 2 * n_kv_head).view(B, 2, n_kv_head, head_dim).transpose(0, 1)
            self.kv.select(3, pos).copy_(kv_new)
            q = qkv.narrow(2, 0, n_head)  # (B, 1, n_head, D)
        else:  # q and k rotated together, a new tensor: k from there, v from qkv
            qk = apply_rope(qkv.narrow(2, 0, n_qk), rope)
            self.k_cache.select(2, pos).copy_(qk.select(1, 0).narrow(1, n_head, n_kv_head))
            self.v_cache.select(2, pos).copy_(qkv.select(1, 0).narrow(1, n_qk, n_kv_head))
            q = qk.narrow(2, 0, n_head)
        # the written prefix, all of it seen, (B, n_kv_head, pos + 1, D); q (B, n_head, 1, D)
        k, v = self.k_cache.narrow(2, 0, pos + 1), self.v_cache.narrow(2, 0, pos + 1)
        return self.fused(q.transpose(1, 2), k, v)

    def written_and_attended(self, qkv: torch.Tensor, rope: torch.Tensor | None, pos: int) -> torch.Tensor:
        """qkv (B, 1, heads of q|k|v, D) -> (B, n_head, 1, D): the new k, v into slot pos and q's attention over
        slots 0..pos in one call of our kernel (model/decode_attention.py), given where the rows lie instead of
        views of them: the cache gets the numbers copied_and_attended's copies write, and the attention is the
        module path's call."""
        n_head, head_dim, n_qk = self.n_head, self.head_dim, self.n_head + self.n_kv_head
        # q and k from qkv, or with RoPE from the rotated copy of both (contiguous, (B, 1, n_qk, D)); v from qkv;
        # in either, heads are D apart (a view of the projection's output)
        qk = qkv if rope is None else apply_rope(qkv.narrow(2, 0, n_qk), rope)
        return self.decode_kernel.write_and_attend(
            qk.narrow(2, 0, n_head).transpose(1, 2), pos + 1, qk.data_ptr() + n_head * head_dim * self.itemsize,
            qk.stride(0), qkv.data_ptr() + n_qk * head_dim * self.itemsize, qkv.stride(0))

    def fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, n_head, 1, D) over k, v (B, n_kv_head, T, D), every key seen -> (B, n_head, 1, D) in the model's
        dtype: fused_attention's call (model/gpt.py) without its per-call choices, made in __init__: no mask, shared
        kv heads read in place where the kernel can (enable_gqa), repeated otherwise, in attn_dtype."""
        if self.cast_cache:
            k, v = k.to(self.attn_dtype), v.to(self.attn_dtype)
        if self.upcast:
            q = q.to(self.attn_dtype)
        if self.n_rep == 1:
            out = F.scaled_dot_product_attention(q, k, v)
        elif SDPA_HAS_GQA:
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep))
        return out.to(self.dtype) if self.upcast else out


def has_hooks(model: nn.Module) -> bool:
    """Whether any forward hook, on one of the model's modules or global, would expect a module to be called."""
    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


class EagerDecodeStep:
    """`step(token (B, 1), pos)` -> logits (B, 1, vocab_size): GPT's forward of one token at position pos through
    the KV cache set up for batch B, in eager code on a CPU, flat (module doc). Build it after setup_kv_cache, once
    per generation; `applies(model)` says where it may run."""

    def __init__(self, model: GPT):
        self.model = model
        self.bind()

    @staticmethod
    def applies(model: GPT) -> bool:
        """A CPU model in eval mode with a KV cache, without grad, outside autocast and compilation, attention
        through the fused kernel, no hooks (module doc)."""
        weight = model.tok_emb.weight
        return (weight.device.type == "cpu" and not model.training and model.config.attn_impl != "manual"
                and model.blocks[0].attn.kv_cache is not None and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cpu")
                and not has_hooks(model))

    def bind(self) -> None:
        """Look every tensor and kernel up from the model as it is now."""
        model = self.model
        dtype = model.tok_emb.weight.dtype
        derived: list[torch.Tensor] = []  # the weights a packed or transposed copy was made from
        self.layers = [LayerStep(block, dtype, derived) for block in model.blocks]
        self.tok_emb, self.pos_emb = model.tok_emb.weight, None if model.pos_emb is None else model.pos_emb.weight
        self.rope_freqs = model.rope_freqs if model.config.pos == "rope" else None  # (block_size, D/2, 2)
        self.final_norm = norm_kernel(model.final_norm)
        cache = self.layers[0].kv  # (2, B, n_kv_head, max_len, D)
        self.head = head_kernel(model, cache.shape[1], derived)
        self.derived_weights = derived
        self.derived_versions = [weight._version for weight in derived]  # what an in-place change moves
        self.slots = cache.shape[3]  # the cache's positions

    def current(self) -> bool:
        """Whether every packed or transposed copy still matches its weight, as far as an in-place change goes: the
        weights' versions compared as one list. Their whole keys (storage, version, dtype: weight_key) cost ~150
        against ~47 us a step of GPT-2 small, read after the LM head has emptied the caches; a tensor swapped in
        (`.data =`, `.to()`) keeps its version and is seen at the next generate call, as a swapped layer is
        (module doc)."""
        return [weight._version for weight in self.derived_weights] == self.derived_versions

    def __call__(self, token: torch.Tensor, pos: int) -> torch.Tensor:
        check_slot(pos, self.slots)
        if not self.current():
            self.bind()
        x = F.embedding(token, self.tok_emb)  # (B, 1, d_model)
        if self.pos_emb is not None:
            x = x + self.pos_emb[pos]  # (d_model,), broadcast over the batch as the module path's (1, d_model) is
        rope = None if self.rope_freqs is None else self.rope_freqs[pos:pos + 1]  # (1, D/2, 2)
        for layer in self.layers:
            x = layer(x, rope, pos)
        logits = self.head(self.final_norm(x))  # (B, 1, vocab_size)
        # every pass's check that its numbers are finite; where they are not, the modules' replay says where
        if not _all_finite(logits):
            self.model._check_finite(logits, token, torch.tensor([pos]), None)
        return logits

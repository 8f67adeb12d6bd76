"""Attention of one decoded query over the KV cache on a kernel of our own, native/decode_attention.c (its numbers
and why are in its header comment): what a CPU decode step runs for each layer's attention where it timed faster
than PyTorch's fused kernel (`use_decode_attention`, which sample.py calls). The library is built and loaded
outside the network (native/build.py) and handed in; here are the call and the choice.

Where it runs, the module path (CausalSelfAttention.forward, one query through the cache) and generate's flat
decode step (model/decode.py) both call it, so the two agree bit for bit as they do on the fused kernel; the flat
step binds it to each layer's cache once a generation (`over`) and has it write the step's new keys and values
into the cache in the same call (`BoundAttention.write_and_attend`). It computes
in float32 from bfloat16 or float32 q and cache, the output in q's dtype: a cache stays in the model's dtype
(model/generate.py's decode_cache_dtype), half the bytes a step reads in bfloat16 against the float32 cache the
fused kernel is faster on.
"""
from __future__ import annotations

import ctypes

import torch

from model.gpt import fused_attention
from model.timing import best_seconds

DTYPES = (torch.float32, torch.bfloat16)  # what the C file reads and writes
INT_MAX = 2 ** 31 - 1  # its sizes stay within a C int
# the C function's arguments, one int64 each, in its order (its enum)
(THREADS, Q, Q_BATCH_STRIDE, Q_HEAD_STRIDE, Q_BF16, K, V, KV_BATCH_STRIDE, KV_HEAD_STRIDE, KV_POSITION_STRIDE, KV_BF16,
 BATCH, N_HEAD, N_KV_HEAD, HEAD_DIM, LENGTH, OUT, OUT_BF16, K_NEW, K_NEW_BATCH_STRIDE, V_NEW, V_NEW_BATCH_STRIDE,
 NEW_HEAD_STRIDE, NEW_BF16) = range(24)
ARGUMENTS = 24
Arguments = ctypes.c_int64 * ARGUMENTS


class DecodeAttention:
    """`(q, k, v)` -> softmax(q k^T / sqrt(head_dim)) v for q (B, n_head, 1, head_dim) and k, v (B, n_kv_head, T,
    head_dim), two views of one cache buffer with the same strides, every key seen (the written prefix): (B,
    n_head, 1, head_dim) in q's dtype, computed in float32. `takes(q, k, v)` says where it applies; `over(q, k,
    v)` binds one layer's cache for the steps of a generation."""

    def __init__(self, lib: ctypes.CDLL):
        self._call = lib.attngpt_decode_attention  # its function pointer keeps the library loaded

    def __deepcopy__(self, memo: dict) -> DecodeAttention:
        return self  # no state but the loaded library's function, which a copied model shares

    @staticmethod
    def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether the kernel computes this call: CPU tensors of DTYPES, one query, head_dim contiguous, k and v of
        one dtype, shape and strides, whole groups of query heads per kv head, sizes within a C int."""
        return (q.device.type == "cpu" and k.device.type == "cpu" and q.dtype in DTYPES and k.dtype in DTYPES
                and v.dtype == k.dtype and q.dim() == 4 and k.dim() == 4 and q.shape[2] == 1
                and v.shape == k.shape and v.stride() == k.stride() and q.stride(-1) == 1 and k.stride(-1) == 1
                and q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3] and q.shape[1] % k.shape[1] == 0
                and 0 < k.shape[2] <= INT_MAX and 0 < q.shape[0] * q.shape[1] <= INT_MAX)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.over(q, k, v)(q, k.shape[2])

    def over(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> BoundAttention:
        """The call bound to the cache buffer k, v are views of and to q's shape and dtype: what changes from one
        decoded token to the next (q, its strides, the length) is all a step passes."""
        batch, n_head, _, head_dim = q.shape
        arguments = Arguments()
        arguments[THREADS] = torch.get_num_threads()
        arguments[Q_BF16] = arguments[OUT_BF16] = q.dtype == torch.bfloat16
        arguments[K], arguments[V] = k.data_ptr(), v.data_ptr()
        arguments[KV_BATCH_STRIDE], arguments[KV_HEAD_STRIDE], arguments[KV_POSITION_STRIDE] = k.stride()[:3]
        arguments[KV_BF16] = k.dtype == torch.bfloat16
        arguments[BATCH], arguments[N_HEAD], arguments[N_KV_HEAD], arguments[HEAD_DIM] = (batch, n_head, k.shape[1],
                                                                                           head_dim)
        # a new row, where write_and_attend passes one: heads head_dim apart, in q's dtype (the projection's)
        arguments[NEW_HEAD_STRIDE], arguments[NEW_BF16] = head_dim, q.dtype == torch.bfloat16
        return BoundAttention(self._call, arguments, (batch, n_head, 1, head_dim), q.dtype)


class BoundAttention:
    """`(q, length)` -> the attention of q (B, n_head, 1, head_dim) over the first `length` positions of one
    cache: DecodeAttention's call with everything else fixed (DecodeAttention.over)."""
    __slots__ = ("call", "arguments", "shape", "dtype")

    def __init__(self, call, arguments: ctypes.Array, shape: tuple[int, ...], dtype: torch.dtype):
        self.call, self.arguments, self.shape, self.dtype = call, arguments, shape, dtype

    def __call__(self, q: torch.Tensor, length: int) -> torch.Tensor:
        arguments = self.arguments
        out = torch.empty(self.shape, dtype=self.dtype)  # contiguous: (B, n_head, head_dim)
        arguments[Q], arguments[OUT], arguments[LENGTH] = q.data_ptr(), out.data_ptr(), length
        arguments[Q_BATCH_STRIDE], arguments[Q_HEAD_STRIDE] = q.stride(0), q.stride(1)
        if self.call(arguments):
            raise MemoryError("the decode attention kernel could not allocate its scratch")
        return out

    def write_and_attend(self, q: torch.Tensor, length: int, k_new: int, k_new_batch_stride: int, v_new: int,
                         v_new_batch_stride: int) -> torch.Tensor:
        """The same, after writing the step's new keys and values into slot length - 1, in the same call: k_new and
        v_new the addresses of row 0's first kv head (B, n_kv_head, head_dim), heads head_dim apart and rows
        their batch strides apart (elements), in q's dtype; what copy_ into the slot would write, converted to
        the cache's dtype (widened exactly, or rounded to nearest even)."""
        arguments = self.arguments
        arguments[K_NEW], arguments[K_NEW_BATCH_STRIDE] = k_new, k_new_batch_stride
        arguments[V_NEW], arguments[V_NEW_BATCH_STRIDE] = v_new, v_new_batch_stride
        try:
            return self(q, length)
        finally:
            arguments[K_NEW] = arguments[V_NEW] = 0  # a later plain call writes nothing


def bind(lib: ctypes.CDLL) -> None:
    """The C function's signature set on lib (native/build.py binds it before its probe); ValueError where the
    library's argument list is not the one written here."""
    lib.attngpt_decode_attention_args.restype = ctypes.c_int
    if lib.attngpt_decode_attention_args() != ARGUMENTS:
        raise ValueError("native/decode_attention.c takes another argument list than model/decode_attention.py's")
    lib.attngpt_decode_attention.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    lib.attngpt_decode_attention.restype = ctypes.c_int


def decode_attention_seconds(kernel: DecodeAttention, dtype: torch.dtype, batch_size: int, n_head: int,
                             n_kv_head: int, head_dim: int, length: int) -> tuple[float, float]:
    """(the kernel's seconds on a cache in `dtype`, the fused kernel's best: on that cache or, for a narrower
    dtype, on a float32 one with q widened, as decode_cache_dtype would choose) for one decoded query per row over
    `length` cached positions, timed on this CPU in interleaved rounds."""
    generator = torch.Generator().manual_seed(0)  # its own: the caller's seeded draws stay what they would have been
    q = torch.randn(batch_size, n_head, 1, head_dim, generator=generator).to(dtype)
    k, v = (torch.randn(batch_size, n_kv_head, length, head_dim, generator=generator).to(dtype) for _ in range(2))
    runs = {"kernel": lambda: kernel(q, k, v), "fused": lambda: fused_attention(q, k, v, None, causal=False)}
    if torch.finfo(dtype).bits < 32:
        k32, v32 = k.float(), v.float()
        runs["fused float32"] = lambda: fused_attention(q, k32, v32, None, causal=False, float32=True)
    best = best_seconds(runs, rounds=3, calls=3)
    return best.pop("kernel"), min(best.values())


def use_decode_attention(model: torch.nn.Module, lib: ctypes.CDLL | None, batch_size: int, max_len: int) -> str:
    """Give every attention layer of a CPU model the kernel where it times faster than the fused kernel for a
    generation of batch_size rows filling max_len cache slots (timed at half of them, the mean context), else
    none; a line saying which and why. lib None (no kernel built here) leaves the layers on the fused kernel."""
    attn = model.blocks[0].attn
    dtype = model.tok_emb.weight.dtype
    kernel = None
    if lib is None:
        why = "not built here (no C compiler, or ATTNGPT_NATIVE_KERNELS=0)"
    elif model.tok_emb.weight.device.type != "cpu" or dtype not in DTYPES:
        why = f"not for {model.tok_emb.weight.device.type} {str(dtype).removeprefix('torch.')}"
    else:
        candidate = DecodeAttention(lib)
        ours, fused = decode_attention_seconds(candidate, dtype, batch_size, attn.n_head, attn.n_kv_head,
                                               attn.head_dim, max(1, max_len // 2))
        kernel = candidate if ours < fused else None
        why = f"timed {ours * 1e6:.0f} us a layer against {fused * 1e6:.0f} for the fused kernel"
    for block in model.blocks:
        block.attn.decode_kernel = kernel
    return f"decode attention {'on attngpt' if kernel else 'without attngpt'}'s kernel: {why}"


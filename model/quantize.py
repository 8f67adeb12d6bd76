"""Int8 weights for CPU decoding (sample.py --quantize): per-channel quantized linears, for inference only.

What is quantized: each block's four matmuls (attention qkv_proj and out_proj, the MLP's fc_in and fc_out), and
the LM head when it is asked for or measured faster (below). The embedding table, the norms and attention itself
stay in the model's dtype. Decoding one token on a CPU streams every weight matrix from memory once; int8 halves
the bytes of bfloat16 and quarters those of float32, which is where the speed comes from.

Weights, per output channel (`quantize_per_channel`): row n of W (out, in) gets its own scale
s_n = max_k |W_nk| / 127, and q_nk = round(W_nk / s_n), an int8 in [-127, 127]. The dequantized weight q_nk * s_n
differs from W_nk by at most s_n / 2: each row keeps 8 bits relative to its own largest entry, so a row of small
weights is not flattened by a large one elsewhere. (A scale stored in bfloat16 is rounded *up*, so that no value
ever needs clamping; an all-zero row gets scale 1 and stays exactly zero.)

Two modes, both with these weights:
    int8           weight-only: activations are not rounded to 8 bits. On a CPU with FBGEMM (x86 builds) each
                   activation row (one token) is carried at 16 bits as two int8 digits: with s = max|row| / D,
                   u = x / s, h = round(u) and l = round((u - h) * B), x ~ s * (h + l / B), where D = 127 and B =
                   254 (D = 63, B = 126 where 256 codes saturate this CPU's kernel: digit_levels). Every entry is
                   then within s / (2B) = max|row| / 64516 of x (/ 15876 at 7-bit digits): finer than bfloat16's
                   own rounding (|x| / 512) for every entry within a factor 126 of the row's largest. Both digit
                   rows of every token go through one FBGEMM int8 product (torch.ops.quantized.linear_with_input_
                   q_dq_qweight_dq_output_fp32 on the digits at scale 1, u8 codes around zero point D + 1, exact
                   in int32, the weights' scales applied inside; the row's scale s and the bias after): y = s * (W h
                   + W l / B) + b in float32, one read of the int8 weights for both digits. Code being compiled
                   (Inductor does not lower that op) and a bfloat16 input where this torch has no FBGEMM run
                   torch.ops.aten._weight_int8pack_mm on the bfloat16 row instead (int8 weights converted on the
                   fly, float accumulation, times the per-row scales); any other input (float32 there, another
                   device) runs F.linear on the dequantized weight in the input's dtype: the same numbers, no
                   special kernel. _weight_int8pack_mm's AVX-512 loop reads each row 16 values at a time with no
                   tail: on torch 2.13 in_features 24 gave garbage and 7 crashed the process, so a layer whose
                   in_features is not a multiple of 16 is refused at quantize time.
                   A single row (a decode step) goes instead to a kernel of our own where it can be built here
                   and times faster (native/int8_matvec.c, called by model/int8_matvec.py): the same two 8-bit
                   digits and integer sums, computed with the product and the output's rounding in one call, the
                   weights read once in a layout made for streaming them. quantize_int8 times it against the path
                   above over the model's block matmuls at one row and keeps the faster for every layer.
    int8-dynamic   weights AND activations in int8: each activation row (one token) is quantized at run time to
                   uint8 with its own scale and zero point over [min(row, 0), max(row, 0)] (asymmetric: 256 levels
                   between the row's extremes, 0.0 exactly representable), and the product runs on integers. This
                   changes the numbers a second time: every activation entering a quantized matmul is rounded to
                   one of 256 levels of its own token's range (an error up to one level, s_x = range / 255, per
                   entry; within s_x / 2 except at the range's edges), so y_n differs from the weight-only result
                   by at most s_x * sum_k |q_nk s_n|. Kernels: one row (a batch-1 decode step, where a per-tensor
                   scale *is* the per-token scale) goes to FBGEMM's dynamic int8 linear (torch.ops.quantized.
                   linear_dynamic on a weight packed once by linear_prepack: the row's quantization, over the same
                   256 levels of [min(row, 0), max(row, 0)], and the integer product in one call), or where this
                   torch has no FBGEMM to oneDNN's x86 int8 matmul (torch.ops.onednn.qlinear_pointwise on a weight
                   packed by qlinear_prepack, the row quantized here first); several rows (a prefill, a batch),
                   code being compiled (Inductor lowers neither one-row kernel) or a build with neither go to
                   torch._int_mm on the uint8 rows and the int8 weight, with each row's scale and zero point
                   applied after: y = s_x * s_n * (sum_k q_x,k q_nk - z_x sum_k q_nk), exact in int32. All give
                   per-token numbers (the one-row kernels round the final float products differently), with
                   one exception: FBGEMM's step is never finer than FBGEMM_SMALLEST_SCALE (6.1e-5), so a row
                   whose range is under 255 x 6.1e-5 = 0.0156 (activations all but zero) is rounded to those
                   coarser steps there, an output error up to 6.1e-5 * sum_k |q_nk s_n| instead of s_x * ....
                   On a CPU without VNNI the one-row kernels multiply u8 x s8 pairs with AVX2's vpmaddubsw,
                   which adds two products into a saturating int16: 2 x 255 x 127 does not fit, and an output
                   came out at half its value. `activation_levels()` tries the kernels on that worst case once;
                   where they saturate, every path (the one-row kernels and torch._int_mm alike, so that a
                   prefill and a decode step agree) quantizes activations to 128 levels (7 bits, what torch calls
                   reduce_range), under which every pair fits; s_x is then range / 127.

Measured on the development machine (2 threads, batch 1, GPT-2 small's 48 block matmuls, 12 layers of 768-wide
qkv/out/fc_in/fc_out, each of the 48 a separate weight so that they stream from memory as in a decode step, and
the 50304 x 768 head; `benchmarks/int8_sample.py --kernels`): bfloat16 F.linear 18.5 ms, bfloat16 oneDNN-packed
12.6 ms (head 4.5), _weight_int8pack_mm 9.4 ms (head 3.8), FBGEMM's linear_dynamic 5.2 ms (head 1.7). So torch's
weight-only kernel reads ~9 GB/s at one row, below what the memory gives, while FBGEMM's reads 16-22 GB/s, the
byte rate of bfloat16's packed kernel or more: twice the weights a second. FBGEMM's product of two rows (the two
digits) costs little more than one: the weights are read once. Since then bfloat16 runs ATen's matrix-vector
kernel at one row (model/packed.py), 5.7 ms for the block matmuls, while FBGEMM's digits with their ops around
the product took ~6.6: int8 gained only on the LM head. native/int8_matvec.c takes 3.0 ms for the same 48 (1.2 for
the head), ~30 GB/s of int8 weights. Whole decode steps, benchmarks/RESULTS.md.

The LM head (`quantize_int8(lm_head=None)`): the float head of a CPU decode step already streams a column-major
copy (GPT.logits), a oneDNN-packed one or its row-major weight through ATen's matrix-vector kernel
(model/packed.py), so whether int8 beats it depends on the machine; it
is decided by timing both on one row when quantizing (a few interleaved calls each, each after a pass over the
block matmuls so that the head comes from memory as in a decode step; the faster kept), never by a constant. A
tied head becomes an Int8Linear of its own (the embedding table stays float).

Only for inference: a quantized model is never trained (its int8 weights are buffers, no parameters) and never
saved (Int8Linear refuses to be written into a state_dict: its int8 weights would not load back into a GPT).
Every reader of `.weight` (insight/'s composition scores, attention internals, the finite check) reads the
dequantized weight, in the scales' dtype: the numbers that run.
"""
from __future__ import annotations

import ctypes
import functools
import time
import warnings
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.errors import UserError
from model import int8_matvec
from model.packed import PackedLinear, kernels_here
from model.timing import best_seconds

QUANTIZE_MODES = ("int8", "int8-dynamic")
MODE_TEXT = {"int8": "int8 weights, bfloat16 activations",
             "int8 digits": "int8 weights, activations as two int8 digits per token (16 bits)",
             "int8-dynamic": "int8 weights, int8 activations quantized per token at run time"}
INT8_MAX = 127  # symmetric: -127..127, so that -W quantizes to exactly -q
KERNEL_IN_MULTIPLE = 16  # _weight_int8pack_mm's AVX-512 loop reads rows 16 values at a time, no tail
FBGEMM_SMALLEST_SCALE = 6.1e-5  # FBGEMM never quantizes with a finer step (float16's smallest normal number)
NATIVE_LEVELS = 256  # native/int8_matvec.c's digits: 8 bits each, its int32 sums exact on every CPU (no saturation)
NATIVE_DTYPES = (torch.float32, torch.bfloat16)  # the rows it reads and writes
NATIVE_TIMING_ROUNDS = 5  # interleaved rounds of one pass over the block matmuls, each kernel (model/timing.py)
HEAD_TIMING_ROUNDS = 5  # interleaved rounds of HEAD_TIMING_CALLS calls of each head kernel (model/timing.py)
HEAD_TIMING_CALLS = 3


def quantize_per_channel(weight: torch.Tensor, scale_dtype: torch.dtype = torch.float32
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (out, in) float -> (int8 (out, in), scales (out,) in scale_dtype): symmetric per-row quantization,
    q = round(w / s) with s = max|row| / 127, so |q * s - w| <= s / 2 entry by entry. The scale is rounded up
    when stored in a narrower dtype (no entry then needs clamping); an all-zero row gets scale 1 (q = 0, exactly
    zero again, never a division by 0). Computed in float32 whatever the weight's dtype."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_per_channel takes a (out, in) weight, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / INT8_MAX  # (out,)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # zero rows (and underflowing ones): 1
    stored = scales.to(scale_dtype)
    stored = torch.where(stored.float() < scales, torch.nextafter(stored, torch.full_like(stored, float("inf"))),
                         stored)  # rounded up: max|row| / stored <= 127
    q = torch.round(w / stored.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)  # (out, in)
    return q, stored


def quantize_rows(x: torch.Tensor, levels: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, in) float -> (uint8 (N, in), scales float32 (N, 1), zero points int32 (N, 1)): each row on its own
    `levels` levels (codes 0 .. levels - 1) over [min(row, 0), max(row, 0)], x ~ (q - zero) * scale; an all-zero
    row gets scale 1."""
    top = levels - 1
    x = x.float()
    low = x.amin(dim=1, keepdim=True).clamp(max=0.0)  # (N, 1)
    high = x.amax(dim=1, keepdim=True).clamp(min=0.0)
    scales = (high - low) / top
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.round(-low / scales).clamp(0, top)  # the code of 0.0
    q = (torch.round(x / scales) + zeros).clamp(0, top).to(torch.uint8)
    return q, scales, zeros.to(torch.int32)


def _onednn_int8_available() -> bool:
    """Whether this torch has oneDNN's int8 matmul (model.packed.onednn_available asks for its float one)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def _fbgemm_prepack(weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    """FBGEMM's packed form of a per-channel int8 weight (out, in) and its bias, for torch.ops.quantized.
    linear_dynamic (the bias added inside, in float32), or None where this torch has no FBGEMM (an ARM build) or
    no longer has the op. FBGEMM's own blocked layout, made for its one-row kernel, which with the activation's
    quantization inside the same call outran the oneDNN path at one row here (module doc)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines or not hasattr(torch.ops.quantized,
                                                                                 "linear_dynamic"):
        return None
    previous = torch.backends.quantized.engine
    try:
        with warnings.catch_warnings():
            # torch marks its quantized tensor type as deprecated; where it is gone, the except below falls back
            warnings.filterwarnings("ignore", message=".*quantize_per_tensor, torch.quantize_per_channel.*")
            weight = torch._make_per_channel_quantized_tensor(
                weight_int8, scales.double(), torch.zeros(weight_int8.shape[0], dtype=torch.long), 0)
            torch.backends.quantized.engine = "fbgemm"  # the packed object keeps its engine; the global is restored
            return torch.ops.quantized.linear_prepack(weight, None if bias is None else bias.float())
    except (RuntimeError, AttributeError):
        return None
    finally:
        torch.backends.quantized.engine = previous


DIGIT_KERNEL = "linear_with_input_q_dq_qweight_dq_output_fp32"  # FBGEMM's int8 product on codes we give it
FLOAT32_TINY = torch.finfo(torch.float32).tiny  # an all-zero row's digit scale: its digits are then all 0


PROBE_WIDTH = 64  # in_features of the saturation probe: 32 pairs of products, each pair 2 x 255 x 127 at worst


def _probe_weight() -> torch.Tensor:
    """The saturation probes' weight: every entry 127, (8, PROBE_WIDTH) int8."""
    return torch.full((8, PROBE_WIDTH), INT8_MAX, dtype=torch.int8)


def _sums_exactly(y: torch.Tensor, exact: float) -> bool:
    """Whether a probe's every output is its exact sum (float32's rounding of the scales aside)."""
    return bool(((y - exact).abs() <= 1e-4 * exact).all())


def _one_row_kernels_exact(levels: int) -> bool:
    """Whether the one-row int8-dynamic kernel this torch would run (FBGEMM's, else oneDNN's; Int8Linear's
    order) gives the exact product on the worst case for `levels`-level activations: every code at its top,
    every weight 127. A kernel that raises on this CPU counts as not exact; with neither kernel there is
    nothing to saturate."""
    top = levels - 1
    weight = _probe_weight()
    exact = float(PROBE_WIDTH * top * INT8_MAX)  # with unit scales and zero points 0
    try:
        fbgemm = _fbgemm_prepack(weight, torch.ones(8), None)
        if fbgemm is not None:
            # a row of ones lies on [0, 1]: scale 1 / top, every code top; the product comes back times that scale
            y = torch.ops.quantized.linear_dynamic(torch.ones(1, PROBE_WIDTH), fbgemm, levels < 256) * top
        elif _onednn_int8_available():
            y = torch.ops.onednn.qlinear_pointwise.tensor(
                torch.full((1, PROBE_WIDTH), top, dtype=torch.uint8), torch.tensor(1.0), torch.tensor(0),
                torch.ops.onednn.qlinear_prepack(weight, None), torch.ones(8), torch.zeros(8, dtype=torch.long),
                None, 1.0, 0, torch.float32, "none", [], "")
        else:
            return True
    except RuntimeError:
        return False
    return _sums_exactly(y, exact)


@functools.cache
def activation_levels() -> int:
    """The levels int8-dynamic quantizes each activation row to on this machine: 256 where its one-row kernels
    sum u8 x s8 products exactly, 128 where 256 saturates them (module doc). Measured once, on the first
    int8-dynamic layer."""
    return 256 if _one_row_kernels_exact(256) else 128


def _digit_kernel_exact(levels: int) -> bool:
    """Whether FBGEMM's int8 product on given codes (DIGIT_KERNEL) is exact here for `levels`-level digits on the
    worst case: every digit at its top (code levels - 1), every weight 127. False where this torch lacks FBGEMM
    or the op, or the op raises."""
    top_digit = levels // 2 - 1
    weight = _probe_weight()
    packed = _fbgemm_prepack(weight, torch.ones(8), None)
    if packed is None or not hasattr(torch.ops.quantized, DIGIT_KERNEL):
        return False
    try:
        y = getattr(torch.ops.quantized, DIGIT_KERNEL)(torch.full((1, PROBE_WIDTH), float(top_digit)), 1.0,
                                                       levels // 2, packed)
    except RuntimeError:
        return False
    exact = float(PROBE_WIDTH * top_digit * INT8_MAX)
    return _sums_exactly(y, exact)


@functools.cache
def digit_levels() -> int | None:
    """The codes of weight-only int8's activation digits on this machine (module doc): 256 where FBGEMM's
    product sums them exactly, 128 where 256 saturate it, None where neither is exact or there is no FBGEMM
    (then _weight_int8pack_mm or F.linear take every row). Measured once, on the first int8 layer."""
    for levels in (256, 128):
        if _digit_kernel_exact(levels):
            return levels
    return None


def split_digits(rows: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (N, in) -> (digits (2N, in) float32: N rows of h, then N rows of (u - h) * B; scales (N, 1) float32),
    with u = rows / scales in [-D, D] (module doc: D = levels / 2 - 1, B = 2D, scale = max|row| / D), so that
    rows ~ scales * (h + round((u - h) * B) / B). The second digits are left unrounded: the kernel rounds them to
    its codes. An all-zero row gets scale float32's smallest normal number (its digits are then all 0)."""
    # max|row| as abs then amax (exact in any float dtype): ~10x faster on a CPU than the inf-norm's reduction,
    # 12 against 97 us for 25 rows of 3072 (a prefill's fc_out input)
    scales = rows.abs().amax(dim=1, keepdim=True).float()
    scales = scales.div_(levels // 2 - 1).clamp_min_(FLOAT32_TINY)  # (N, 1)
    u = rows / scales  # float32 (N, in)
    h = torch.round(u)
    return torch.cat([h, u.sub_(h).mul_(levels - 2)]), scales


@functools.cache
def one_row_kernels_usable() -> bool:
    """Whether the one-row kernels are exact at activation_levels() (a kernel that is not, even at 7 bits, is
    never used: torch._int_mm, exact in int32, takes every row instead)."""
    return activation_levels() == 256 or _one_row_kernels_exact(128)


class Int8Linear(nn.Module):
    """y = x W^T + b with W held as int8 (out, in) and per-output-channel scales (out,); mode "int8" (weight-only)
    or "int8-dynamic" (activations quantized per row too). Module doc: kernels and numbers."""

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 mode: str = "int8"):
        super().__init__()
        if mode not in QUANTIZE_MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(QUANTIZE_MODES)}")
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2 or scales.shape != weight_int8.shape[:1]:
            raise ValueError(f"Int8Linear takes an int8 (out, in) weight and (out,) scales, got "
                             f"{weight_int8.dtype} {tuple(weight_int8.shape)} and {tuple(scales.shape)}")
        self.mode = mode
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8.contiguous())  # (out, in)
        self.register_buffer("scales", scales)  # (out,), the dtype `weight` is read in
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # the kernels' own copies of the scales: buffers, so compiled code reads them as the module's tensors
        self.register_buffer("scales_bf16", scales.to(torch.bfloat16), persistent=False)
        self.register_buffer("scales_f32", scales.float(), persistent=False)
        self._onednn_weight = None  # int8-dynamic: oneDNN's packed weight (an opaque mkldnn tensor, not a buffer)
        self._native = None  # int8: native/int8_matvec.c for one row (model/int8_matvec.py), where use_native_kernel
        # turned it on
        self._fbgemm_weight = None  # FBGEMM's packed weight (an opaque object, not a buffer), without the bias for int8
        if mode == "int8" and weight_int8.device.type == "cpu" and digit_levels() is not None:
            self.levels = digit_levels()
            self._digit_op = getattr(torch.ops.quantized, DIGIT_KERNEL)  # looked up once, not at every call
            self._digit_sum = torch.tensor([[1.0, 1.0 / (self.levels - 2)]])  # (1, 2): a step's two digits, summed
            # a decode step's two digit rows (2, in), written in place at every one-row call (a layer runs one call at a
            # time), and its two rows as views
            self._digit_rows = torch.empty(2, self.in_features)
            self._first_digit, self._second_digit = self._digit_rows[0:1], self._digit_rows[1:2]
            # the one-row step's two multipliers as float32 tensors: a Python number given to mul is wrapped into a
            # new tensor and cast at every call, ~1.5 us each here (a layer runs one call at a time)
            self._inverse_scale = torch.zeros(())  # 1 / the row's scale, filled at every one-row call
            self._digit_base = torch.tensor(float(self.levels - 2))  # B
            self._bias_row = None if bias is None else bias.detach().float().reshape(1, -1)  # (1, out), added after
            self._fbgemm_weight = _fbgemm_prepack(self.weight_int8, self.scales_f32, None)
        if mode == "int8-dynamic":
            # sum_k q_nk per output channel (out,): the zero point's share of the integer product
            self.register_buffer("row_sums", weight_int8.sum(dim=1, dtype=torch.int32), persistent=False)
            self.levels = activation_levels()
            if weight_int8.device.type == "cpu" and one_row_kernels_usable():
                self._fbgemm_weight = _fbgemm_prepack(self.weight_int8, self.scales_f32, self.bias)
                if self._fbgemm_weight is None and _onednn_int8_available():
                    self._onednn_weight = torch.ops.onednn.qlinear_prepack(self.weight_int8, None)
                    self.register_buffer("zero_points", torch.zeros(self.out_features, dtype=torch.long),
                                         persistent=False)  # the weights' (symmetric: 0)

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str = "int8") -> "Int8Linear":
        """`linear`'s weight quantized per channel (the scales in its dtype), its bias kept as it is."""
        q, scales = quantize_per_channel(linear.weight, scale_dtype=linear.weight.dtype)
        return cls(q, scales, linear.bias, mode=mode)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight q * s (out, in) in the scales' dtype: what insight/ and every other reader of
        `.weight` sees, the numbers that run (read-only: a new tensor at every read)."""
        return self.dequantized(self.scales.dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight_int8.to(dtype) * self.scales.to(dtype)[:, None]  # (out, in)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"mode={self.mode}")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise UserError(f"{prefix.rstrip('.') or 'this layer'} is int8-quantized (model.quantize), for inference "
                        f"only: a quantized model is never saved; save the float model instead")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out) in x's dtype."""
        if self._native is not None and x.numel() == self.in_features and not x.requires_grad \
                and not torch.compiler.is_compiling():  # the kernel writes its output outside autograd
            return self._native_row(x)
        if self._fbgemm_weight is not None and not torch.compiler.is_compiling():
            if self.mode == "int8":
                if x.numel() == self.in_features and not x.requires_grad:  # out= writes take no part in autograd
                    return self._digit_row(x)
                return self._digits(x)
            if x.numel() == self.in_features:
                return self._dynamic_row(x)
        return self.run(x, one_row_kernels=not torch.compiler.is_compiling())

    def one_row_kernel(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What forward runs for one row (x.numel() == in_features) that takes no gradient, outside compiled code:
        for a caller that runs many such rows and looks it up once (model/decode.py's flat decode step); None where
        forward has no kernel of its own for a row (no FBGEMM here)."""
        if self._native is not None:
            return self._native_row
        if self._fbgemm_weight is None:
            return None
        return self._digit_row if self.mode == "int8" else self._dynamic_row

    def use_native_kernel(self, lib: ctypes.CDLL | None) -> bool:
        """Weight-only int8: run single rows on native/int8_matvec.c, loaded as lib (native/build.py:
        int8_matvec_library), or with None no more; whether it is on after the call (never for int8-dynamic, or
        for a layer wider than the kernel's exact sums allow). The kernel's packed copy of the weight is made
        here, and dropped with None."""
        if lib is None or self.mode != "int8" or self.in_features > int8_matvec.MAX_IN_FEATURES \
                or self.weight_int8.device.type != "cpu":
            self._native = None
            return False
        self._native = int8_matvec.Int8Matvec(lib, self.weight_int8, self.scales_f32, self.bias, NATIVE_LEVELS)
        return True

    def _native_row(self, x: torch.Tensor) -> torch.Tensor:
        """One row on native/int8_matvec.c: the digits at 8 bits each (its sums are exact in int32 on any
        CPU), from a CPU row of float32 or bfloat16; a row of any other dtype (or device) as _digit_row or run
        take it."""
        if x.dtype in NATIVE_DTYPES and x.device.type == "cpu":
            return self._native(x.contiguous())  # a row of a decode step is contiguous already: no copy
        return self._row_without_native(x)

    def _row_without_native(self, x: torch.Tensor) -> torch.Tensor:
        """One row as weight-only int8 runs it without native/int8_matvec.c: FBGEMM's digits, else run()."""
        if self._fbgemm_weight is not None:
            return self._digit_row(x)
        return self.run(x, one_row_kernels=True)

    def _dynamic_row(self, x: torch.Tensor) -> torch.Tensor:
        """int8-dynamic for one token (a batch-1 decode step), with as little Python as can be, ~50 of them a token:
        FBGEMM quantizes the row (its min/max, 0 included, over 256 levels), multiplies, adds the bias
        (reduce_range True: 128 levels, where 256 saturate this CPU's kernel: activation_levels)."""
        return torch.ops.quantized.linear_dynamic(x.float(), self._fbgemm_weight, self.levels < 256).to(x.dtype)

    def _digit_row(self, x: torch.Tensor) -> torch.Tensor:
        """_digits for one row (a decode step, ~50 of them a token), in as few ops and as little Python as can be:
        each op costs a few microseconds here and more after the weights a matmul streamed have emptied the caches,
        beside ~70 for the product. The two digit rows are written in place into self._digit_rows."""
        row = x.reshape(1, self.in_features).float()  # (1, in); float32 first: u computed in bfloat16 would lose bits
        low, high = torch.aminmax(row)  # max|row| = max(-min, max): one reduction, faster here than the inf-norm
        # at least float32's smallest normal number, so that 1 / scale is finite: an all-zero row's digits are 0
        scale = max(max(-float(low), float(high), 0.0) / (self.levels // 2 - 1), FLOAT32_TINY)
        first, second = self._first_digit, self._second_digit  # (1, in) each
        torch.mul(row, self._inverse_scale.fill_(1.0 / scale), out=second)  # u = row / s, |u| <= D
        torch.round(second, out=first)  # h
        second.sub_(first).mul_(self._digit_base)  # (u - h) x B, |.| <= D: what is left, whichever way a tie rounds
        products = self._digit_op(self._digit_rows, 1.0, self.levels // 2, self._fbgemm_weight)  # (2, out): W h, W l
        y = (torch.mm(self._digit_sum, products).mul_(scale) if self._bias_row is None
             else torch.addmm(self._bias_row, self._digit_sum, products, alpha=scale))  # (1, out)
        y = y if x.dtype == torch.float32 else y.to(x.dtype)
        # back to x's leading dims, all ones: a decode step's (1, 1, in) by unsqueeze, ~1 us against 2-3 for view's
        # parsing of a size
        return y.unsqueeze(0) if x.dim() == 3 else y.view(*x.shape[:-1], self.out_features)

    def _digits(self, x: torch.Tensor) -> torch.Tensor:
        """Weight-only int8 on FBGEMM: each row of x as two int8 digits, all in one product (module doc). The
        kernel gets the digits themselves at scale 1 (h exactly, and (u - h) x B, which it rounds to l) and a weight
        packed without the bias: y = s (W h + W l / B) + b, each row's scale and the bias applied after. forward
        sends a single row that takes no gradient to _digit_row instead, and every other input here."""
        rows = x.reshape(-1, self.in_features)
        digits, scales = split_digits(rows, self.levels)  # (2N, in), (N, 1)
        products = self._digit_op(digits, 1.0, self.levels // 2, self._fbgemm_weight)  # (2N, out): W h, W l
        n = rows.shape[0]
        y = torch.add(products[:n], products[n:], alpha=1.0 / (self.levels - 2)).mul_(scales)  # W (h + l / B) s
        if self._bias_row is not None:
            y = y.add_(self._bias_row)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def run(self, x: torch.Tensor, one_row_kernels: bool) -> torch.Tensor:
        """forward without FBGEMM's fast path; one_row_kernels=False runs what compiled code runs (neither one-row
        int8-dynamic kernel: Inductor lowers neither), which model.generate times when deciding on a compile."""
        if self.mode == "int8-dynamic":
            y = self._dynamic(x.reshape(-1, self.in_features), one_row_kernels)
            y = y.view(*x.shape[:-1], self.out_features)
        elif x.device.type == "cpu" and x.dtype == torch.bfloat16:
            rows = x.reshape(-1, self.in_features).contiguous()  # (N, in): the kernel takes 2-D rows
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales_bf16)  # (N, out)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            return F.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _dynamic(self, rows: torch.Tensor, one_row_kernels: bool) -> torch.Tensor:
        """rows (N, in) -> (N, out) in rows' dtype, each row's activations quantized on its own (module doc)."""
        q, scales, zeros = quantize_rows(rows, self.levels)  # (N, in) uint8, (N, 1), (N, 1)
        out_dtype = rows.dtype if rows.dtype in (torch.float32, torch.bfloat16) else torch.float32
        if rows.device.type != "cpu":  # the same numbers without an int8 kernel: dequantize both sides
            y = F.linear((q.float() - zeros) * scales, self.dequantized(torch.float32))
        elif one_row_kernels and rows.shape[0] == 1 and self._onednn_weight is not None:
            # one token: its scale is a per-tensor scale, which oneDNN applies inside the kernel
            y = torch.ops.onednn.qlinear_pointwise.tensor(
                q, scales.reshape(()), zeros.reshape(()), self._onednn_weight, self.scales_f32, self.zero_points,
                None, 1.0, 0, out_dtype, "none", [], "")
        else:
            # (N, out) int32: sum_k q_x,k q_nk. torch._int_mm leaves its output unwritten for a single input
            # feature (torch 2.13 on an AVX512-VNNI CPU): there the one product per entry is taken as it is
            products = (torch._int_mm(q, self.weight_int8.t()) if self.in_features > 1
                        else q.int() * self.weight_int8.t().int())
            y = (products - zeros * self.row_sums).float() * (scales * self.scales_f32)  # exact until the float
        return y.to(rows.dtype)


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())


def quantization_of(model: nn.Module) -> str | None:
    """The description quantize_int8 returned for `model`, None for a float model."""
    return model.__dict__.get("_quantization") if is_quantized(model) else None


def _head_seconds(model: nn.Module, candidate: Int8Linear, clock: Callable[[], float]) -> tuple[float, float]:
    """(float head, int8 head) seconds per call on one row (1, 1, d_model) in the model's dtype, in interleaved
    rounds (model/timing.py). The float head at its fastest here: as a decode step runs it (GPT.logits: on a CPU
    the column-major head), or on each kernel sample.py's pack_linears may give a float head it left alone
    (model/packed.py: oneDNN-packed, ATen's matrix-vector kernel), where one times faster. Each head is timed after a pass over the block
    matmuls, as in a decode step, whose weights push the head out of the cache (a head called again and again
    would be timed from the cache); the pass timed alone beside them is taken off."""
    device, dtype = model.tok_emb.weight.device, model.tok_emb.weight.dtype
    row = torch.randn(1, 1, candidate.in_features, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    block_layers = [getattr(parent, attr) for _, parent, attr in model.matmul_slots()[:-1]]
    block_rows = [torch.randn(1, 1, layer.in_features, generator=torch.Generator().manual_seed(i + 1)).to(device, dtype)
                  for i, layer in enumerate(block_layers)]

    def blocks():  # the weights a decode step reads before its head
        for layer, x in zip(block_layers, block_rows):
            layer(x)

    heads = {"float": lambda: model.logits(row), "int8": lambda: candidate(row)}
    for kernel in kernels_here(dtype)[1:]:  # what pack_linears may give the head (quantize_int8 takes CPU models only)
        prepared = PackedLinear(model.lm_head, kernel)  # a copy for the timing only (none for matvec without a bias)
        heads[f"float {kernel}"] = lambda prepared=prepared: prepared(row)
    kernels = {"blocks": blocks, **{name: (lambda head=head: (blocks(), head())) for name, head in heads.items()}}
    with torch.no_grad():
        for name, head in heads.items():  # first calls make the copies, outside the warm-up best_seconds times
            if name != "int8":
                head()
        seconds = best_seconds(kernels, rounds=HEAD_TIMING_ROUNDS, calls=HEAD_TIMING_CALLS, clock=clock)
    head_s = {name: max(0.0, seconds[name] - seconds["blocks"]) for name in heads}
    return min(time_s for name, time_s in head_s.items() if name != "int8"), head_s["int8"]


def _native_seconds(layers: list[Int8Linear], dtype: torch.dtype, clock: Callable[[], float]) -> tuple[float, float]:
    """(native/int8_matvec.c, the one-row path without it) seconds for one pass over `layers` in turn at
    one row (1, 1, in) of `dtype`, as a decode step calls them, in interleaved rounds (model/timing.py). Without
    it a row goes where _row_without_native sends it."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(1, 1, layer.in_features, generator=generator).to(dtype) for layer in layers]
    native = [layer._native_row for layer in layers]
    other = [layer._row_without_native for layer in layers]

    def one_pass(kernels):
        return lambda: [kernel(x) for kernel, x in zip(kernels, rows)]
    with torch.no_grad():
        seconds = best_seconds({"native": one_pass(native), "other": one_pass(other)}, rounds=NATIVE_TIMING_ROUNDS,
                               calls=1, clock=clock)
    return seconds["native"], seconds["other"]


def _choose_native_kernel(layers: list[Int8Linear], dtype: torch.dtype, clock: Callable[[], float],
                          lib: ctypes.CDLL | None) -> tuple[ctypes.CDLL | None, str]:
    """Turn native/int8_matvec.c (lib) on for every layer where it times faster over them all than their one-row
    path without it, off everywhere else; (lib where on else None, what was measured, for quantize_int8's
    description)."""
    if lib is None or not all(layer.use_native_kernel(lib) for layer in layers):
        for layer in layers:
            layer.use_native_kernel(None)
        why = "not built here (no C compiler, or ATTNGPT_NATIVE_KERNELS=0)" if lib is None else "too wide a layer"
        return None, f"; single rows without attngpt's int8 kernel: {why}"
    native_s, other_s = _native_seconds(layers, dtype, clock)
    on = native_s < other_s
    if not on:
        for layer in layers:
            layer.use_native_kernel(None)
    native = f"attngpt's int8 kernel ({'AVX512-VNNI' if lib.attngpt_int8_matvec_vnni() else 'portable C'})"
    other = "FBGEMM's digits" if layers[0]._fbgemm_weight is not None else "torch's kernels"
    kept, left = ((native, native_s), (other, other_s)) if on else ((other, other_s), (native, native_s))
    return lib if on else None, (f"; single rows on {kept[0]}, timed over the block matmuls at one row: "
                                 f"{kept[1] * 1e3:.3g} ms against {left[1] * 1e3:.3g} for {left[0]}")


def quantize_int8(model: nn.Module, mode: str = "int8", lm_head: bool | None = None,
                  clock: Callable[[], float] | None = None, int8_kernel: ctypes.CDLL | None = None) -> str:
    """Replace, in place, each block's qkv_proj, out_proj, fc_in and fc_out (nn.Linear) of the GPT `model` by
    an Int8Linear of `mode`, and the LM head too when lm_head is True; None: only where int8 measured faster
    on one row here (`clock`: time.perf_counter unless a test stands in its own). int8_kernel: native/
    int8_matvec.c loaded (native/build.py: int8_matvec_library), for weight-only int8's single rows where it
    times faster than FBGEMM's path; None: torch's kernels only. Returns a one-line description of what was
    done. For inference on a CPU only (module doc); a bad request raises UserError before any layer is
    changed."""
    if mode not in QUANTIZE_MODES:
        raise UserError(f"quantize mode {mode!r} is not known: use {' or '.join(QUANTIZE_MODES)}")
    device = model.tok_emb.weight.device
    if device.type != "cpu":
        raise UserError(f"--quantize {mode} runs on a CPU only (torch's int8 kernels used here are CPU kernels), "
                        f"the model is on {device}: drop --quantize, or use --device cpu")
    if is_quantized(model):
        raise UserError("the model is already quantized: quantize a float model once")
    targets = model.matmul_slots()[:-1]  # each block's four; the LM head is the last slot
    head_possible = lm_head is not False and isinstance(model.lm_head, nn.Linear)
    checked = targets + ([("lm_head", model, "lm_head")] if head_possible else [])
    for name, parent, attr in checked:  # every layer checked before any is replaced (or allocated)
        layer = getattr(parent, attr)
        if not isinstance(layer, nn.Linear):
            raise UserError(f"{name} is a {type(layer).__name__}, not an nn.Linear: only a float GPT is quantized")
        if mode == "int8" and layer.in_features % KERNEL_IN_MULTIPLE:
            raise UserError(f"--quantize int8 cannot take {name}: its in_features {layer.in_features} is not a "
                            f"multiple of {KERNEL_IN_MULTIPLE}, which torch's int8 weight kernel needs; use "
                            f"--quantize int8-dynamic (any shape), or drop --quantize")
    for _, parent, attr in targets:
        setattr(parent, attr, Int8Linear.from_linear(getattr(parent, attr), mode))
    native, kernel_note = None, ""
    if mode == "int8":
        native, kernel_note = _choose_native_kernel([getattr(parent, attr) for _, parent, attr in targets],
                                                    model.tok_emb.weight.dtype, clock or time.perf_counter,
                                                    int8_kernel)
    head_note = "LM head float (not asked for)"
    if head_possible:
        candidate = Int8Linear.from_linear(model.lm_head, mode)
        candidate.use_native_kernel(native)  # the blocks' kernel, for the timing below and after
        if lm_head is None:
            float_s, int8_s = _head_seconds(model, candidate, clock or time.perf_counter)
            lm_head = int8_s < float_s
            head_note = (f"LM head {'int8' if lm_head else 'float'} (measured on one row after the blocks: int8 "
                         f"{int8_s * 1e3:.3g} ms, float {float_s * 1e3:.3g} ms)")
        else:
            head_note = "LM head int8 (asked for)"
        if lm_head:
            model.lm_head = candidate  # a tied head's own int8 copy: tok_emb stays float
    mode_text = MODE_TEXT[mode]
    if mode == "int8" and digit_levels() == 256:
        mode_text = MODE_TEXT["int8 digits"]
    elif mode == "int8" and digit_levels() == 128:
        mode_text = MODE_TEXT["int8 digits"].replace("(16 bits)",
                                                     "(14 bits: this CPU's int8 kernel saturates on 8-bit digits)")
    elif mode == "int8" and model.tok_emb.weight.dtype != torch.bfloat16:
        # no FBGEMM here: only a bfloat16 row has an int8 kernel (_weight_int8pack_mm)
        mode_text = ("int8 weights dequantized at every matmul, slower than the float model: this torch has no "
                     "FBGEMM, so only --dtype bfloat16 has an int8 kernel")
    elif mode == "int8-dynamic" and activation_levels() < 256:
        mode_text += f" on {activation_levels()} levels (this CPU's int8 kernels saturate on 256)"
    description = f"{mode} ({mode_text}; per-channel scales) in {len(targets)} block matmuls, {head_note}{kernel_note}"
    model.__dict__["_quantization"] = description
    return description

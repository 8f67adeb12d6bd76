"""Linear layers whose weights are prepared for one-row CPU inference: faster decoding, the same Parameters.

Decoding one token at a time is a chain of matrix-vector products: every weight matrix is read once per token
and each element is used once. torch's F.linear reads the (out, in) row-major weight as it is stored, through
oneDNN's matmul on a CPU build that has it. Two other kernels can read it faster at one row, each on a copy made
once and kept until the weight changes:

    oneDNN-packed   oneDNN reorders the weight once into its own blocked layout, made for the vector units it runs
                    on, and multiplies by it for every token (torch.ops.mkldnn._linear_pointwise), at any number
                    of rows.
    matvec          ATen's own matrix-vector kernel (torch.mv), which on a build with oneDNN only runs while
                    oneDNN is switched off (torch._C._set_mkldnn_enabled, around that one call: with it on, torch.mv
                    goes to oneDNN's kernel too). For bfloat16 it is a dot product per output row with float32
                    accumulation, threaded over the rows, and streams the row-major weight near the memory's rate.
                    A layer with a bias multiplies by a copy of its weight with the bias appended as one more
                    column, (out, in + 1, padded to a multiple of MATVEC_ROW_MULTIPLE), against the row [x, 1, 0...]
                    held in a buffer of the layer's own: the bias is summed in float32 with the products and the
                    output rounded once, as oneDNN's kernel does (torch.addmv's bias path is another kernel, ~10x
                    slower in bfloat16). A layer without a bias multiplies by its weight itself: no copy. One row
                    only: any other input runs F.linear.

On GPT-2 small's 48 block matmuls and its LM head in bfloat16 at batch 1 on a 2-core AMD EPYC with AVX512-BF16,
F.linear took 17.5 ms, the oneDNN-packed chain 12.5 and the matvec one ~8.5 (benchmarks/RESULTS.md); in float32
oneDNN's packed kernel was the fastest there. Which is fastest depends on the CPU, the dtype and the torch build,
so `pack_linears` decides by timing the three on this machine, never by a rule of thumb; and it times what a
decode step does, each matmul layer once in turn, so that the weights come from memory as they do when decoding:
one layer called again and again sits in the cache. On a 2-core AVX2 EPYC (32 MiB L3) one cache-hot 2304 x 768
float32 layer timed 0.90-1.06x packed over F.linear, flipping the choice from run to run, while GPT-2 small's 48
block matmuls in turn were 1.29-1.33x faster packed every time.

A PackedLinear keeps the nn.Linear's own weight and bias Parameters, under the same names, so the state dict,
the insight code that reads `.weight` and anything that trains the model see what they saw before; the prepared
copy lives beside them (not in the state dict) and is made again whenever the weight (or, for matvec, the bias)
changes (its version counter moves on any in-place update). It is used only where it applies, a CPU tensor of the
weight's dtype with no gradient wanted, outside torch.compile (the compiler cannot trace oneDNN's opaque tensors,
nor a switch of a global flag); everywhere else the layer is plain F.linear on the same weight. The matvec
kernel's row buffer and the oneDNN switch make a layer's one-row call for one thread at a time, as a decode step
calls it; another thread running oneDNN at that moment runs ATen's kernels instead, the same numbers' way.

Which dtypes oneDNN packs depends on the CPU as well as the build: its bfloat16 path needs AVX-512 (BW, VL, DQ)
or AVX-NE-CONVERT and raises on a plain AVX2 machine. `onednn_packs(dtype)` finds out by packing and multiplying
a tiny weight once per dtype, and that kernel is not timed for a dtype it cannot pack.

Several rows (a prompt's prefill, a batch) at a matvec layer run F.linear on the weight as stored, which oneDNN
multiplies at ~2/3 the rate of its packed layout (GPT-2 small's 48 block matmuls at 32 rows in bfloat16: 24-31
against 16.5 ms); `pack_linears(rows_copy=True)` keeps a oneDNN-packed copy of each block weight for them too.

The cost: a second copy of every packed weight in memory (GPT-2 small in bfloat16: 250 MB more), for matvec of
every weight with a bias, and with rows_copy a third of each block weight (170 MB more).
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.timing import best_seconds



ONEDNN, MATVEC, PLAIN = "oneDNN-packed", "matvec", "F.linear"
KERNELS = (ONEDNN, MATVEC)  # what a PackedLinear can run at one row; PLAIN is what it runs everywhere else
MATVEC_ROW_MULTIPLE = 16  # a matvec weight with a bias column: rows padded to this many values (32 bytes in bfloat16)
NOTES = {PLAIN: "left to F.linear", ONEDNN: "prepacked for oneDNN",
         MATVEC: "on ATen's matrix-vector kernel at one row"}
PACKED_WEIGHTS_TEXT = {ONEDNN: ", oneDNN-packed weights", MATVEC: ", weights on ATen's matrix-vector kernel"}  # sample.py

# ATen's switch for oneDNN, the one torch.backends.mkldnn.flags sets, read and set directly: ~0.1 us a pair of calls,
# twice at every matvec call
_mkldnn_enabled = getattr(torch._C, "_get_mkldnn_enabled", None)
_set_mkldnn_enabled = getattr(torch._C, "_set_mkldnn_enabled", None)


def onednn_available() -> bool:
    """Whether this torch has the oneDNN linear kernels (a CPU build with mkldnn); onednn_packs asks this CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def matvec_available() -> bool:
    """Whether ATen's matrix-vector kernel can be asked for: the oneDNN switch exists (every torch since 1.x)."""
    return _mkldnn_enabled is not None and _set_mkldnn_enabled is not None


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies `dtype` weights on this machine: tried once on a 16 x 16 weight of
    ones (torch raises a RuntimeError where the CPU lacks the instructions), and the product checked."""
    if not onednn_available():
        return False
    ones = torch.ones(16, 16, dtype=dtype)
    try:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(ones, 1)
            product = torch.ops.mkldnn._linear_pointwise(ones[:1], packed, None, "none", [], "")
    except RuntimeError:
        return False
    return bool((product == 16).all())


def weight_key(weight: torch.Tensor) -> tuple:
    """What a copy derived from `weight` was made from: its storage, its version (moved by any in-place change) and
    its dtype. A copy whose key no longer matches is stale."""
    return weight.data_ptr(), weight._version, weight.dtype


def aten_matvec(weight: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """weight (out, in) @ vector (in,) -> (out,) on ATen's own kernel: oneDNN switched off for this call only, and
    the switch left as it was found."""
    enabled = _mkldnn_enabled()
    _set_mkldnn_enabled(False)
    try:
        return torch.mv(weight, vector)
    finally:
        _set_mkldnn_enabled(enabled)


class PackedLinear(nn.Module):
    """An nn.Linear's weight and bias (the same Parameters) with a copy of the weight prepared for `kernel` (one of
    KERNELS, module doc) for no-grad CPU calls: any number of rows for oneDNN-packed, one row for matvec, F.linear
    for everything else. in: (..., in_features) -> out: (..., out_features)."""

    def __init__(self, linear: nn.Linear, kernel: str = ONEDNN, rows_copy: bool = False):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r}: use one of {', '.join(KERNELS)}")
        self.kernel = kernel
        # matvec: several rows (a prompt's prefill, a batch) on a oneDNN-packed copy too, where oneDNN packs the
        # dtype (module doc); else they run F.linear
        self.rows_copy = rows_copy and kernel == MATVEC
        self._rows_packed: tuple[tuple, torch.Tensor] | None = None  # (the weight's key, oneDNN's copy)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: a tied LM head stays tied to the embedding
        self.bias = linear.bias
        self._packed: tuple[tuple, torch.Tensor] | None = None  # (what the copy was made from, the copy)
        # matvec with a bias: the row [x, 1, 0, ...] (in_features padded) the copy multiplies, and its first in_features
        self._row: torch.Tensor | None = None
        self._row_input: torch.Tensor | None = None

    def source_key(self, dtype: torch.dtype) -> tuple:
        """What a copy for an input of `dtype` is made from: the weight's key, and the bias's where the copy holds
        it (matvec); `_packed[0]` is compared with it at every call."""
        weight, bias = self.weight, self.bias
        key = (weight.data_ptr(), weight._version, dtype)
        if self.kernel == MATVEC and bias is not None:
            key += (bias.data_ptr(), bias._version)
        return key

    def packed_weight(self) -> torch.Tensor:
        """The weight prepared for the kernel, made again after any change to what it was made from: oneDNN's
        layout for a 1-row input (an opaque tensor: only oneDNN's kernels read it), or for matvec the weight with
        the bias as one more column (rows padded to MATVEC_ROW_MULTIPLE), the weight itself without a bias."""
        weight, bias = self.weight, self.bias
        key = self.source_key(weight.dtype)
        if self._packed is None or self._packed[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # plain tensors, even when made while generating
                if self.kernel == ONEDNN:
                    copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
                elif bias is None:
                    copy = weight.detach()
                else:
                    width = -(-(self.in_features + 1) // MATVEC_ROW_MULTIPLE) * MATVEC_ROW_MULTIPLE
                    copy = weight.new_zeros(self.out_features, width)  # (out, width): W, then b, then zeros
                    copy[:, :self.in_features] = weight.detach()
                    copy[:, self.in_features] = bias.detach().to(weight.dtype)
                    row = weight.new_zeros(width)  # (width,): x written at every call, then 1, then zeros
                    row[self.in_features] = 1
                    self._row, self._row_input = row, row[:self.in_features]
            self._packed = (key, copy)
        return self._packed[1]

    def rows_weight(self) -> torch.Tensor:
        """A matvec layer's oneDNN-packed copy for several rows (rows_copy), made again after any change to the
        weight (oneDNN adds the bias itself)."""
        weight = self.weight
        key = weight_key(weight)
        if self._rows_packed is None or self._rows_packed[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                self._rows_packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        return self._rows_packed[1]

    def rows_kernel_runs(self, dtype: torch.dtype, rows: int) -> bool:
        """Whether several rows of `dtype` go to the oneDNN-packed copy of a matvec layer (rows_copy)."""
        return self.rows_copy and rows > 1 and onednn_packs(dtype)

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        """One row, x (..., in) with x.numel() == in_features -> (..., out), on the matvec copy as it stands
        (packed_weight() makes it; forward checks it first, model/decode.py at every step)."""
        copy = self._packed[1]
        if self._row is None:
            y = aten_matvec(copy, x.reshape(self.in_features))
        else:
            self._row_input.copy_(x.reshape(self.in_features))  # the row buffer: [x, 1, 0...]
            y = aten_matvec(copy, self._row)
        return y.view(*x.shape[:-1], self.out_features)

    def kernel_runs(self, dtype: torch.dtype, rows: int) -> bool:
        """Whether the prepared kernel takes `rows` rows of `dtype` (a CPU input of the weight's dtype, no gradient):
        oneDNN where this CPU packs the dtype, matvec for a single row."""
        return onednn_packs(dtype) if self.kernel == ONEDNN else rows == 1 and matvec_available()

    def takes_prepared(self, x: torch.Tensor) -> bool:
        """Whether a prepared copy may take x at all: not being compiled, a CPU input of the weight's dtype, no
        gradient wanted (uses_packed and the rows copy add how many rows their kernel takes)."""
        weight = self.weight
        # the cheapest tests first: a decode step of GPT-2 small asks 49 times
        return (x.dtype == weight.dtype and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                and x.device.type == "cpu" and weight.device.type == "cpu")

    def uses_packed(self, x: torch.Tensor) -> bool:
        """The prepared kernel applies: takes_prepared, and kernel_runs."""
        return self.takes_prepared(x) and self.kernel_runs(x.dtype, x.numel() // self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed
        # a decode step's call, in the fewest checks (49 calls a token for GPT-2 small): not compiling (first: the
        # compiler cannot trace the comparison of data pointers below, and would break its graph at every layer), a
        # copy made from this very weight (and bias) as it is now, of x's dtype (so a CPU weight of a dtype this CPU
        # packs), no gradient, one row for matvec
        if packed is not None and not torch.compiler.is_compiling() and x.device.type == "cpu" \
                and not torch.is_grad_enabled() and packed[0] == self.source_key(x.dtype):
            if self.kernel == ONEDNN:
                return torch.ops.mkldnn._linear_pointwise(x, packed[1], self.bias, "none", [], "")
            if x.numel() == self.in_features:
                return self.matvec(x)
        if not self.uses_packed(x):
            if self.rows_kernel_runs(x.dtype, x.numel() // self.in_features) and self.takes_prepared(x):
                return torch.ops.mkldnn._linear_pointwise(x, self.rows_weight(), self.bias, "none", [], "")
            return F.linear(x, self.weight, self.bias)
        copy = self.packed_weight()
        if self.kernel == ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, copy, self.bias, "none", [], "")
        return self.matvec(x)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}{', rows_copy=True' if self.rows_copy else ''}")


def packable_linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute name) of every nn.Linear pack_linears may replace: the matmul layers of
    GPT.matmul_slots (each block's q|k|v, out, MLP in and out projections, and the LM head)."""
    return [(parent, attr) for _, parent, attr in model.matmul_slots() if isinstance(getattr(parent, attr), nn.Linear)]


TIMED_BYTES = 512 * 2**20  # the layers timed in turn: at most this many bytes of weights (all of a small model's),
# more than a CPU's last-level cache, so that they stream from memory as in a decode step
TIMING_ROUNDS, TIMING_CALLS = 3, 2  # interleaved rounds of passes over the timed layers (model/timing.py)


def weight_bytes(layer: nn.Linear) -> int:
    return layer.weight.numel() * layer.weight.element_size()


def layers_to_time(layers: list[nn.Linear]) -> list[nn.Linear]:
    """The first of `layers` whose weights add up to TIMED_BYTES (at least one layer; all of them when smaller)."""
    chosen, total = [], 0
    for layer in layers:
        if chosen and total >= TIMED_BYTES:
            break
        chosen.append(layer)
        total += weight_bytes(layer)
    return chosen


def kernels_here(dtype: torch.dtype) -> list[str]:
    """The kernels a PackedLinear of `dtype` can run on this machine, F.linear first (always)."""
    return [PLAIN] + ([ONEDNN] if onednn_packs(dtype) else []) + ([MATVEC] if matvec_available() else [])


def time_kernels(layers: list[nn.Linear], kernels: list[str], clock: Callable[[], float] = time.perf_counter
                 ) -> dict[str, float]:
    """Seconds of one pass over `layers`, each called once in turn on a row of its own, for each of `kernels`
    (PLAIN: F.linear; the others: a PackedLinear of that kernel), in interleaved rounds (model/timing.py). The
    copies made for the timing are dropped."""
    rows = [torch.randn(1, 1, layer.in_features, generator=torch.Generator().manual_seed(i)).to(layer.weight.dtype)
            for i, layer in enumerate(layers)]
    calls = {}
    for kernel in kernels:
        if kernel == PLAIN:
            calls[kernel] = lambda: [F.linear(x, layer.weight, layer.bias) for layer, x in zip(layers, rows)]
        else:
            prepared = [PackedLinear(layer, kernel) for layer in layers]
            calls[kernel] = lambda prepared=prepared: [layer(x) for layer, x in zip(prepared, rows)]
    with torch.no_grad():
        return best_seconds(calls, rounds=TIMING_ROUNDS, calls=TIMING_CALLS, clock=clock)


def pack_linears(model: nn.Module, kernel: str | None = None,
                 measure: Callable[[list[nn.Linear], list[str]], dict[str, float]] = time_kernels,
                 rows_copy: bool = False) -> str | None:
    """Replace the model's matmul layers (packable_linears) by PackedLinear of the kernel that measures fastest on
    this machine at one row, or leave them where F.linear does; returns a line saying what was timed and chosen,
    or None when nothing applies (not a CPU model, nothing left to prepare).
    kernel: PLAIN, ONEDNN or MATVEC takes that one without timing (tests, benchmarks); one this machine cannot run
    (kernels_here) is refused with a line saying why, the layers left as they are.
    measure: (the layers to time, layers_to_time; the kernels) -> seconds of one pass over them with each
    (time_kernels).
    rows_copy: where matvec is the kernel and oneDNN packs the dtype, keep a oneDNN-packed copy too, for the
    several rows of a prompt's prefill (module doc: one more copy of the weights in memory)."""
    targets = packable_linears(model)
    if not targets:
        return None
    layers = [getattr(parent, name) for parent, name in targets]
    first = layers[0]
    if first.weight.device.type != "cpu":
        return None
    here = kernels_here(first.weight.dtype)
    if kernel is None:
        timed = layers_to_time(layers)
        seconds = measure(timed, here)
        kernel = min(here, key=lambda name: seconds[name])
        megabytes = sum(map(weight_bytes, timed)) / 1e6
        times = ", ".join(f"{seconds[name] * 1e3:.3g} ms {'with F.linear' if name == PLAIN else name}"
                          for name in here)
        note = (f"matmul weights {NOTES[kernel]}: {len(timed)} layer{'s' if len(timed) > 1 else ''} in turn "
                f"({megabytes:.3g} MB) {times}")
    elif kernel not in here:
        dtype_name = str(first.weight.dtype).removeprefix("torch.")
        why = (f"oneDNN cannot pack {dtype_name} weights on this CPU" if kernel == ONEDNN
               else "this torch has no switch for oneDNN" if kernel == MATVEC else f"no kernel {kernel!r}")
        return f"matmul weights left to F.linear: {why}"
    else:
        note = f"matmul weights {NOTES[kernel]} (not timed)"
    rows_copy = rows_copy and kernel == MATVEC and onednn_packs(first.weight.dtype)
    if kernel != PLAIN:
        for parent, name in targets:
            # not the LM head: a prefill takes its logits at the last position only, one row
            packed = PackedLinear(getattr(parent, name), kernel, rows_copy=rows_copy and name != "lm_head")
            packed.packed_weight()  # now, not in the first token's time
            if packed.rows_copy:
                packed.rows_weight()
            setattr(parent, name, packed)
    return note + ("; several rows (a prefill) on a oneDNN-packed copy" if rows_copy else "")


def packing_of(model: nn.Module) -> str | None:
    """The kernel pack_linears gave the model's matmul layers (ONEDNN or MATVEC), None where it gave none."""
    return next((module.kernel for module in model.modules() if isinstance(module, PackedLinear)), None)


def is_packed(model: nn.Module) -> bool:
    """Whether pack_linears replaced the model's matmul layers."""
    return packing_of(model) is not None

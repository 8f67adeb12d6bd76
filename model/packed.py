"""Linear layers whose weights are prepacked for oneDNN: faster CPU inference, the same numbers.

Decoding one token at a time is a chain of matrix-vector products: every weight matrix is read once per token
and each element is used once. torch's F.linear reads the (out, in) row-major weight as it is stored; oneDNN
can first reorder a weight into its own blocked layout, made for the vector units it runs on, once, and then
multiply by it for every token. For GPT-2 small's 48 block matmuls and its LM head in bfloat16 at batch 1
on a 2-core AMD EPYC with AVX512-BF16, the prepacked chain took about half the time of F.linear's
(benchmarks/RESULTS.md). Whether it is faster depends on the CPU and the dtype, so `pack_linears` decides by
timing both ways on this machine, never by a rule of thumb; and it times what a decode step does, each matmul
layer once in turn, so that the weights come from memory as they do when decoding: one layer called again
and again sits in the cache. On a 2-core AVX2 EPYC (32 MiB L3) one cache-hot 2304 x 768 float32 layer timed
0.90-1.06x packed over F.linear, flipping the choice from run to run, while GPT-2 small's 48 block matmuls in
turn were 1.29-1.33x faster packed every time.

A PackedLinear keeps the nn.Linear's own weight and bias Parameters, under the same names, so the state dict,
the insight code that reads `.weight` and anything that trains the model see what they saw before; the packed
copy lives beside them (not in the state dict) and is rebuilt whenever the weight changes (its version counter
moves on any in-place update). It is used only where it applies, a CPU tensor of the packed dtype with no
gradient wanted, outside torch.compile (the compiler cannot trace oneDNN's opaque tensors); everywhere else
the layer is plain F.linear on the same weight.

Which dtypes oneDNN packs depends on the CPU as well as the build: its bfloat16 path needs AVX-512 (BW, VL, DQ)
or AVX-NE-CONVERT and raises on a plain AVX2 machine. `onednn_packs(dtype)` finds out by packing and multiplying
a tiny weight once per dtype, and a layer of a dtype it cannot pack is left to F.linear.

The cost: a second copy of every packed weight in memory (GPT-2 small in bfloat16: 250 MB more).
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.timing import best_seconds



def onednn_available() -> bool:
    """Whether this torch has the oneDNN linear kernels (a CPU build with mkldnn); onednn_packs asks this CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


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


class PackedLinear(nn.Module):
    """An nn.Linear's weight and bias (the same Parameters) with a oneDNN-packed copy of the weight for
    no-grad CPU calls. in: (..., in_features) -> out: (..., out_features)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: a tied LM head stays tied to the embedding
        self.bias = linear.bias
        self._packed: tuple[tuple, torch.Tensor] | None = None  # (the weight's identity and version, packed copy)

    def packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's layout for a 1-row input (an opaque tensor: only oneDNN's kernels read it),
        packed again after any change to the weight."""
        weight = self.weight
        key = weight_key(weight)
        if self._packed is None or self._packed[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # a plain tensor, even when made while generating
                self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        return self._packed[1]

    def uses_packed(self, x: torch.Tensor) -> bool:
        """The packed kernel applies: not being compiled, a CPU input of the weight's dtype, no gradient wanted, a
        dtype this CPU packs."""
        weight = self.weight
        # the cheapest tests first: a decode step of GPT-2 small asks 49 times
        return (x.dtype == weight.dtype and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                and x.device.type == "cpu" and weight.device.type == "cpu" and onednn_packs(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed, weight = self._packed, self.weight
        # a decode step's call, in the fewest checks (49 calls a token for GPT-2 small): not compiling (first: the
        # compiler cannot trace the comparison of data pointers below, and would break its graph at every layer), a
        # packed copy of this very weight as it is now, of x's dtype (so a CPU weight of a dtype this CPU packs), no
        # gradient
        if packed is not None and not torch.compiler.is_compiling() and x.device.type == "cpu" \
                and not torch.is_grad_enabled() and packed[0] == (weight.data_ptr(), weight._version, x.dtype):
            return torch.ops.mkldnn._linear_pointwise(x, packed[1], self.bias, "none", [], "")
        if not self.uses_packed(x):
            return F.linear(x, weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


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


def time_both_ways(layers: list[nn.Linear], clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Seconds of one pass over `layers`, each called once in turn on a row of its own, (F.linear, the packed
    kernel), in interleaved rounds (model/timing.py). The packed copies made for the timing are dropped."""
    rows = [torch.randn(1, 1, layer.in_features, generator=torch.Generator().manual_seed(i)).to(layer.weight.dtype)
            for i, layer in enumerate(layers)]
    packed = [PackedLinear(layer) for layer in layers]
    with torch.no_grad():
        seconds = best_seconds({"plain": lambda: [F.linear(x, layer.weight, layer.bias)
                                                  for layer, x in zip(layers, rows)],
                                "packed": lambda: [layer(x) for layer, x in zip(packed, rows)]},
                               rounds=TIMING_ROUNDS, calls=TIMING_CALLS, clock=clock)
    return seconds["plain"], seconds["packed"]


def pack_linears(model: nn.Module, force: bool | None = None,
                 measure: Callable[[list[nn.Linear]], tuple[float, float]] = time_both_ways) -> str | None:
    """Replace the model's matmul layers (packable_linears) by PackedLinear where that measures faster on this
    machine; returns a line saying what was timed and chosen, or None when nothing applies (not a CPU model,
    no oneDNN, nothing left to pack).
    force: True packs and False leaves the layers as they are, without timing (tests, benchmarks); a dtype this
    CPU cannot pack (onednn_packs) is never packed, whatever force says.
    measure: (the layers to time, layers_to_time) -> seconds of one pass over them with F.linear and packed
    (time_both_ways)."""
    targets = packable_linears(model)
    if not targets or not onednn_available():
        return None
    layers = [getattr(parent, name) for parent, name in targets]
    first = layers[0]
    if first.weight.device.type != "cpu":
        return None
    if not onednn_packs(first.weight.dtype):
        dtype_name = str(first.weight.dtype).removeprefix("torch.")
        return f"matmul weights left to F.linear: oneDNN cannot pack {dtype_name} weights on this CPU"
    if force is None:
        timed = layers_to_time(layers)
        plain_s, packed_s = measure(timed)
        force = packed_s < plain_s
        megabytes = sum(map(weight_bytes, timed)) / 1e6
        note = (f"matmul weights {'prepacked for oneDNN' if force else 'left to F.linear'}: {len(timed)} "
                f"layer{'s' if len(timed) > 1 else ''} in turn ({megabytes:.3g} MB) {plain_s * 1e3:.3g} ms with "
                f"F.linear, {packed_s * 1e3:.3g} ms packed")
    else:
        note = f"matmul weights {'prepacked for oneDNN' if force else 'left to F.linear'} (not timed)"
    if force:
        for parent, name in targets:
            packed = PackedLinear(getattr(parent, name))
            packed.packed_weight()  # now, not in the first token's time
            setattr(parent, name, packed)
    return note


def is_packed(model: nn.Module) -> bool:
    """Whether pack_linears replaced the model's matmul layers."""
    return any(isinstance(module, PackedLinear) for module in model.modules())

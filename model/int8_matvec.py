"""Weight-only int8 at one row on a kernel of our own, native/int8_matvec.c (the numbers, the layout and why are
in its header comment): what sample.py --quantize int8 runs for each matmul of a decode step where it times
faster than FBGEMM's path (model/quantize.py decides, by measuring). The library is built and loaded outside the
network (native/build.py) and handed in; here is the weight's packing and the call.
"""
from __future__ import annotations

import ctypes
import functools

import torch

ROWS_PER_BLOCK = 4  # the C file's layout: rows interleaved in blocks of 4 ...
CHUNK = 64  # ... in 64-byte chunks
MAX_IN_FEATURES = 65536  # 65536 x 255 x 127 < 2^31: the integer sums stay exact in int32


def pack(weight_int8: torch.Tensor) -> tuple[torch.Tensor, int]:
    """weight (out, in) int8 -> (the C file's layout, flat int8, padded_in): zero rows up to a multiple of 4, zero
    columns up to a multiple of 64, each block of 4 rows interleaved in 64-column chunks."""
    out_features, in_features = weight_int8.shape
    padded_out = -(-out_features // ROWS_PER_BLOCK) * ROWS_PER_BLOCK
    padded_in = -(-in_features // CHUNK) * CHUNK
    padded = torch.zeros(padded_out, padded_in, dtype=torch.int8)
    padded[:out_features, :in_features] = weight_int8
    blocks = padded.view(padded_out // ROWS_PER_BLOCK, ROWS_PER_BLOCK, padded_in // CHUNK, CHUNK)
    return blocks.permute(0, 2, 1, 3).contiguous().view(-1), padded_in  # (blocks, chunks, rows, 64)


class Int8Matvec:
    """One layer's int8 weight (out, in) packed for the kernel, with its per-row scales and bias: `(x)` takes one
    CPU row of float32 or bfloat16 (x.numel() == in_features, contiguous) -> y in x's dtype, x's leading shape."""

    def __init__(self, lib: ctypes.CDLL, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 levels: int):
        self.out_features, self.in_features = weight_int8.shape
        if self.in_features > MAX_IN_FEATURES:
            raise ValueError(f"in_features {self.in_features} > {MAX_IN_FEATURES}: the int32 sums would overflow")
        self.packed, padded_in = pack(weight_int8)
        self.row_sums = weight_int8.sum(dim=1, dtype=torch.int32)  # (out,): the digits' offset's share
        self.scales = scales.float().contiguous()  # (out,)
        self.bias = None if bias is None else bias.detach().float().contiguous()  # (out,)
        # every argument but the threads, the row and the output, in the C function's order: held here, so that
        # the pointers stay valid as long as this object
        self._call = functools.partial(
            lib.attngpt_int8_matvec, self.packed.data_ptr(), self.row_sums.data_ptr(), self.scales.data_ptr(),
            None if self.bias is None else self.bias.data_ptr(), self.out_features, self.in_features, padded_in,
            levels)
        self._decode_shape = (1, 1, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = self._decode_shape if x.dim() == 3 else (*x.shape[:-1], self.out_features)
        y = torch.empty(shape, dtype=x.dtype)
        bf16 = x.dtype == torch.bfloat16
        if self._call(torch.get_num_threads(), x.data_ptr(), bf16, y.data_ptr(), bf16) != 0:
            raise MemoryError("the int8 kernel could not allocate its digits")
        return y

"""model/int8_matvec.py on native/int8_matvec.c: the product of one row equals float64's product of the same two
digits and the int8 weight (the integer sums exact, only the final float rounding), at any shape the padding has
to cover, in float32 and bfloat16; a NaN or an infinity in the row gives NaN; Int8Linear runs single rows on it
only when it is handed the library."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import model.int8_matvec as int8_matvec
from native.build import int8_matvec_library
from model.int8_matvec import Int8Matvec, pack
from model.quantize import Int8Linear, quantize_per_channel


def digits_reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The C file's numbers computed independently: float32 digits as torch rounds them (half to even), the sums
    and the combination in float64."""
    x = x.reshape(-1).float()
    scale = torch.clamp(x.abs().max() / 127, min=torch.finfo(torch.float32).tiny)
    u = x / scale
    h = torch.round(u)
    low = torch.round((u - h) * 254)
    sums = q.double() @ h.double() + q.double() @ low.double() / 254  # (out,)
    y = scale.double() * scales.double() * sums
    return y if bias is None else y + bias.double()


@settings(max_examples=60, deadline=None)
@given(in_features=st.integers(1, 200), out_features=st.integers(1, 13), bias=st.booleans(), bf16=st.booleans(),
       spread=st.one_of(st.floats(-6, 6), st.floats(-44, -38)), zero=st.booleans(), seed=st.integers(0, 2**16))
def test_one_row_equals_the_digits_product_at_any_shape(in_features, out_features, bias, bf16, spread, zero, seed):
    """Shapes off the kernel's blocks (rows not a multiple of 4, columns not of 64), rows from subnormal to large,
    a row of zeros: the output is the reference's to float32's rounding of the final combination (bfloat16's where
    the row is bfloat16). A dropped second digit moves it by up to max|x| / 254 per entry: far outside."""
    lib = int8_matvec_library()
    if lib is None:
        pytest.skip("no C compiler here: the int8 kernel cannot be built")
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    q, scales = quantize_per_channel(weight)
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(1, 1, in_features, generator=gen) * 10.0 ** spread
    if zero:
        x.zero_()
    x = x.to(torch.bfloat16 if bf16 else torch.float32)
    y = Int8Matvec(lib, q, scales, b, 256)(x)
    assert y.dtype == x.dtype and y.shape == (1, 1, out_features)
    ref = digits_reference(x, q, scales, b)
    magnitude = (x.reshape(-1).double().abs().max() / 127) * scales.double() * q.double().abs().sum(1) * 2  # (out,)
    tolerance = (2 ** -8 if bf16 else 2 ** -21) * (ref.abs() + magnitude) + 1e-38
    assert bool(((y.reshape(-1).double() - ref).abs() <= tolerance).all())
    if zero and not bias:
        assert not bool(y.any())


def test_integer_rows_come_out_exact(lib):
    """A row of integers whose largest is 127: the digit scale is exactly 1, the digits are the row itself and
    the second ones 0, so with unit weight scales the output is the exact integer product."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (37, 300), generator=gen, dtype=torch.int8)
    x = torch.randint(-127, 128, (300,), generator=gen).float()
    x[5] = 127.0
    y = Int8Matvec(lib, q, torch.ones(37), None, 256)(x)
    assert torch.equal(y.double(), q.double() @ x.double())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_row_that_is_not_finite_gives_nan_everywhere(lib, bad):
    q, scales = quantize_per_channel(torch.randn(9, 64))
    x = torch.randn(64)
    x[17] = bad
    for dtype in (torch.float32, torch.bfloat16):
        assert bool(torch.isnan(Int8Matvec(lib, q, scales, torch.zeros(9), 256)(x.to(dtype))).all())


def test_pack_lays_blocks_of_four_rows_out_in_64_column_chunks():
    q = torch.arange(6 * 70, dtype=torch.int32).remainder(251).sub(125).to(torch.int8).view(6, 70)
    packed, padded_in = pack(q)
    assert padded_in == 128 and packed.numel() == 8 * 128
    blocks = packed.view(2, 2, 4, 64)  # (block, chunk, row, column)
    assert torch.equal(blocks[0, 1, 2, :6], q[2, 64:70]) and torch.equal(blocks[1, 0, 1], q[5, :64])
    assert not bool(blocks[1, :, 2:].any()) and not bool(blocks[:, 1, :, 6:].any())  # the padding is zeros


def test_int8_linear_runs_single_rows_on_the_kernel_only_when_turned_on(lib, monkeypatch):
    linear = nn.Linear(64, 24)
    layer = Int8Linear.from_linear(linear, "int8")
    assert layer.one_row_kernel() != layer._native_row and layer._native is None
    assert layer.use_native_kernel(lib) and layer.one_row_kernel() == layer._native_row
    calls = []
    native = layer._native
    monkeypatch.setattr(layer, "_native", lambda x: calls.append(x.shape) or native(x))
    x = torch.randn(1, 1, 64)
    with torch.inference_mode():
        y = layer(x)
        layer(torch.randn(3, 64))  # several rows: FBGEMM's digits
        layer(x.double())  # a dtype the kernel does not read: the other path
    assert calls == [(1, 1, 64)]
    torch.testing.assert_close(y, digits_reference(x, layer.weight_int8, layer.scales_f32, linear.bias.detach())
                               .float().view(1, 1, 24), rtol=2e-6, atol=2e-6)
    monkeypatch.undo()
    assert not layer.use_native_kernel(None) and layer._native is None
    assert not Int8Linear.from_linear(linear, "int8-dynamic").use_native_kernel(lib)  # weight-only only


def test_wider_rows_than_the_exact_sums_allow_are_refused(lib):
    with pytest.raises(ValueError, match="overflow"):
        Int8Matvec(lib, torch.zeros(4, int8_matvec.MAX_IN_FEATURES + 1, dtype=torch.int8), torch.ones(4), None, 256)

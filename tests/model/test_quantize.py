"""model/quantize.py: per-channel int8 weights. The round trip keeps every weight within half its row's scale,
Int8Linear computes what F.linear computes on the dequantized weight (and, in int8-dynamic, on the per-token
dequantized activations), quantize_int8 replaces exactly the block matmuls (the head only when asked or measured
faster), and what it cannot do is refused in one line before anything changes."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from common.errors import UserError
from native.build import int8_matvec_library
from model import GPT, ModelConfig
import model.quantize as quantize_module
from model.packed import PackedLinear, onednn_packs
from model.quantize import (FBGEMM_SMALLEST_SCALE, Int8Linear, activation_levels, digit_levels, is_quantized,
                            one_row_kernels_usable, quantization_of, quantize_int8, quantize_per_channel, quantize_rows,
                            split_digits)


def tiny_gpt(tie: bool = True, d_model: int = 32, **overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=48, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=d_model,
                           pos="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=tie, **overrides)).eval()


weights = st.tuples(st.integers(1, 6), st.integers(1, 9)).flatmap(lambda shape: arrays(
    np.float32, shape, elements=st.one_of(st.just(0.0), st.floats(-1e4, 1e4, width=32, allow_subnormal=False))))


@settings(max_examples=150)
@given(w=weights, zero_row=st.booleans(), bf16_scales=st.booleans())
def test_round_trip_is_within_half_a_scale_per_row_and_zero_rows_stay_exact(w, zero_row, bf16_scales):
    weight = torch.from_numpy(w.copy())
    if zero_row:
        weight[0] = 0.0
    q, scales = quantize_per_channel(weight, scale_dtype=torch.bfloat16 if bf16_scales else torch.float32)
    assert q.dtype == torch.int8 and q.shape == weight.shape and scales.shape == weight.shape[:1]
    assert int(q.abs().max()) <= 127 and bool((scales > 0).all())
    deq = q.double() * scales.double()[:, None]  # exact in float64
    err = (deq - weight.double()).abs()
    assert bool((err <= scales.double()[:, None] / 2 * (1 + 1e-6)).all()), (err, scales)
    for row in range(weight.shape[0]):
        if not bool(weight[row].any()):
            assert not bool(q[row].any()) and not bool(deq[row].any())  # exactly zero again
        elif float(weight[row].abs().max()) > 1e-30:  # the row's largest entry uses the whole int8 range (up to
            # the bf16 scale's rounding up; a scale below float32's normal range has fewer bits to round with)
            assert int(q[row].abs().max()) >= (126 if bf16_scales else 127)


@pytest.mark.parametrize("levels", [256, 128])
def test_per_token_activation_rounding_keeps_each_row_on_its_own_levels(levels):
    x = torch.tensor([[0.0, 0.0, 0.0], [-1.0, 0.5, 3.0], [1e-3, 2e-3, 4e-3]])
    q, scales, zeros = quantize_rows(x, levels)
    assert q.dtype == torch.uint8 and scales.shape == (3, 1) and zeros.shape == (3, 1)
    assert int(q.max()) == levels - 1 and int(q[1].min()) == 0  # row 1 spans every code, and no more
    torch.testing.assert_close(scales[1], torch.tensor([4.0 / (levels - 1)]))
    back = (q.float() - zeros) * scales
    assert torch.equal(back[0], torch.zeros(3))  # a zero row stays zero
    assert bool(((back - x).abs() <= scales * (1 + 1e-6)).all())  # at most one level of its own row
    assert float(scales[2]) < 1e-4  # a row of small values is not flattened by a row of large ones


@pytest.fixture
def kernels_that_saturate(monkeypatch):
    """Stand in a machine whose one-row int8 kernels are exact only at the levels `exact_at` holds (a CPU without
    VNNI: only at 128), the cached decisions measured again for it and once more afterwards."""
    def set_exact(*exact_at):
        monkeypatch.setattr(quantize_module, "_one_row_kernels_exact", lambda levels: levels in exact_at)
        activation_levels.cache_clear()
        one_row_kernels_usable.cache_clear()
    yield set_exact
    monkeypatch.undo()
    activation_levels.cache_clear()
    one_row_kernels_usable.cache_clear()


def saturating_case(rows: int, in_features: int = 64, signs_seed: int | None = None) -> tuple[nn.Linear, torch.Tensor]:
    """Weights that all quantize to 127 or -127 (alternating by row, or random signs from signs_seed) and activation
    rows whose codes all sit at the top: the products a kernel adding u8 x s8 pairs into int16 cannot hold
    (2 x 255 x 127 > 32767)."""
    linear = nn.Linear(in_features, 16, bias=False)
    if signs_seed is None:
        signs = torch.where(torch.arange(16)[:, None] % 2 == 0, 1.0, -1.0).expand(16, in_features)
    else:
        signs = torch.randint(0, 2, (16, in_features), generator=torch.Generator().manual_seed(signs_seed)) * 2.0 - 1
    with torch.no_grad():
        linear.weight.copy_(signs)
    return linear, torch.full((rows, in_features), 0.5) + torch.arange(rows)[:, None]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 3]), st.integers(1, 400), st.one_of(st.none(), st.integers(0, 2**16)))
def test_the_products_a_saturating_kernel_cannot_hold_come_out_exact(rows, in_features, signs_seed):
    """This machine's kernels at the levels measured for it, at any width and sign pattern: the worst case for
    int16 pair sums equals float64's product of the same quantized numbers (it came out at half its value on an
    AVX2 CPU at 256 levels)."""
    linear, x = saturating_case(rows, in_features, signs_seed)
    layer = Int8Linear.from_linear(linear, "int8-dynamic")
    with torch.no_grad():
        y = layer(x)
    q, scales, zeros = quantize_rows(x, activation_levels())
    assert int(q.min()) == activation_levels() - 1  # every code at the top
    reference = F.linear((q.double() - zeros) * scales.double(), layer.weight.double())
    torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)


def test_kernels_that_saturate_at_256_levels_get_128_everywhere(kernels_that_saturate):
    kernels_that_saturate(128)
    assert activation_levels() == 128 and one_row_kernels_usable()
    linear, x = saturating_case(1)
    layer = Int8Linear.from_linear(linear, "int8-dynamic")
    rows = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        one, several = layer(rows[:1]), layer(rows)  # a one-row kernel where present, torch._int_mm for several
    q, scales, zeros = quantize_rows(rows, 128)
    reference = F.linear((q.double() - zeros) * scales.double(), layer.weight.double())
    torch.testing.assert_close(several.double(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one.double(), reference[:1], rtol=1e-5, atol=1e-5)
    assert "on 128 levels" in quantize_int8(tiny_gpt(), "int8-dynamic", lm_head=False)
    kernels_that_saturate(256, 128)
    assert activation_levels() == 256 and "levels" not in quantize_int8(tiny_gpt(), "int8-dynamic", lm_head=False)


def test_kernels_exact_at_no_levels_are_not_used(kernels_that_saturate):
    kernels_that_saturate()
    assert activation_levels() == 128 and not one_row_kernels_usable()
    linear, x = saturating_case(1)
    layer = Int8Linear.from_linear(linear, "int8-dynamic")
    assert layer._fbgemm_weight is None and layer._onednn_weight is None  # torch._int_mm takes every row
    with torch.no_grad():
        y = layer(x)
    q, scales, zeros = quantize_rows(x, 128)
    torch.testing.assert_close(y.double(), F.linear((q.double() - zeros) * scales.double(), layer.weight.double()),
                               rtol=1e-5, atol=1e-5)


def dynamic_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """|y - x W^T| allowed when each activation row moves by up to one of its levels: s_x * sum_k |W_nk|,
    (N, out) for x (N, in)."""
    _, scales, _ = quantize_rows(x.reshape(-1, x.shape[-1]), activation_levels())
    return scales * weight.abs().sum(dim=1)[None, :]


@pytest.mark.parametrize("mode", ["int8", "int8-dynamic"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 32), (2, 5, 32), (1, 1, 32)])
def test_forward_equals_f_linear_on_the_dequantized_weight(mode, bias, shape):
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(32, 40, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 32, generator=gen) * 0.1)
        if bias:
            linear.bias.copy_(torch.randn(40, generator=gen))
    layer = Int8Linear.from_linear(linear, mode)
    assert (layer.in_features, layer.out_features) == (32, 40)
    weight = layer.weight.double()  # the dequantized weight, computed by the property
    # q * s, rounded once to float32
    torch.testing.assert_close(weight, layer.weight_int8.double() * layer.scales.double()[:, None], rtol=2 ** -23, atol=0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(*shape, generator=gen).to(dtype)
        with torch.no_grad():
            y = layer(x)
        assert y.shape == (*shape[:-1], 40) and y.dtype == dtype
        # the independent reference: float64 F.linear on the dequantized weight
        ref = F.linear(x.double(), weight, None if not bias else linear.bias.detach().double())
        err = (y.double() - ref).reshape(-1, 40)
        magnitude = (x.double().abs() @ weight.abs().T).reshape(-1, 40)  # sum_k |x_k W_nk|
        # bfloat16 in and out: each product and the result rounded to 8 bits (2^-8 relative)
        tolerance = 1e-5 * magnitude + 1e-5 if dtype == torch.float32 else 2 ** -7 * (magnitude + ref.abs().reshape(-1, 40))
        if mode == "int8-dynamic":
            tolerance = tolerance + dynamic_bound(x.float(), weight.float()).double()
        elif layer._fbgemm_weight is not None:  # the activations as two int8 digits
            tolerance = tolerance + digit_bound(x.reshape(-1, 32), weight, layer.levels)
        assert bool((err.abs() <= tolerance + 1e-6).all()), (mode, dtype, float(err.abs().max()))


@pytest.mark.parametrize("mode", ["int8", "int8-dynamic"])
def test_a_row_that_requires_grad_gives_the_no_grad_numbers(mode):
    """A quantized model called outside no_grad (its float embeddings make every row require grad): the one-row
    decode path writes its digits in place, which autograd refuses, so such a row takes the general path, to the
    same numbers."""
    gen = torch.Generator().manual_seed(3)
    linear = nn.Linear(32, 24)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(24, 32, generator=gen) * 0.1)
    layer = Int8Linear.from_linear(linear, mode)
    x = torch.randn(1, 1, 32, generator=gen)
    with torch.no_grad():
        expected = layer(x)
    with torch.enable_grad():
        got = layer(x.clone().requires_grad_())
    torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("one_row_kernel", ["fbgemm", "onednn"])
def test_dynamic_mode_is_per_token_in_every_kernel(monkeypatch, one_row_kernel):
    """One row (FBGEMM, or oneDNN where FBGEMM is absent), several rows (torch._int_mm) and the plain-float
    reference give each row the numbers of that row alone: a large row next to a small one does not coarsen
    the small one's levels."""
    if one_row_kernel == "onednn":
        monkeypatch.setattr(quantize_module, "_fbgemm_prepack", lambda weight, scales, bias: None)  # a build without
    gen = torch.Generator().manual_seed(1)
    linear = nn.Linear(32, 24, bias=False)
    layer = Int8Linear.from_linear(linear, "int8-dynamic")
    if one_row_kernel == "fbgemm" and layer._fbgemm_weight is None:
        pytest.skip("this torch build has no FBGEMM")
    assert (layer._fbgemm_weight is not None) == (one_row_kernel == "fbgemm")
    rows = torch.randn(4, 32, generator=gen)
    rows[0] *= 1000.0  # a huge token beside small ones
    with torch.no_grad():
        together = layer(rows)  # (4, 24), the several-rows kernel
        alone = torch.cat([layer(rows[i:i + 1]) for i in range(4)])  # the one-row kernel, each on its own
    q, scales, zeros = quantize_rows(rows, activation_levels())
    reference = F.linear((q.double() - zeros) * scales.double(), layer.weight.double())  # dequantized both sides
    for y in (together, alone):
        torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)


def test_the_weight_property_is_read_only_and_the_model_is_never_saved():
    model = tiny_gpt()
    quantize_int8(model, "int8", lm_head=True)
    layer = model.blocks[0].attn.out_proj
    with pytest.raises(AttributeError):
        layer.weight = torch.zeros(32, 32)
    with pytest.raises(KeyError):  # nn.Module's own refusal of a parameter over an attribute
        layer.weight = nn.Parameter(torch.zeros(32, 32))
    assert layer.weight.dtype == layer.scales.dtype == torch.float32
    with pytest.raises(UserError, match="never saved"):
        model.state_dict()
    bf16 = tiny_gpt().to(torch.bfloat16)
    quantize_int8(bf16, "int8", lm_head=False)
    assert bf16.blocks[0].mlp.fc_in.weight.dtype == torch.bfloat16  # insight's matmuls run in the model's dtype


def test_quantize_replaces_exactly_the_block_matmuls_and_the_head_only_when_asked():
    for tie in (True, False):
        for lm_head in (False, True):
            model = tiny_gpt(tie=tie)
            float_names = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
            embedding = model.tok_emb.weight.detach().clone()
            description = quantize_int8(model, "int8-dynamic", lm_head=lm_head)
            int8_names = {name for name, m in model.named_modules() if isinstance(m, Int8Linear)}
            expected = {f"blocks.{i}.{path}" for i in range(2)
                        for path in ("attn.qkv_proj", "attn.out_proj", "mlp.fc_in", "mlp.fc_out")}
            assert int8_names == expected | ({"lm_head"} if lm_head else set())
            assert {name for name, m in model.named_modules() if isinstance(m, nn.Linear)} == float_names - int8_names
            assert model.head_is_linear() is not lm_head
            assert isinstance(model.tok_emb, nn.Embedding) and torch.equal(model.tok_emb.weight, embedding)
            assert all(m.mode == "int8-dynamic" for m in model.modules() if isinstance(m, Int8Linear))
            assert quantization_of(model) == description and "int8-dynamic" in description
            assert ("LM head int8" in description) is lm_head
            with torch.no_grad():  # logits through the int8 head (GPT.logits skips head_columns for it)
                logits, _ = model(torch.tensor([[1, 2, 3]]), last_only=True)
            assert logits.shape == (1, 1, 48) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("costs_ms, int8_kept", [((1, 2, 2), True), ((2, 1, 3), False), ((2, 3, 1), False)])
def test_the_head_is_decided_by_measurement(monkeypatch, costs_ms, int8_kept):
    """A clock of the test's own: each call of the int8 head, the float head as GPT.logits runs it and the float
    head on oneDNN-packed weights costs its own ms (costs_ms, in that order), and each block matmul 0.25 ms;
    int8 is kept only when it beats the faster of the two float ones, whichever that is, and the heads' times
    reported are theirs alone, the pass over the blocks timed before each taken off."""
    model = tiny_gpt()
    clock = types.SimpleNamespace(now=0.0, calls={"int8": 0, "float": 0, "packed": 0, "block": 0})
    cost = dict(zip(("int8", "float", "packed"), (c * 1e-3 for c in costs_ms)), block=0.25e-3)
    forward, logits, packed_forward = Int8Linear.forward, model.logits, PackedLinear.forward

    def tick(kind):
        clock.now += cost[kind]
        clock.calls[kind] += 1

    def timed_int8(self, x):
        tick("int8" if self.out_features == 48 else "block")  # the head candidate, or one of the block matmuls
        return forward(self, x)

    def timed_packed(self, x):
        tick("packed")
        return packed_forward(self, x)

    def timed_float(x):
        tick("float")
        return logits(x)

    monkeypatch.setattr(Int8Linear, "forward", timed_int8)
    monkeypatch.setattr(PackedLinear, "forward", timed_packed)
    monkeypatch.setattr(model, "logits", timed_float)
    description = quantize_int8(model, "int8", clock=lambda: clock.now)
    timed = ("int8", "float", "packed") if onednn_packs(model.tok_emb.weight.dtype) else ("int8", "float")
    assert all(clock.calls[kind] >= 3 for kind in timed)  # every candidate was measured
    if not onednn_packs(model.tok_emb.weight.dtype):
        int8_kept = costs_ms[0] < costs_ms[1]
    assert isinstance(model.lm_head, Int8Linear) is int8_kept
    assert ("LM head int8" if int8_kept else "LM head float") in description and "measured" in description
    assert clock.calls["block"] >= 8 * 3 * len(timed)  # the 8 block matmuls before every head call
    float_ms = min(costs_ms[1:]) if onednn_packs(model.tok_emb.weight.dtype) else costs_ms[1]
    assert f"int8 {costs_ms[0]:.3g} ms, float {float_ms:.3g} ms" in description  # the heads alone


def test_what_quantize_cannot_do_is_refused_before_anything_changes():
    with pytest.raises(UserError, match="int8-dynamic|int8 or"):
        quantize_int8(tiny_gpt(), "int4")
    odd = tiny_gpt(d_model=24)  # in_features 24: not a multiple of 16
    with pytest.raises(UserError, match="blocks.0.attn.qkv_proj.*multiple of 16.*int8-dynamic"):
        quantize_int8(odd, "int8")
    assert not is_quantized(odd)  # refused before any layer was replaced
    quantize_int8(odd, "int8-dynamic", lm_head=True)  # its kernels take any shape
    with pytest.raises(UserError, match="already quantized"):
        quantize_int8(odd, "int8-dynamic")
    on_meta = tiny_gpt().to("meta")
    with pytest.raises(UserError, match="CPU only.*--device cpu"):
        quantize_int8(on_meta, "int8")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 64), st.booleans(), st.floats(1e-3, 1e3), st.integers(0, 2**16))
def test_one_row_dynamic_kernel_equals_the_per_token_reference_at_any_shape(in_features, out_features, bias, scale,
                                                                            seed):
    """Whatever the widths and the row's scale: one row through the one-row kernel (FBGEMM where present) gives the
    numbers of the row quantized on its own levels (activation_levels) times the dequantized weight, plus the
    bias; only a row whose step would be finer than FBGEMM's smallest is rounded to that step instead (module doc)."""
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    layer = Int8Linear.from_linear(linear, "int8-dynamic")
    x = torch.randn(1, 1, in_features, generator=gen) * scale
    with torch.no_grad():
        y = layer(x)
    q, scales, zeros = quantize_rows(x.reshape(1, -1), activation_levels())
    reference = F.linear((q.double() - zeros) * scales.double(), layer.weight.double(),
                         None if not bias else linear.bias.detach().double()).reshape(1, 1, -1)
    magnitude = (((q.double() - zeros) * scales.double()).abs() @ layer.weight.double().abs().T).reshape(1, 1, -1)
    tolerance = 1e-5 * magnitude + 1e-6
    if layer._fbgemm_weight is not None and float(scales) < FBGEMM_SMALLEST_SCALE:
        tolerance = tolerance + FBGEMM_SMALLEST_SCALE * layer.weight.double().abs().sum(dim=1)  # one FBGEMM step
    assert y.shape == (1, 1, out_features)
    assert bool(((y.double() - reference).abs() <= tolerance).all())


def test_the_saturation_probe_counts_a_raising_kernel_as_inexact_and_no_kernel_as_exact(monkeypatch):
    def raises(*args):
        raise RuntimeError("this CPU lacks the instructions")
    monkeypatch.setattr(quantize_module, "_fbgemm_prepack", raises)
    assert not quantize_module._one_row_kernels_exact(256) and not quantize_module._one_row_kernels_exact(128)
    monkeypatch.setattr(quantize_module, "_fbgemm_prepack", lambda weight, scales, bias: None)
    monkeypatch.setattr(quantize_module, "_onednn_int8_available", lambda: False)
    assert quantize_module._one_row_kernels_exact(256)  # torch._int_mm alone: exact in int32, nothing saturates


# --- weight-only int8 as two int8 digits per activation (FBGEMM) --------------------------------------------------

def digit_bound(x: torch.Tensor, weight: torch.Tensor, levels: int) -> torch.Tensor:
    """The most the two-digit activations can move an output, (N, out) for x (N, in): each entry within
    max|row| / (2 B D) of x (D = levels / 2 - 1, B = 2D), times the weight row's magnitudes."""
    top_digit = levels // 2 - 1
    per_entry = x.double().abs().amax(dim=1, keepdim=True) / (2 * (2 * top_digit) * top_digit)  # (N, 1)
    return per_entry * weight.double().abs().sum(dim=1)[None, :]


@pytest.fixture
def digits_at(monkeypatch):
    """Stand in a machine whose digit kernel is exact only at the levels given (a CPU without VNNI: 128), the
    cached decision measured again for it and once more afterwards."""
    def set_exact(*exact_at):
        if digit_levels() is None:
            pytest.skip("this torch build has no FBGEMM digit kernel")
        monkeypatch.setattr(quantize_module, "_digit_kernel_exact", lambda levels: levels in exact_at)
        digit_levels.cache_clear()
    yield set_exact
    monkeypatch.undo()
    digit_levels.cache_clear()


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), in_blocks=st.integers(1, 12), out_features=st.integers(1, 40), bias=st.booleans(),
       bf16=st.booleans(), spread=st.one_of(st.floats(-6, 6), st.floats(-44, -37)), zero_row=st.booleans(),
       levels=st.sampled_from([256, 128]),
       seed=st.integers(0, 2**16))
def test_weight_only_int8_is_within_the_two_digit_bound_of_float64(rows, in_blocks, out_features, bias, bf16, spread,
                                                                    zero_row, levels, seed):
    """Any shape, one row (a decode step) or several (a prefill), float32 or bfloat16 rows of any magnitude
    (subnormal ones too, whose digit scale max|row| / D would have an infinite reciprocal), a row of zeros, 8- or
    7-bit digits: the output is float64's product of the same activations and the
    dequantized weight, within the digits' bound (and the output dtype's rounding). One digit alone (max|row| /
    254 per entry) is 127x the bound, so a dropped or misplaced second digit fails."""
    if digit_levels() is None:
        pytest.skip("this torch build has no FBGEMM digit kernel")
    quantize_module._digit_kernel_exact, exact = (lambda n: n == levels), quantize_module._digit_kernel_exact
    digit_levels.cache_clear()
    try:
        gen = torch.Generator().manual_seed(seed)
        in_features = 16 * in_blocks
        linear = nn.Linear(in_features, out_features, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
            if bias:
                linear.bias.copy_(torch.randn(out_features, generator=gen))
        layer = Int8Linear.from_linear(linear, "int8")
        assert layer._fbgemm_weight is not None and layer.levels == levels
        x = torch.randn(rows, in_features, generator=gen) * 10.0 ** spread
        x[:, 0] *= 50.0  # one entry well above the rest: the digits' scale is the row's largest
        if zero_row:
            x[0] = 0.0
        x = x.to(torch.bfloat16 if bf16 else torch.float32)
        with torch.inference_mode():
            y = layer(x)
        assert y.dtype == x.dtype and y.shape == (rows, out_features)
        weight = layer.weight.double()
        ref = F.linear(x.double(), weight, None if not bias else linear.bias.detach().double())
        rounding = (2 ** -8 if bf16 else 2 ** -22) * ref.abs() + 1e-6 * (x.double().abs() @ weight.abs().T)
        assert bool(((y.double() - ref).abs() <= digit_bound(x, weight, levels) + rounding + 1e-30).all())
        if zero_row and not bias:
            assert not bool(y[0].any())  # zeros in, zeros out
    finally:
        quantize_module._digit_kernel_exact = exact
        digit_levels.cache_clear()


def test_the_digits_rebuild_every_row_within_their_bound():
    """split_digits on its own: h and the second digit on their codes, the row rebuilt from them within
    max|row| / 64516 (8-bit digits), a zero row all zeros."""
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [-3.0, 0.001, 2.5, 1e-7], [1e-20, -3e-20, 2e-20, 0.0]])
    digits, scales = split_digits(x, 256)
    h, second = digits[:3], digits[3:]
    assert torch.equal(h, h.round()) and float(h.abs().max()) == 127 and float(second.abs().max()) <= 127
    rebuilt = scales.double() * (h.double() + second.round().double() / 254)
    assert bool(((rebuilt - x.double()).abs() <= x.double().abs().amax(1, keepdim=True) / 64516 + 1e-45).all())
    assert not bool(digits[0].any()) and not bool(digits[3].any())


def test_digits_that_saturate_at_8_bits_get_7_and_none_exact_leave_the_digits_out(digits_at):
    digits_at(128)
    assert digit_levels() == 128
    assert "14 bits" in quantize_int8(tiny_gpt(), "int8", lm_head=False)
    digits_at()
    assert digit_levels() is None
    linear = nn.Linear(32, 8)
    layer = Int8Linear.from_linear(linear, "int8")
    assert layer._fbgemm_weight is None  # _weight_int8pack_mm (bfloat16) or F.linear takes every row
    description = quantize_int8(tiny_gpt().to(torch.bfloat16), "int8", lm_head=False)
    assert "bfloat16 activations" in description and "digits" not in description
    assert "only --dtype bfloat16 has an int8 kernel" in quantize_int8(tiny_gpt(), "int8", lm_head=False)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, linear.bias))


def test_the_digit_probe_finds_this_kernel_exact_and_a_raising_one_not(monkeypatch):
    """This machine's digit kernel at the levels measured for it gives the exact product on the worst case (every
    digit at its top, every weight 127); a kernel that raises is not exact."""
    if digit_levels() is None:
        pytest.skip("this torch build has no FBGEMM digit kernel")
    assert quantize_module._digit_kernel_exact(digit_levels())
    linear, x = saturating_case(2)
    layer = Int8Linear.from_linear(linear, "int8")
    x = x * 0 + 1.0  # every entry the row's largest: every digit 127 (at 8 bits), the codes at 255
    with torch.inference_mode():
        torch.testing.assert_close(layer(x).double(), F.linear(x.double(), layer.weight.double()), rtol=1e-6, atol=1e-6)

    def raises(*args):
        raise RuntimeError("this CPU lacks the instructions")
    monkeypatch.setattr(torch.ops.quantized, quantize_module.DIGIT_KERNEL, raises, raising=False)
    assert not quantize_module._digit_kernel_exact(256)


@pytest.mark.parametrize("native_ms, other_ms", [(1.0, 2.0), (2.0, 1.0)])
def test_single_rows_go_to_the_native_kernel_only_where_it_measured_faster(monkeypatch, native_ms, other_ms):
    """quantize_int8 times native/int8_matvec.c against the one-row path without it over the block matmuls (stood
    in here) and turns it on in every layer, the LM head included, only when it was faster; the description
    reports both times. A forward of one row then goes where the choice says; without the library nothing is
    timed."""
    lib = int8_matvec_library()
    if lib is None:
        pytest.skip("no C compiler here: the int8 kernel cannot be built")
    seen = []

    def seconds(layers, dtype, clock):
        seen.append(len(layers))
        assert all(layer._native is not None for layer in layers)  # both kernels were there to be timed
        return native_ms * 1e-3, other_ms * 1e-3
    monkeypatch.setattr(quantize_module, "_native_seconds", seconds)
    model = tiny_gpt()
    description = quantize_int8(model, "int8", lm_head=True, int8_kernel=lib)
    on = native_ms < other_ms
    assert seen == [8]
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(layers) == 9 and all((layer._native is not None) is on for layer in layers)
    fast, slow = sorted((native_ms, other_ms))
    assert f"timed over the block matmuls at one row: {fast:.3g} ms against {slow:.3g} for" in description
    assert ("single rows on attngpt's int8 kernel" in description) is on
    calls = []
    monkeypatch.setattr(Int8Linear, "_native_row", lambda self, x: calls.append(1) or Int8Linear.run(self, x, True))
    with torch.inference_mode():
        model(torch.tensor([[3]]))
    assert bool(calls) is on
    assert "without attngpt's int8 kernel: not built here" in quantize_int8(tiny_gpt(), "int8", lm_head=True)
    assert seen == [8]  # no library: nothing timed


def test_int8_dynamic_never_times_the_native_kernel(monkeypatch):
    monkeypatch.setattr(quantize_module, "_native_seconds", lambda *a: pytest.fail("timed for int8-dynamic"))
    model = tiny_gpt()
    assert "attngpt" not in quantize_int8(model, "int8-dynamic", lm_head=False, int8_kernel=int8_matvec_library())
    assert all(m._native is None for m in model.modules() if isinstance(m, Int8Linear))

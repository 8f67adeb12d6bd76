"""model/packed.py: the prepared matmul layers (oneDNN-packed, ATen's matrix-vector kernel) compute F.linear's
numbers on the same Parameters, follow every change to the weight and bias, leave training and the state dict as
they were, and are chosen by measurement."""
from __future__ import annotations

import platform
import unittest.mock as mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.generate import generate
import model.packed as packed_module
from model.packed import (MATVEC, ONEDNN, PLAIN, PackedLinear, aten_matvec, is_packed, kernels_here, onednn_packs,
                          pack_linears, packable_linears, packing_of)

def tiny(tie: bool = True, bias: bool = True, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32, bias=bias,
                         tie_embeddings=tie)
    return GPT(config).eval().to(dtype)


@pytest.mark.parametrize("kernel", [ONEDNN, MATVEC])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (1, 1, 24), (2, 7, 24), (1, 24), (24,)])
def test_packed_layer_equals_f_linear(kernel, dtype, bias, shape):
    torch.manual_seed(1)
    linear = nn.Linear(24, 40, bias=bias).to(dtype)
    packed = PackedLinear(linear, kernel)
    x = torch.randn(*shape, dtype=dtype)
    with torch.no_grad():
        got = packed(x)
        # the prepared kernel ran where it applies: oneDNN where this CPU packs the dtype (its bfloat16 needs
        # AVX-512), matvec for one row; F.linear otherwise
        ran = onednn_packs(dtype) if kernel == ONEDNN else x.numel() == 24
        assert (packed._packed is not None) == ran
        expected = F.linear(x.double(), linear.weight.double(), None if linear.bias is None else linear.bias.double())
    assert got.shape == (*shape[:-1], 40) and got.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.double(), expected, **tol)


@pytest.mark.parametrize("kernel", [ONEDNN, MATVEC])
def test_packed_copy_follows_in_place_updates_and_training_takes_f_linear(kernel):
    linear = nn.Linear(16, 8)
    packed = PackedLinear(linear, kernel)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        before = packed(x)
        linear.weight.mul_(2.0)
        linear.bias.mul_(2.0)
        after = packed(x)
        linear.bias.add_(1.0)  # the bias alone: the matvec copy holds it as a column
        shifted = packed(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shifted, after + 1.0, rtol=1e-5, atol=1e-5)
    # with grad, F.linear runs on the same Parameter: the gradient reaches the nn.Linear's weight
    packed(x).sum().backward()
    assert linear.weight.grad is not None and torch.count_nonzero(linear.weight.grad) > 0


@pytest.mark.parametrize("kernel", [ONEDNN, MATVEC])
def test_pack_linears_replaces_every_matmul_and_keeps_the_state_dict(kernel):
    if kernel not in kernels_here(torch.float32):
        pytest.skip(f"{kernel} does not run float32 here")
    for tie in (True, False):
        model = tiny(tie=tie)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        names = sorted(f"{id(parent)}.{name}" for parent, name in packable_linears(model))
        assert len(names) == 2 * 4 + 1  # qkv, out, fc_in, fc_out per block, and the head
        assert pack_linears(model, kernel=kernel) is not None and packing_of(model) == kernel
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
        after = model.state_dict()
        assert list(after) == list(state)
        assert all(torch.equal(after[k], state[k]) for k in state)
        assert (model.lm_head.weight is model.tok_emb.weight) == tie  # a tied head stays tied


@pytest.mark.parametrize("kernel", [ONEDNN, MATVEC])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_model_generates_the_same_tokens(kernel, dtype):
    plain, packed = tiny(dtype=dtype), tiny(dtype=dtype)
    pack_linears(packed, kernel=kernel)
    assert is_packed(packed) == (kernel in kernels_here(dtype))
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(3))
    for kv in (True, False):
        a = generate(plain, prompt, 20, temperature=0, use_kv_cache=kv)
        b = generate(packed, prompt, 20, temperature=0, use_kv_cache=kv)
        assert torch.equal(a, b)
    with torch.no_grad():
        idx = torch.randint(0, 97, (1, 12))
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(packed(idx)[0].float(), plain(idx)[0].float(), **tol)


@pytest.mark.parametrize("fastest", [PLAIN, ONEDNN, MATVEC])
def test_the_measured_fastest_kernel_is_chosen(monkeypatch, fastest):
    """Every kernel this machine runs is timed over the same layers, and the fastest kept: each in turn made the
    fastest by a stand-in measurement."""
    monkeypatch.setattr(packed_module, "onednn_packs", lambda dtype: True)
    timed = []
    def measured(layers, kernels):
        timed.append((layers, kernels))
        return {name: (1e-4 if name == fastest else 2e-4 + 1e-4 * i) for i, name in enumerate(kernels)}
    model = tiny()
    matmuls = [getattr(parent, name) for parent, name in packable_linears(model)]
    note = pack_linears(model, measure=measured)
    # the whole of a small model is timed, each matmul layer once in turn, as a decode step runs them
    layers, kernels = timed[0]
    assert layers == matmuls
    assert kernels == [PLAIN, ONEDNN, MATVEC]
    assert packing_of(model) == (None if fastest == PLAIN else fastest)
    megabytes = sum(layer.weight.numel() * 4 for layer in layers) / 1e6
    times = {name: f"{(1e-4 if name == fastest else 2e-4 + 1e-4 * i) * 1e3:.3g} ms" for i, name in enumerate(kernels)}
    assert note == (f"matmul weights {packed_module.NOTES[fastest]}: 9 layers in turn ({megabytes:.3g} MB) "
                    f"{times[PLAIN]} with F.linear, {times[ONEDNN]} {ONEDNN}, {times[MATVEC]} {MATVEC}")
    untouched = tiny()
    assert "not timed" in pack_linears(untouched, kernel=PLAIN) and not is_packed(untouched)


def test_nothing_left_to_pack_returns_none():
    model = tiny()
    pack_linears(model, kernel=MATVEC)
    assert pack_linears(model, kernel=MATVEC) is None  # every matmul is already a PackedLinear


@pytest.mark.parametrize("kernel", [ONEDNN, MATVEC])
def test_a_compiled_decode_step_on_a_packed_model_equals_eager_in_one_graph(kernel):
    """Inside torch.compile the packed layers are F.linear on the same weights (the compiler cannot trace
    oneDNN's opaque tensors): the compiled step draws eager decoding's tokens, and the step is one graph. A break
    at a packed layer (a test the compiler cannot trace, such as comparing data pointers) leaves every layer after
    it to eager code, frame by frame: small.yaml's shape decoded compiled at 504 tok/s against 788 eagerly that
    way, at 1537 in one graph (benchmarks/RESULTS.md)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    model = tiny()
    pack_linears(model, kernel=kernel)
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    counters.clear()
    compiled = generate(model, prompt, 10, temperature=0, compile=True)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(compiled, generate(model, prompt, 10, temperature=0))


def test_a_dtype_this_cpu_cannot_pack_is_never_packed_nor_timed(monkeypatch):
    """On a CPU whose oneDNN cannot pack the weights' dtype (bfloat16 without AVX-512), oneDNN is not timed and, asked
    for, refused with a line saying why, the layers left as they were."""
    monkeypatch.setattr(packed_module, "onednn_packs", lambda dtype: False)
    timed = []
    def measured(layers, kernels):
        timed.append(kernels)
        return {name: 1.0 for name in kernels}
    pack_linears(tiny(), measure=measured)
    assert timed == [[PLAIN, MATVEC]]
    model = tiny()
    note = pack_linears(model, kernel=ONEDNN, measure=measured)
    assert not is_packed(model) and len(timed) == 1
    assert note == "matmul weights left to F.linear: oneDNN cannot pack float32 weights on this CPU"
    layer = PackedLinear(nn.Linear(16, 8))
    x = torch.randn(1, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer._packed is None  # F.linear ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_packs_says_whether_the_kernel_runs_here(dtype):
    """Its answer against the kernel itself at another shape: where it says no, packing raises on this CPU."""
    weight = torch.randn(40, 24).to(dtype)
    if onednn_packs(dtype):
        with torch.no_grad():
            torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    else:
        with pytest.raises(RuntimeError):
            torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    if dtype == torch.float32 and platform.machine().lower() in ("x86_64", "amd64"):
        assert onednn_packs(dtype)  # oneDNN's float32 path runs on every x86-64 CPU torch supports


def test_the_layers_timed_stop_at_the_byte_budget(monkeypatch):
    """Up to TIMED_BYTES of weights (so that they stream from memory), at least one layer, in the model's order."""
    layers = [nn.Linear(64, 64, bias=False) for _ in range(10)]  # 16 KiB of float32 weights each
    monkeypatch.setattr(packed_module, "TIMED_BYTES", 3 * 16384)
    assert packed_module.layers_to_time(layers) == layers[:3]
    monkeypatch.setattr(packed_module, "TIMED_BYTES", 3 * 16384 + 1)
    assert packed_module.layers_to_time(layers) == layers[:4]
    monkeypatch.setattr(packed_module, "TIMED_BYTES", 1)
    assert packed_module.layers_to_time(layers) == layers[:1]
    monkeypatch.setattr(packed_module, "TIMED_BYTES", 10**12)
    assert packed_module.layers_to_time(layers) == layers


def test_time_kernels_times_one_pass_over_the_layers_each_way():
    """Its seconds are those of a pass over all the layers given, on their own rows: a clock that advances by one
    unit per layer call makes a pass cost as many units as there are layers, whichever kernel."""
    calls = {"n": 0}
    layers = [nn.Linear(16, 8) for _ in range(3)]
    original = F.linear
    def counted(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)
    packed_forward = PackedLinear.forward
    def counted_packed(self, x):
        calls["n"] += 1
        return packed_forward(self, x)
    with mock.patch.object(packed_module.F, "linear", counted), \
            mock.patch.object(PackedLinear, "forward", counted_packed):
        seconds = packed_module.time_kernels(layers, [PLAIN, ONEDNN, MATVEC], clock=lambda: float(calls["n"]))
    # (where this CPU cannot pack float32, each packed call runs F.linear as well, which this clock also counts)
    assert seconds == {PLAIN: 3.0, ONEDNN: 3.0 if onednn_packs(torch.float32) else 6.0, MATVEC: 3.0}


@pytest.mark.parametrize("enabled_before", [True, False])
def test_matvec_runs_atens_kernel_with_onednn_off_for_that_call_only(monkeypatch, enabled_before):
    """torch.mv runs while oneDNN's switch is off (else torch.mv would go to oneDNN's kernel), and the switch is left
    as it was found, on or off, also when the product raises."""
    seen = []
    real_mv = torch.mv
    def recording_mv(weight, vector):
        seen.append(torch._C._get_mkldnn_enabled())
        return real_mv(weight, vector)
    monkeypatch.setattr(torch, "mv", recording_mv)
    previous = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(enabled_before)
    try:
        layer = PackedLinear(nn.Linear(16, 8), MATVEC)
        with torch.no_grad():
            layer(torch.randn(1, 1, 16))
        assert seen == [False] and torch._C._get_mkldnn_enabled() == enabled_before
        with pytest.raises(RuntimeError):
            aten_matvec(torch.randn(8, 16), torch.randn(15))
        assert torch._C._get_mkldnn_enabled() == enabled_before
    finally:
        torch._C._set_mkldnn_enabled(previous)


def test_matvec_sums_the_bias_before_its_one_rounding():
    """In bfloat16, an output whose products nearly cancel its bias: the bias column sums both in float32 and rounds
    once, within bfloat16's rounding of the small result; rounding the products first (torch.mv, then + bias) would
    be off by up to half a step of 1000 (2.0)."""
    linear = nn.Linear(16, 4).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[:, 0] = torch.tensor([1000.0, 1000.0, 500.0, -1000.0])
        linear.weight[:, 1] = 0.3125
        linear.bias.copy_(torch.tensor([-1000.0, -999.0, -500.0, 1000.0]))
        x = torch.zeros(1, 16, dtype=torch.bfloat16)
        x[0, 0], x[0, 1] = 1.0, 1.0
        got = PackedLinear(linear, MATVEC)(x).double()
        expected = F.linear(x.double(), linear.weight.double(), linear.bias.double())
    assert bool(((got - expected).abs() <= 2 ** -8 * expected.abs()).all()), (got, expected)


def test_matvec_weights_are_padded_rows_holding_the_bias_and_no_copy_without_one():
    """The copy with a bias is (out, in + 1) padded to MATVEC_ROW_MULTIPLE, the bias its column in_features, zeros
    after; without a bias the kernel reads the weight itself (a tied head stays one tensor)."""
    layer = PackedLinear(nn.Linear(24, 8), MATVEC)
    copy = layer.packed_weight()
    width = packed_module.MATVEC_ROW_MULTIPLE * -(-25 // packed_module.MATVEC_ROW_MULTIPLE)
    assert copy.shape == (8, width) and torch.equal(copy[:, :24], layer.weight.detach())
    assert torch.equal(copy[:, 24], layer.bias.detach()) and not bool(copy[:, 25:].any())
    no_bias = PackedLinear(nn.Linear(24, 8, bias=False), MATVEC)
    assert no_bias.packed_weight().data_ptr() == no_bias.weight.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_matvec_layers_rows_copy_runs_several_rows_on_onednn_and_follows_the_weight(dtype):
    """rows_copy: one row on ATen's matvec as before, several rows (a prefill) on a oneDNN-packed copy, the numbers
    of a oneDNN-packed layer bit for bit; made again after an in-place change to the weight. Without rows_copy,
    several rows run F.linear."""
    if not onednn_packs(dtype):
        pytest.skip("oneDNN does not pack this dtype here")
    torch.manual_seed(2)
    linear = nn.Linear(48, 40).to(dtype)
    with_copy, without = PackedLinear(linear, MATVEC, rows_copy=True), PackedLinear(linear, MATVEC)
    reference = PackedLinear(linear, ONEDNN)
    rows, row = torch.randn(2, 7, 48, dtype=dtype), torch.randn(1, 1, 48, dtype=dtype)
    with torch.no_grad():
        for _ in range(2):  # the second time after the weight changed in place
            assert torch.equal(with_copy(rows), reference(rows))
            assert torch.equal(without(rows), F.linear(rows, linear.weight, linear.bias))
            assert torch.equal(with_copy(row), without(row))  # one row: the matvec kernel either way
            linear.weight.mul_(-0.5)
    assert with_copy._rows_packed is not None and without._rows_packed is None
    assert "rows_copy=True" in repr(with_copy)
    assert not PackedLinear(linear, ONEDNN, rows_copy=True).rows_copy  # oneDNN-packed takes every row already


def test_pack_linears_keeps_a_rows_copy_only_when_asked_and_never_for_the_head():
    if not onednn_packs(torch.float32):
        pytest.skip("oneDNN does not pack float32 here")
    for asked in (False, True):
        model = tiny(tie=False)
        note = pack_linears(model, kernel=MATVEC, rows_copy=asked)
        blocks = [m for name, m in model.named_modules() if isinstance(m, PackedLinear) and name != "lm_head"]
        assert len(blocks) == 8 and all(m.rows_copy is asked and (m._rows_packed is not None) is asked
                                        for m in blocks)
        assert not model.lm_head.rows_copy
        assert ("oneDNN-packed copy" in note) is asked
        prompt = torch.tensor([[1, 2, 3, 4, 5]])
        with torch.no_grad():
            logits, _ = model(prompt)  # several rows through every block
        assert torch.isfinite(logits).all()
    assert not PackedLinear(nn.Linear(8, 8), MATVEC).rows_copy
    assert "oneDNN-packed copy" not in pack_linears(tiny(), kernel=ONEDNN, rows_copy=True)

"""model/packed.py: the oneDNN-packed matmul layers compute F.linear's numbers on the same Parameters, follow
every change to the weight, leave training and the state dict as they were, and are chosen by measurement."""
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
from model.packed import PackedLinear, is_packed, onednn_available, onednn_packs, pack_linears, packable_linears

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN (mkldnn) kernels")


def tiny(tie: bool = True, bias: bool = True, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32, bias=bias,
                         tie_embeddings=tie)
    return GPT(config).eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (1, 1, 24), (2, 7, 24)])
def test_packed_layer_equals_f_linear(dtype, bias, shape):
    torch.manual_seed(1)
    linear = nn.Linear(24, 40, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    x = torch.randn(*shape, dtype=dtype)
    with torch.no_grad():
        got = packed(x)
        # the packed kernel ran where this CPU packs the dtype (oneDNN's bfloat16 needs AVX-512), else F.linear
        assert (packed._packed is not None) == onednn_packs(dtype)
        expected = F.linear(x.double(), linear.weight.double(), None if linear.bias is None else linear.bias.double())
    assert got.shape == (*shape[:-1], 40) and got.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.double(), expected, **tol)


def test_packed_copy_follows_in_place_updates_and_training_takes_f_linear():
    linear = nn.Linear(16, 8)
    packed = PackedLinear(linear)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        before = packed(x)
        linear.weight.mul_(2.0)
        linear.bias.mul_(2.0)
        after = packed(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-6)
    # with grad, F.linear runs on the same Parameter: the gradient reaches the nn.Linear's weight
    packed(x).sum().backward()
    assert linear.weight.grad is not None and torch.count_nonzero(linear.weight.grad) > 0


def test_pack_linears_replaces_every_matmul_and_keeps_the_state_dict():
    for tie in (True, False):
        model = tiny(tie=tie)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        names = sorted(f"{id(parent)}.{name}" for parent, name in packable_linears(model))
        assert len(names) == 2 * 4 + 1  # qkv, out, fc_in, fc_out per block, and the head
        assert pack_linears(model, force=True) is not None and is_packed(model)
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
        after = model.state_dict()
        assert list(after) == list(state)
        assert all(torch.equal(after[k], state[k]) for k in state)
        assert (model.lm_head.weight is model.tok_emb.weight) == tie  # a tied head stays tied


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_model_generates_the_same_tokens(dtype):
    plain, packed = tiny(dtype=dtype), tiny(dtype=dtype)
    pack_linears(packed, force=True)
    assert is_packed(packed) == onednn_packs(dtype)
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(3))
    for kv in (True, False):
        a = generate(plain, prompt, 20, temperature=0, use_kv_cache=kv)
        b = generate(packed, prompt, 20, temperature=0, use_kv_cache=kv)
        assert torch.equal(a, b)
    with torch.no_grad():
        idx = torch.randint(0, 97, (1, 12))
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(packed(idx)[0].float(), plain(idx)[0].float(), **tol)


def test_the_measured_faster_kernel_is_chosen():
    timed = []
    def slower_packed(layers):
        timed.append(layers)
        return 1e-4, 2e-4
    model = tiny()
    note = pack_linears(model, measure=slower_packed)
    # the whole of a small model is timed, each matmul layer once in turn, as a decode step runs them
    assert timed[0] == [getattr(parent, name) for parent, name in packable_linears(model)]
    megabytes = sum(layer.weight.numel() * 4 for layer in timed[0]) / 1e6
    assert not is_packed(model) and note == (f"matmul weights left to F.linear: 9 layers in turn ({megabytes:.3g} "
                                             f"MB) 0.1 ms with F.linear, 0.2 ms packed")
    note = pack_linears(model, measure=lambda layers: (2e-4, 1e-4))
    assert is_packed(model) and "prepacked" in note
    untouched = tiny()
    assert "not timed" in pack_linears(untouched, force=False) and not is_packed(untouched)


def test_nothing_left_to_pack_returns_none():
    model = tiny()
    pack_linears(model, force=True)
    assert pack_linears(model, force=True) is None  # every matmul is already a PackedLinear


def test_a_compiled_decode_step_on_a_packed_model_equals_eager_in_one_graph():
    """Inside torch.compile the packed layers are F.linear on the same weights (the compiler cannot trace
    oneDNN's opaque tensors): the compiled step draws eager decoding's tokens, and the step is one graph. A break
    at a packed layer (a test the compiler cannot trace, such as comparing data pointers) leaves every layer after
    it to eager code, frame by frame: small.yaml's shape decoded compiled at 504 tok/s against 788 eagerly that
    way, at 1537 in one graph (benchmarks/RESULTS.md)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    model = tiny()
    pack_linears(model, force=True)
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    counters.clear()
    compiled = generate(model, prompt, 10, temperature=0, compile=True)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(compiled, generate(model, prompt, 10, temperature=0))


def test_a_dtype_this_cpu_cannot_pack_is_left_to_f_linear_whatever_force_says(monkeypatch):
    """On a CPU whose oneDNN cannot pack the weights' dtype (bfloat16 without AVX-512), nothing is packed or timed,
    and the line says why."""
    monkeypatch.setattr(packed_module, "onednn_packs", lambda dtype: False)
    def never(layers):
        raise AssertionError("a kernel that cannot run was timed")
    for force in (None, True):
        model = tiny()
        note = pack_linears(model, force=force, measure=never)
        assert not is_packed(model)
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


def test_time_both_ways_times_one_pass_over_the_layers_each_way():
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
        plain_s, packed_s = packed_module.time_both_ways(layers, clock=lambda: float(calls["n"]))
    # (where this CPU cannot pack float32, each packed call runs F.linear as well, which this clock also counts)
    assert (plain_s, packed_s) == (3.0, 3.0 if onednn_packs(torch.float32) else 6.0)

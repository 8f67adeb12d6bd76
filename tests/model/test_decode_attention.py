"""model/decode_attention.py on native/decode_attention.c: one decoded query's attention over a cache equals a
float64 computation to float32's precision at any shape (rows, grouped heads, head sizes off the 16 lanes, lengths,
strided q, bfloat16 or float32 in), its bfloat16 output is its float32 output rounded once, the thread count does
not change a bit, a non-finite score gives NaN to its head only; `takes` refuses what the C file cannot read; the
module path and the flat step call it where a layer has it and never where it has none; use_decode_attention keeps
it only where it timed faster, and a cache then stays in the model's dtype."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import model.decode_attention as decode_attention
from model import GPT, ModelConfig
from model.decode import EagerDecodeStep
from model.decode_attention import DecodeAttention, use_decode_attention
from model.generate import decode_cache_dtype, generate
from native.build import decode_attention_library


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in float64, kv heads repeated for their groups: (B, n_head, 1, D)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    weights = torch.softmax(q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return weights @ v


def cache_views(batch: int, n_kv_head: int, slots: int, length: int, head_dim: int, dtype: torch.dtype,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v (B, n_kv_head, length, D): the written prefix of one (2, B, n_kv_head, slots, D) buffer, as a KVCache
    holds them."""
    kv = torch.randn(2, batch, n_kv_head, slots, head_dim, generator=generator).to(dtype)
    return kv[0].narrow(2, 0, length), kv[1].narrow(2, 0, length)


def query_view(batch: int, n_head: int, n_kv_head: int, head_dim: int, dtype: torch.dtype, scale: float,
               generator: torch.Generator) -> torch.Tensor:
    """q (B, n_head, 1, D) as the decode step has it: a transposed view of the qkv projection's output."""
    qkv = torch.randn(batch, 1, n_head + 2 * n_kv_head, head_dim, generator=generator) * scale
    return qkv.to(dtype).narrow(2, 0, n_head).transpose(1, 2)


@settings(max_examples=80, deadline=None)
@given(batch=st.integers(1, 3), n_kv_head=st.integers(1, 3), group=st.integers(1, 3), head_dim=st.integers(1, 80),
       length=st.integers(1, 40), extra_slots=st.integers(0, 5), q_bf16=st.booleans(), cache_bf16=st.booleans(),
       spread=st.floats(-3, 1.5), seed=st.integers(0, 2**16))
def test_it_equals_float64_attention_at_any_shape(attention_lib, batch, n_kv_head, group, head_dim, length,
                                                   extra_slots, q_bf16, cache_bf16, spread, seed):
    """Scores from near-uniform weights to one key taking nearly all (q scaled by 10^spread): within float32's
    rounding of the scores, which the softmax carries into the weights, relative to the largest |score| and |v|;
    the bfloat16 output is the float32 one rounded once."""
    generator = torch.Generator().manual_seed(seed)
    n_head = n_kv_head * group
    q_dtype = torch.bfloat16 if q_bf16 else torch.float32
    q = query_view(batch, n_head, n_kv_head, head_dim, q_dtype, 10.0 ** spread, generator)
    k, v = cache_views(batch, n_kv_head, length + extra_slots, length, head_dim,
                       torch.bfloat16 if cache_bf16 else torch.float32, generator)
    kernel = DecodeAttention(attention_lib)
    assert kernel.takes(q, k, v)
    out = kernel(q, k, v)
    assert out.shape == (batch, n_head, 1, head_dim) and out.dtype == q_dtype and out.is_contiguous()
    wide = kernel(q.float(), k, v)  # the same numbers in: q widened exactly
    expected = reference(q, k, v)
    score_size = (q.double().abs() @ k.double().abs().repeat_interleave(group, 1).transpose(-1, -2)).amax() \
        / head_dim ** 0.5
    tolerance = 2e-6 * (1 + score_size) * v.double().abs().amax()
    assert float((wide.double() - expected).abs().max()) <= tolerance
    assert torch.equal(out, wide.to(q_dtype))


def test_the_thread_count_does_not_change_a_bit(attention_lib):
    generator = torch.Generator().manual_seed(0)
    q = query_view(2, 12, 4, 64, torch.bfloat16, 1.0, generator)
    k, v = cache_views(2, 4, 300, 257, 64, torch.bfloat16, generator)
    kernel, threads = DecodeAttention(attention_lib), torch.get_num_threads()
    try:
        outs = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outs.append(kernel(q, k, v))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], out) for out in outs[1:])


def test_one_key_gives_its_value_exactly(attention_lib):
    generator = torch.Generator().manual_seed(1)
    q = query_view(1, 4, 2, 24, torch.float32, 5.0, generator)
    k, v = cache_views(1, 2, 8, 1, 24, torch.float32, generator)
    assert torch.equal(DecodeAttention(attention_lib)(q, k, v), v.repeat_interleave(2, dim=1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_key_gives_nan_to_the_heads_that_read_it_only(attention_lib, bad):
    generator = torch.Generator().manual_seed(2)
    q = query_view(1, 4, 2, 16, torch.float32, 1.0, generator)
    k, v = cache_views(1, 2, 6, 6, 16, torch.float32, generator)
    k[0, 1, 3, 5] = bad  # kv head 1: query heads 2 and 3
    out = DecodeAttention(attention_lib)(q, k, v)
    assert bool(out[:, 2:].isnan().all()) and bool(out[:, :2].isfinite().all())
    assert torch.allclose(out[:, :2].double(), reference(q, k, v)[:, :2], atol=1e-6)


def test_takes_only_what_the_c_file_reads(attention_lib):
    generator = torch.Generator().manual_seed(3)
    q = query_view(1, 4, 2, 16, torch.float32, 1.0, generator)
    k, v = cache_views(1, 2, 6, 5, 16, torch.float32, generator)
    takes = DecodeAttention(attention_lib).takes
    assert takes(q, k, v)
    assert not takes(q.double(), k, v)  # float64 q
    assert not takes(q, k.double(), v.double())  # a float64 cache
    assert not takes(q, k, v.to(torch.bfloat16))  # k and v of two dtypes
    assert not takes(q, k, v.contiguous())  # the same shape, other strides
    assert not takes(q, k[..., ::2], v[..., ::2])  # head_dim not contiguous
    assert not takes(q.transpose(1, 2).contiguous().transpose(1, 2)[..., ::2], k[..., :8], v[..., :8])
    assert not takes(torch.cat([q, q], dim=2), k, v)  # two queries: a prefill
    assert not takes(q[:, :3], k, v)  # 3 query heads over 2 kv heads
    assert not takes(q, k[:, :, :0], v[:, :, :0])  # nothing written


def tiny(dtype: torch.dtype) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=48, block_size=24, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pos="rope",
                         attn_impl="sdpa")
    model = GPT(config).eval().to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


class Counting(DecodeAttention):
    """The real kernel, its calls counted: the module path's (through over) and a bound layer's alike."""

    def __init__(self, lib):
        super().__init__(lib)
        self.calls = 0

    def over(self, q, k, v):
        return CountedBound(super().over(q, k, v), self)


class CountedBound:
    """A bound call whose calls, plain or writing the new row, count on `counting`."""

    def __init__(self, bound, counting: Counting):
        self.bound, self.counting = bound, counting

    def __call__(self, q, length):
        self.counting.calls += 1
        return self.bound(q, length)

    def write_and_attend(self, q, length, *new_rows):
        self.counting.calls += 1
        return self.bound.write_and_attend(q, length, *new_rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_module_path_and_the_flat_step_run_each_layers_decoded_query_on_it(attention_lib, dtype):
    """A prefill of 5 tokens never calls it; one decoded token calls it once a layer, through the modules and
    through the flat step alike, both giving the same logits, those of the fused kernel to the model dtype's
    rounding; a layer without it never calls it."""
    model, tokens = tiny(dtype), torch.randint(0, 48, (2, 6), generator=torch.Generator().manual_seed(4))
    logits = {}
    for name in ("fused", "modules", "flat"):
        counting = Counting(attention_lib)
        for block in model.blocks:
            block.attn.decode_kernel = None if name == "fused" else counting
        model.setup_kv_cache(2, 24, dtype=dtype)
        with torch.inference_mode():
            model(tokens[:, :5], input_pos=torch.arange(5))
            assert counting.calls == 0
            if name == "flat":
                logits[name] = EagerDecodeStep(model)(tokens[:, 5:], 5)
            else:
                logits[name] = model(tokens[:, 5:], input_pos=torch.tensor([5]))[0]
        model.clear_kv_cache()
        assert counting.calls == (0 if name == "fused" else len(model.blocks))
    assert torch.equal(logits["flat"], logits["modules"])
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    assert torch.allclose(logits["modules"].float(), logits["fused"].float(), atol=tolerance)


def test_generate_runs_every_decoded_token_on_it(attention_lib):
    model = tiny(torch.bfloat16)
    counting = Counting(attention_lib)
    for block in model.blocks:
        block.attn.decode_kernel = counting
    generate(model, torch.zeros(1, 3, dtype=torch.long), 6, temperature=0)
    assert counting.calls == 5 * len(model.blocks)  # 6 new tokens: the first from the prefill


def test_a_deep_copied_model_shares_the_kernel(attention_lib):
    model = tiny(torch.float32)
    kernel = DecodeAttention(attention_lib)
    model.blocks[0].attn.decode_kernel = kernel
    assert copy.deepcopy(model).blocks[0].attn.decode_kernel is kernel


@pytest.mark.parametrize("ours_faster", [True, False])
def test_use_decode_attention_keeps_it_only_where_it_timed_faster(attention_lib, monkeypatch, ours_faster):
    timed = []

    def seconds(kernel, dtype, batch_size, n_head, n_kv_head, head_dim, length):
        timed.append((dtype, batch_size, n_head, n_kv_head, head_dim, length))
        return (1e-6, 2e-6) if ours_faster else (2e-6, 1e-6)
    monkeypatch.setattr(decode_attention, "decode_attention_seconds", seconds)
    model = tiny(torch.bfloat16)
    note = use_decode_attention(model, attention_lib, 3, 21)
    assert timed == [(torch.bfloat16, 3, 4, 2, 8, 10)]  # the mean context of 21 slots
    kernels = {id(block.attn.decode_kernel) for block in model.blocks}
    assert len(kernels) == 1  # one kernel for every layer, or none for all
    assert (model.blocks[0].attn.decode_kernel is not None) == ours_faster
    assert note.startswith("decode attention on attngpt's kernel" if ours_faster else
                           "decode attention without attngpt's kernel") and "1 us a layer against 2" in note \
        if ours_faster else "2 us a layer against 1" in note
    # the cache stays in the model's dtype only where the kernel runs (else the fused kernel's own choice)
    monkeypatch.setattr("model.generate.float32_attention_faster", lambda *a: True)
    assert decode_cache_dtype(model, 3, 21) == (torch.bfloat16 if ours_faster else torch.float32)


def test_use_decode_attention_without_a_library_or_for_float64_sets_none(attention_lib):
    model = tiny(torch.float32)
    model.blocks[1].attn.decode_kernel = DecodeAttention(attention_lib)
    assert "without attngpt's kernel: not built here" in use_decode_attention(model, None, 1, 16)
    assert all(block.attn.decode_kernel is None for block in model.blocks)
    assert "not for cpu float64" in use_decode_attention(tiny(torch.float64), attention_lib, 1, 16)


def test_the_timing_runs_the_kernel_and_the_fused_kernels(attention_lib):
    ours, fused = decode_attention.decode_attention_seconds(DecodeAttention(attention_lib), torch.bfloat16, 1, 4, 2,
                                                            16, 12)
    assert 0 < ours < 1 and 0 < fused < 1


def test_a_bound_call_reads_the_cache_as_it_is_now_and_q_at_its_own_strides(attention_lib):
    """over() binds a layer's cache once (the flat step's way); written on afterwards, read at a longer length, with
    q laid out two ways, each call gives what an unbound call on the same tensors gives."""
    generator = torch.Generator().manual_seed(5)
    kv = torch.zeros(2, 2, 2, 12, 16, dtype=torch.bfloat16)  # (2, B, n_kv_head, slots, D), as a KVCache holds it
    kernel = DecodeAttention(attention_lib)
    bound = kernel.over(query_view(2, 4, 2, 16, torch.bfloat16, 1.0, generator), kv[0, :, :, :1], kv[1, :, :, :1])
    for length in (1, 5, 12):
        kv[:, :, :, length - 1].copy_(torch.randn(2, 2, 2, 16, generator=generator))
        for q in (query_view(2, 4, 2, 16, torch.bfloat16, 1.0, generator),
                  torch.randn(2, 4, 1, 16, generator=generator).to(torch.bfloat16)):
            k, v = kv[0, :, :, :length], kv[1, :, :, :length]
            assert torch.equal(bound(q, length), kernel(q, k, v))
            assert torch.allclose(bound(q, length).double(), reference(q, k, v), atol=1e-2)


@pytest.mark.parametrize("model_dtype, cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                      (torch.float32, torch.bfloat16), (torch.float32, torch.float32)])
def test_write_and_attend_writes_the_slot_as_copy_would_then_attends(attention_lib, model_dtype, cache_dtype):
    """Rows of a (B, 1, heads of q|k|v, D) projection: the slot gets what copy_ writes (widened exactly, or rounded
    to nearest even, a NaN a NaN), the other slots nothing, and the attention is a plain call's
    over the written cache; a plain call afterwards writes nothing."""
    generator = torch.Generator().manual_seed(6)
    batch, n_head, n_kv_head, head_dim, pos = 2, 4, 2, 16, 3
    qkv = torch.randn(batch, 1, n_head + 2 * n_kv_head, head_dim, generator=generator).to(model_dtype)
    qkv[1, 0, n_head, 5] = float("nan")  # row 1's first new key: NaN, a cache write like any other
    kv = torch.randn(2, batch, n_kv_head, 8, head_dim, generator=generator).to(cache_dtype)
    expected_cache = kv.clone()
    expected_cache[0, :, :, pos].copy_(qkv[:, 0, n_head:n_head + n_kv_head])
    expected_cache[1, :, :, pos].copy_(qkv[:, 0, n_head + n_kv_head:])
    kernel = DecodeAttention(attention_lib)
    q = qkv.narrow(2, 0, n_head).transpose(1, 2)
    bound = kernel.over(q, kv[0, :, :, :1], kv[1, :, :, :1])
    size = qkv.element_size()
    out = bound.write_and_attend(q, pos + 1, qkv.data_ptr() + n_head * head_dim * size, qkv.stride(0),
                                 qkv.data_ptr() + (n_head + n_kv_head) * head_dim * size, qkv.stride(0))
    # bit for bit, and NaN where copy_ writes one (whose bits torch's own conversions do not agree on)
    bits = torch.int16 if cache_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(kv.isnan(), expected_cache.isnan()) and int(kv.isnan().sum()) == 1
    assert torch.equal(kv.nan_to_num(0.0).view(bits), expected_cache.nan_to_num(0.0).view(bits))
    k, v = kv[0, :, :, :pos + 1], kv[1, :, :, :pos + 1]
    assert torch.equal(out[0], kernel(q, k, v)[0])  # row 0 (row 1's kv head 0 reads the NaN: NaN there)
    assert bool(out[1, :2].isnan().all()) and bool(out[1, 2:].isfinite().all())
    written = kv.clone()
    bound(q, pos + 1)
    assert torch.equal(kv.view(bits), written.view(bits))

"""The flat eager decode step (model/decode.py): the module path's logits and cache writes bit for bit, for generated
configurations (positions, norms, MLPs, heads, dtypes, cache dtypes, batch, packed and int8 layers, head patches,
the attention kernel setting, attention on native/decode_attention.c); where it applies and where the modules run instead; copies derived from a weight
rebuilt once it changes; and generate taking it once per decoded token."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import model.decode as decode_module
from model import GPT, ModelConfig
from model.decode import EagerDecodeStep
from model.decode_attention import DecodeAttention
from model.generate import generate
from model.gpt import HEAD_COLUMNS_MAX_ROWS, HeadPatch, KVCache
from model.packed import MATVEC, ONEDNN, onednn_packs, pack_linears
from native.build import decode_attention_library, int8_matvec_library
from model.quantize import Int8Linear, quantize_int8


def lively(dtype: torch.dtype = torch.float32, seed: int = 0, **overrides) -> GPT:
    """A tiny GPT in eval mode with weights large enough that every layer moves the logits."""
    torch.manual_seed(seed)
    config = dict(vocab_size=48, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32, attn_impl="sdpa")
    model = GPT(ModelConfig(**{**config, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.to(dtype)


def cache_buffers(model: GPT) -> list[torch.Tensor]:
    """Every layer's k and v cache buffers, in order."""
    return [t for block in model.blocks for t in (block.attn.kv_cache.k_cache, block.attn.kv_cache.v_cache)]


def both_steps(model: GPT, batch: int, pos: int, cache_dtype: torch.dtype, seed: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(module path logits, flat step logits, caches after each) for one token at `pos` after a prefill of
    positions 0..pos-1, both from the same cache contents."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch, pos + 1), generator=generator)
    model.setup_kv_cache(batch, model.config.block_size, dtype=cache_dtype)
    try:
        with torch.inference_mode():
            if pos:
                model(prompt[:, :pos], input_pos=torch.arange(pos))
            before = [t.clone() for t in cache_buffers(model)]
            expected = model(prompt[:, pos:], input_pos=torch.tensor([pos]))[0]
            after_modules = [t.clone() for t in cache_buffers(model)]
            for buffer, prefilled in zip(cache_buffers(model), before):  # back to the prefill's contents
                buffer.copy_(prefilled)
            assert EagerDecodeStep.applies(model)
            got = EagerDecodeStep(model)(prompt[:, pos:], pos)
            after_flat = [t.clone() for t in cache_buffers(model)]
    finally:
        model.clear_kv_cache()
    return expected, got, after_modules, after_flat


DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
          (torch.float32, torch.bfloat16)]


@settings(max_examples=100, deadline=None)
@given(pos_kind=st.sampled_from(["learned", "rope"]), norm=st.sampled_from(["layernorm", "rmsnorm"]),
       mlp=st.sampled_from(["gelu", "swiglu"]), heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 1)]),
       dtypes=st.sampled_from(DTYPES), bias=st.booleans(), tie=st.booleans(),
       batch=st.sampled_from([1, 2, 3, HEAD_COLUMNS_MAX_ROWS + 1]), pos=st.integers(0, 14),
       layers=st.sampled_from(["float", "packed", "matvec", "matvec rows", "int8", "int8 native", "int8-dynamic"]),
       int8_head=st.booleans(),
       patch=st.booleans(), float32_kernel=st.booleans(), decode_kernel=st.booleans(), seed=st.integers(0, 2**16))
def test_the_flat_step_gives_the_module_paths_logits_and_cache_writes(pos_kind, norm, mlp, heads, dtypes, bias, tie,
                                                                      batch, pos, layers, int8_head, patch,
                                                                      float32_kernel, decode_kernel, seed):
    (n_head, n_kv_head), (dtype, cache_dtype) = heads, dtypes
    model = lively(dtype, seed, pos=pos_kind, norm=norm, mlp=mlp, n_head=n_head, n_kv_head=n_kv_head,
                   d_model=8 * n_head, bias=bias, tie_embeddings=tie)
    if layers in ("packed", "matvec", "matvec rows"):
        pack_linears(model, kernel=ONEDNN if layers == "packed" else MATVEC, rows_copy=layers == "matvec rows")
    elif layers != "float":
        quantize_int8(model, layers.split()[0], lm_head=int8_head)
        for layer in model.modules():  # single rows on native/int8_matvec.c or not, whichever was timed faster
            if isinstance(layer, Int8Linear):
                layer.use_native_kernel(int8_matvec_library() if layers == "int8 native" else None)
    if patch:
        keep = torch.rand(1, n_head, generator=torch.Generator().manual_seed(seed)) > 0.5
        model.blocks[-1].attn.head_patch = HeadPatch(keep)
    if float32_kernel:
        model.set_attention_kernel("fused float32")
    if decode_kernel and decode_attention_library() is not None:  # native/decode_attention.c for every layer
        for block in model.blocks:
            block.attn.decode_kernel = DecodeAttention(decode_attention_library())
    expected, got, after_modules, after_flat = both_steps(model, batch, pos, cache_dtype, seed)
    assert got.shape == (batch, 1, model.config.vocab_size) and got.dtype == expected.dtype
    assert torch.equal(got, expected)
    assert all(torch.equal(a, b) for a, b in zip(after_flat, after_modules))


@pytest.mark.parametrize("batch", [HEAD_COLUMNS_MAX_ROWS, HEAD_COLUMNS_MAX_ROWS + 1])
def test_the_head_is_multiplied_as_the_module_path_does_at_either_side_of_its_row_limit(batch):
    """Up to HEAD_COLUMNS_MAX_ROWS rows a CPU decode step multiplies by the head's column-major copy, beyond by
    F.linear (GPT.logits): two summation orders, whose float32 products can differ in their last bits (with one
    thread they agree here, so which one ran is read from whether the copy was made)."""
    model = lively(d_model=64)
    expected, got, _, _ = both_steps(model, batch, 3, torch.float32)
    assert torch.equal(got, expected)
    model.__dict__.pop("_head_columns", None)
    model.setup_kv_cache(batch, 8)
    try:
        with torch.inference_mode():
            EagerDecodeStep(model)
    finally:
        model.clear_kv_cache()
    assert ("_head_columns" in model.__dict__) == (batch <= HEAD_COLUMNS_MAX_ROWS)


@pytest.mark.parametrize("kind", ["packed", "matvec weight", "matvec bias", "matvec rows", "head columns"])
def test_a_weight_changed_between_steps_is_read_as_it_is_now(kind):
    """A copy derived from a weight (the oneDNN-packed one, the matvec one that holds the bias too, the LM head's
    column-major one, a matvec layer's oneDNN-packed rows copy at a batch of 2) is checked at every step: a weight
    or bias changed in place after the step was built gives the module path's logits for the new one."""
    if kind in ("packed", "matvec rows") and not onednn_packs(torch.float32):
        pytest.skip("oneDNN does not pack float32 weights here")
    model = lively(bias=True)
    if kind != "head columns":
        pack_linears(model, kernel=ONEDNN if kind == "packed" else MATVEC, rows_copy=kind == "matvec rows")
    qkv = model.blocks[0].attn.qkv_proj
    changed = {"packed": qkv.weight, "matvec weight": qkv.weight, "matvec bias": qkv.bias, "matvec rows": qkv.weight,
               "head columns": model.lm_head.weight}[kind]
    batch = 2 if kind == "matvec rows" else 1
    token = torch.tensor([[3]] * batch)
    model.setup_kv_cache(batch, 8)
    try:
        with torch.inference_mode():
            step = EagerDecodeStep(model)
            step(token, 0)
            with torch.inference_mode(False), torch.no_grad():
                changed.mul_(-2.0)  # in place, as a training step inside on_token would
            got = step(token, 1)
            expected = model(token, input_pos=torch.tensor([1]))[0]
    finally:
        model.clear_kv_cache()
    assert torch.equal(got, expected)


def test_a_norm_weight_changed_in_place_is_read_by_reference():
    model = lively()
    token = torch.tensor([[5]])
    model.setup_kv_cache(1, 8)
    try:
        with torch.inference_mode():
            step = EagerDecodeStep(model)
            first = step(token, 0)
            with torch.inference_mode(False), torch.no_grad():
                model.final_norm.weight.mul_(3.0)
            again = step(token, 0)
            expected = model(token, input_pos=torch.tensor([0]))[0]
    finally:
        model.clear_kv_cache()
    assert torch.equal(again, expected) and not torch.equal(again, first)


def test_a_position_outside_the_cache_is_refused_and_nothing_is_written():
    model = lively()
    model.setup_kv_cache(1, 4)
    try:
        with torch.inference_mode():
            step = EagerDecodeStep(model)
            for outside in (4, -1):
                with pytest.raises(IndexError, match="outside the cache"):
                    step(torch.tensor([[1]]), outside)
            assert not any(buffer.any() for buffer in cache_buffers(model))
    finally:
        model.clear_kv_cache()


def hooked(model: GPT):
    return model.blocks[1].mlp.register_forward_hook(lambda module, args, output: None)


def pre_hooked(model: GPT):
    return model.final_norm.register_forward_pre_hook(lambda module, args: None)


def global_hooked(model: GPT):
    return torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)


@pytest.mark.parametrize("case", ["hook", "pre-hook", "global hook", "training", "manual", "grad", "autocast",
                                  "no cache"])
def test_each_condition_alone_keeps_the_modules(case):
    """Each condition of EagerDecodeStep.applies, alone, turns it off."""
    model = lively(attn_impl="manual" if case == "manual" else "sdpa")
    if case != "no cache":
        model.setup_kv_cache(1, 8)
    if case == "training":
        model.train()
    handle = {"hook": hooked, "pre-hook": pre_hooked, "global hook": global_hooked}.get(case, lambda m: None)(model)
    grad = contextlib.nullcontext() if case == "grad" else torch.inference_mode()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if case == "autocast" else contextlib.nullcontext()
    try:
        with grad, autocast:
            assert not EagerDecodeStep.applies(model)
    finally:
        if handle is not None:
            handle.remove()


def test_without_any_of_them_it_applies():
    model = lively()
    model.setup_kv_cache(1, 8)
    for mode in (torch.inference_mode(), torch.no_grad()):
        with mode:
            assert EagerDecodeStep.applies(model)


@pytest.mark.parametrize("attn_impl, hook, expected_steps", [("sdpa", False, 6), ("manual", False, 0),
                                                             ("sdpa", True, 0)])
def test_generate_takes_the_flat_step_at_every_decoded_token_where_it_applies(monkeypatch, attn_impl, hook,
                                                                             expected_steps):
    """7 new tokens: the first from the prefill, then 6 decode steps, each through the flat step (the same tokens
    as the modules give); the from-scratch path or a hook keeps every step on the modules."""
    model = lively(attn_impl=attn_impl)
    if hook:
        hooked(model)
    prompt = torch.randint(0, 48, (2, 5), generator=torch.Generator().manual_seed(1))
    calls = []
    original = EagerDecodeStep.__call__
    monkeypatch.setattr(EagerDecodeStep, "__call__", lambda self, *a: calls.append(a[1]) or original(self, *a))
    got = generate(model, prompt, 7, temperature=0.0)
    assert calls == list(range(5, 5 + expected_steps))
    monkeypatch.setattr(decode_module.EagerDecodeStep, "applies", staticmethod(lambda model: False))
    assert torch.equal(got, generate(model, prompt, 7, temperature=0.0))


def test_kv_cache_one_slot_update_refuses_a_slot_outside_the_buffer_and_leaves_it_unchanged():
    cache = KVCache(1, 2, 4, 3)
    row = torch.ones(1, 2, 1, 3)
    for outside in (4, -1):
        with pytest.raises(IndexError):
            cache.update(torch.tensor([outside]), row, row)
    assert not cache.k_cache.any() and not cache.v_cache.any()
    cache.update(torch.tensor([3]), row, 2 * row)
    assert torch.equal(cache.k_cache[:, :, 3:], row) and torch.equal(cache.v_cache[:, :, 3:], 2 * row)
    assert not cache.k_cache[:, :, :3].any()

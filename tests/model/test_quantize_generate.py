"""Decoding a quantized model: on a small model whose predictions are peaked (trained here for a few dozen steps
on a repeating string, so each next token wins by a wide margin), int8 greedy text is float32's; the KV cache
gives the tokens recomputing the window gives; compiled decoding gives eager decoding's tokens."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

from model import GPT, ModelConfig
from model.generate import generate
from native.build import int8_matvec_library
from model.quantize import Int8Linear, quantize_int8

TEXT = [int(c) for c in "0123456789" * 20]  # a cycle of 10 tokens
VARIANTS = [("int8", torch.bfloat16), ("int8", torch.float32), ("int8 native", torch.bfloat16),
            ("int8 native", torch.float32), ("int8-dynamic", torch.float32), ("int8-dynamic", torch.bfloat16)]


@pytest.fixture(scope="module")
def peaked() -> GPT:
    """2 layers x 32 wide, trained until the cycle is predicted with near certainty."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=16, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa", tie_embeddings=False))
    data = torch.tensor(TEXT)
    windows = torch.stack([data[i:i + 33] for i in range(0, 160, 5)])  # (32, 33)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        _, loss = model(windows[:, :-1], windows[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, loss.item()
    return model.eval()


def quantized(model: GPT, mode: str, dtype: torch.dtype, lm_head: bool) -> GPT:
    """A copy in dtype, quantized; mode "int8 native": weight-only with single rows on native/int8_matvec.c (where
    it can be built here), "int8": without it."""
    copy_ = copy.deepcopy(model).to(dtype)
    quantize_int8(copy_, mode.split()[0], lm_head=lm_head)
    for layer in copy_.modules():
        if isinstance(layer, Int8Linear):
            layer.use_native_kernel(int8_matvec_library() if mode == "int8 native" else None)
    return copy_


PROMPT = torch.tensor([[3, 4, 5, 6]])


@pytest.mark.parametrize("mode,dtype", VARIANTS)
@pytest.mark.parametrize("lm_head", [False, True])
def test_greedy_tokens_are_float32s_and_the_cache_changes_nothing(peaked, mode, dtype, lm_head):
    reference = generate(peaked, PROMPT, 40, temperature=0.0)  # float32: 4 + 40 > 32, the window slides once
    assert reference[0, 4:].tolist() == [(7 + i) % 10 for i in range(40)]  # the model does continue the cycle
    model = quantized(peaked, mode, dtype, lm_head)
    cached = generate(model, PROMPT, 40, temperature=0.0)
    assert torch.equal(cached, reference)
    assert torch.equal(generate(model, PROMPT, 40, temperature=0.0, use_kv_cache=False), cached)


@pytest.mark.parametrize("mode,dtype", [("int8", torch.bfloat16), ("int8-dynamic", torch.float32)])
def test_compiled_decoding_gives_eager_tokens(peaked, mode, dtype):
    model = quantized(peaked, mode, dtype, lm_head=True)
    eager = generate(model, PROMPT, 12, temperature=0.0)
    torch._dynamo.reset()
    compiled = generate(model, PROMPT, 12, temperature=0.0, compile=True)
    assert torch.equal(compiled, eager)
    sampled = dict(temperature=0.9, top_k=5)
    assert torch.equal(generate(model, PROMPT, 8, compile=True, generator=torch.Generator().manual_seed(3), **sampled),
                       generate(model, PROMPT, 8, generator=torch.Generator().manual_seed(3), **sampled))

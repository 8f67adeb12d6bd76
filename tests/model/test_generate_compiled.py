"""The compiled decode step (generate(compile=True)) draws exactly the tokens of eager decoding, across a
window slide, with one graph for every position; a second generate() call reuses that graph instead of
compiling again. On a CPU the step reads only the written prefix of the cache."""
from __future__ import annotations

import torch
import torch._dynamo

from model import GPT, ModelConfig
from model.generate import compiled_decode_step, generate


def test_compiled_decoding_equals_eager_and_compiles_once():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa")).eval()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    eager = generate(model, prompt, 20, temperature=0.0)  # 5 + 20 > 16: the window slides once
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = generate(model, prompt, 20, temperature=0.0, compile=True)
    assert torch.equal(compiled, eager)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == before + 1  # positions 5..15, then 8..15 after the slide: all through one graph
    sampled = generate(model, prompt, 12, temperature=0.9, top_k=10, compile=True,
                       generator=torch.Generator().manual_seed(3))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompilation
    assert torch.equal(sampled, generate(model, prompt, 12, temperature=0.9, top_k=10,
                                         generator=torch.Generator().manual_seed(3)))


def test_on_a_cpu_the_compiled_step_is_built_once_and_multiplies_by_the_head_columns(monkeypatch):
    """The step is kept on the model (a second call returns it, compiled code and all), and on a CPU its
    logits come from GPT.head_columns(), looked up at every call: a head planted there is what multiplies
    the final hidden state, not lm_head."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, d_model=32, attn_impl="sdpa")).eval()
    step = compiled_decode_step(model)
    assert compiled_decode_step(model) is step
    planted = torch.randn(32, 40, generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(model, "head_columns", lambda: planted)
    prompt, token, pos = torch.randint(0, 40, (1, 5)), torch.tensor([[7]]), torch.tensor([5])
    model.setup_kv_cache(1, 16)
    try:
        with torch.no_grad():
            model(prompt, input_pos=torch.arange(5))
            hidden, _ = model._hidden(token, pos)  # (1, 1, 32): writes position 5, as the step will again
            logits = step(token, pos)
    finally:
        model.clear_kv_cache()
    torch.testing.assert_close(logits, hidden @ planted, atol=1e-4, rtol=1e-4)


def test_on_a_cpu_the_compiled_step_never_reads_the_unwritten_slots():
    """The slots past the written prefix hold NaN: a step attending over the whole buffer would turn them into
    NaN outputs (masked weights are 0, but 0 * NaN is NaN); the prefix-reading step matches eager decoding."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa")).eval()
    step = compiled_decode_step(model)
    prompt = torch.randint(0, 40, (1, 5), generator=torch.Generator().manual_seed(1))
    model.setup_kv_cache(1, 16)
    try:
        with torch.no_grad():
            model(prompt, input_pos=torch.arange(5))
            for block in model.blocks:
                block.attn.kv_cache.k_cache[:, :, 5:] = float("nan")
                block.attn.kv_cache.v_cache[:, :, 5:] = float("nan")
            token, pos = torch.tensor([[7]]), torch.tensor([5])
            logits = step(token, pos)  # writes position 5 and reads 0..5
            expected, _ = model(token, input_pos=pos)  # eager: the same write, the same prefix
    finally:
        model.clear_kv_cache()
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)

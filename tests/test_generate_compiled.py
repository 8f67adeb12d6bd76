"""The compiled decode step (generate(compile=True)) draws exactly the tokens of eager decoding, across a
window slide, and a second generate() call reuses the compiled graph instead of compiling again."""
from __future__ import annotations

import torch
import torch._dynamo

from model import GPT, ModelConfig
from model.generate import generate


def test_compiled_decoding_equals_eager_and_compiles_once():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa")).eval()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    eager = generate(model, prompt, 20, temperature=0.0)  # 5 + 20 > 16: the window slides once
    torch._dynamo.reset()
    compiled = generate(model, prompt, 20, temperature=0.0, compile=True)
    assert torch.equal(compiled, eager)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    sampled = generate(model, prompt, 12, temperature=0.9, top_k=10, compile=True,
                       generator=torch.Generator().manual_seed(3))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompilation
    assert torch.equal(sampled, generate(model, prompt, 12, temperature=0.9, top_k=10,
                                         generator=torch.Generator().manual_seed(3)))

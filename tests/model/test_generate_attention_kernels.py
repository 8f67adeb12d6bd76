"""model.generate.eager_attention_kernels: eager decoding on CUDA never takes cuDNN's attention (a plan built for
every new key length, one per token); elsewhere PyTorch's choice stands. Every eager pass of generate() runs
under it: the prefill, each decode step, a window's slide, and the recompute path without a KV cache."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import model.generate as generate_module
from model import GPT, ModelConfig
from model.generate import eager_attention_kernels, generate

FLAGS = {"cudnn": torch.backends.cuda.cudnn_sdp_enabled, "flash": torch.backends.cuda.flash_sdp_enabled,
         "efficient": torch.backends.cuda.mem_efficient_sdp_enabled, "math": torch.backends.cuda.math_sdp_enabled}


def flags() -> dict[str, bool]:
    return {name: read() for name, read in FLAGS.items()}


def test_on_cuda_every_kernel_but_cudnn_and_the_flags_restored_after():
    before = flags()
    with eager_attention_kernels(torch.device("cuda")):
        assert flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert flags() == before


def test_on_a_cpu_nothing_is_changed():
    before = flags()
    with eager_attention_kernels(torch.device("cpu")):
        assert flags() == before


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_every_eager_pass_of_generate_runs_without_cudnn(monkeypatch, use_kv_cache):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=8, n_layer=2, n_head=2, d_model=16,
                            attn_impl="sdpa")).eval()
    prompt = torch.randint(0, 40, (1, 3))
    expected = generate(model, prompt, 12, temperature=0, use_kv_cache=use_kv_cache)  # slides past block_size 8
    # the CUDA rule applied to this CPU run; the kernel records the flags of each call it serves
    monkeypatch.setattr(generate_module, "eager_attention_kernels",
                        lambda device: eager_attention_kernels(torch.device("cuda")))
    seen = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(torch.backends.cuda.cudnn_sdp_enabled()) or sdpa(*a, **k))
    got = generate(model, prompt, 12, temperature=0, use_kv_cache=use_kv_cache)
    assert torch.equal(got, expected)  # the same tokens: the rule chooses kernels, not results
    assert len(seen) == 12 * model.config.n_layer  # a prefill, 11 steps (one a slide's prefill): 2 layers each
    assert not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored once generate returns

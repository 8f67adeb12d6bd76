"""benchmarks/train_throughput.py's variants, no speed asserted: nanoGPT's GPU step (bf16 autocast, compile) is
what its name says, and a forced flash kernel is held only where flash has a kernel (16-bit variants)."""
from __future__ import annotations

import sys

import torch

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _variants import parse_variants  # noqa: E402  (benchmarks/ on the path first)
from nanogpt_reference import NanoGPT, NanoShape, train_step  # noqa: E402
from train_throughput import sdpa_backend_of  # noqa: E402


def test_nanogpt_gpu_baseline_parses_as_bf16_compiled_and_the_cpu_one_as_fp32_eager():
    cpu, gpu = parse_variants("nanogpt,nanogpt-bf16-compile", with_compile=False)
    assert (cpu.preset, cpu.dtype, cpu.compile) == (None, "fp32", False)
    assert (gpu.preset, gpu.dtype, gpu.compile) == (None, "bf16", True)


def test_flash_is_forced_on_16_bit_sdpa_variants_only():
    fp32, bf16, manual = parse_variants("gpt2-sdpa-fp32,gpt2-sdpa-bf16,gpt2-manual-bf16", with_compile=False)
    assert sdpa_backend_of(fp32, "flash") == "auto"  # flash has no float32 kernel
    assert sdpa_backend_of(bf16, "flash") == "flash"
    assert sdpa_backend_of(fp32, "efficient") == "efficient"  # the exception is flash's alone
    assert sdpa_backend_of(manual, "flash") == "auto"  # no sdpa call to hold


def tiny_nanogpt() -> tuple[NanoGPT, torch.Tensor, torch.Tensor]:
    """The same tiny model and batch on every call."""
    torch.manual_seed(0)
    shape = NanoShape(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=2)
    model = NanoGPT(shape)
    x, y = torch.randint(0, shape.vocab_size, (2, 2, 16))
    return model, x, y


def step_loss(autocast: torch.dtype | None) -> float:
    model, x, y = tiny_nanogpt()
    return train_step(model, model.configure_optimizer(), x, y, autocast=autocast)[0]


def test_nanogpt_step_autocast_runs_the_forward_in_bf16():
    model, x, y = tiny_nanogpt()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x, y)[1].item()  # the same forward under autocast, computed here
    with torch.no_grad():
        plain = model(x, y)[1].item()
    assert expected != plain  # bf16 matmuls round differently: the comparison below can tell them apart
    assert step_loss(torch.bfloat16) == expected
    assert step_loss(None) == plain

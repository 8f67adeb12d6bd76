"""model.generate.compile_repays: a CPU compile of the decode step is taken only when the most it can save in
this generation, tokens x (eager step - its matmuls alone), exceeds what a compile costs at the least; a GPU one
(a CUDA graph) only when tokens x the whole eager step exceeds what a GPU compile costs at the least."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from model import GPT, ModelConfig
from model.generate import (CPU_COMPILE_FLOOR_S, GPU_COMPILE_FLOOR_S, TIMED_STEPS, compile_repays,
                            compiled_matmul_seconds, eager_step_seconds, generate)


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32)).eval()


@pytest.mark.parametrize("eager_ms, matmuls_ms, tokens, repays", [
    (20.0, 10.0, 1000, True),  # 10 s saved at most: more than the floor
    (20.0, 10.0, 500, False),  # 5 s
    (20.0, 10.0, round(CPU_COMPILE_FLOOR_S / 0.01), False),  # exactly the floor: not more
    (20.0, 10.0, round(CPU_COMPILE_FLOOR_S / 0.01) + 1, True),
    (10.0, 20.0, 10**6, False),  # eager already beats compiled code's matmuls: nothing to save
])
def test_repays_only_when_the_bound_on_the_saving_exceeds_the_compile(eager_ms, matmuls_ms, tokens, repays):
    got, why = compile_repays(tiny(), 1, tokens, timings=lambda model, batch: (eager_ms / 1e3, matmuls_ms / 1e3))
    assert got is repays
    assert f"{eager_ms:.2f} ms" in why and f"{matmuls_ms:.2f} ms" in why and f"{tokens} tokens" in why


@pytest.mark.parametrize("eager_ms, tokens, repays", [
    (4.0, 128, False),  # GPT-2 small's eager step on an H200: 0.5 s to save, against a compile of seconds
    (4.0, round(GPU_COMPILE_FLOOR_S / 0.004), False),  # exactly the floor: not more
    (4.0, round(GPU_COMPILE_FLOOR_S / 0.004) + 1, True),
    (40.0, 1000, True),
])
def test_on_a_gpu_the_whole_eager_step_is_the_most_a_cuda_graph_saves(eager_ms, tokens, repays):
    # compile_repays reads the model's device and what it keeps on itself: a stand-in for a CUDA model
    on_cuda = SimpleNamespace(tok_emb=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda"))))
    got, why = compile_repays(on_cuda, 1, tokens, timings=lambda model, batch: (eager_ms / 1e3, 0.0))
    assert got is repays
    assert f"{eager_ms:.2f} ms" in why and f"{tokens} tokens" in why and f"{GPU_COMPILE_FLOOR_S:g} s" in why


def test_the_batch_reaches_the_timings_and_a_compiled_model_repays():
    seen = []
    compile_repays(tiny(), 3, 10, timings=lambda model, batch: seen.append(batch) or (1.0, 0.0))
    assert seen == [3]
    model = tiny()
    model.__dict__["_compiled_decode"] = object()  # what compiled_decode_step keeps on the model
    assert compile_repays(model, 1, 1, timings=lambda *a: (0.0, 1.0)) == (True, "already compiled in this process")


def test_the_timings_run_the_model_and_leave_it_as_it_was():
    model = tiny().train()
    eager_s, matmuls_s = eager_step_seconds(model, 2), compiled_matmul_seconds(model, 2)
    assert 0 < eager_s < 10 and 0 < matmuls_s < 10 and math.isfinite(eager_s + matmuls_s)
    assert model.training and model.blocks[0].attn.kv_cache is None  # mode restored, cache cleared
    prompt = torch.randint(0, 50, (1, 4))
    assert generate(model, prompt, 5, temperature=0).shape == (1, 9)  # still generates as before


@pytest.mark.parametrize("attn_impl, flat_steps", [("sdpa", TIMED_STEPS), ("manual", 0)])
def test_the_eager_step_timed_is_the_one_generate_runs(monkeypatch, attn_impl, flat_steps):
    """Where generate decodes through the flat step (model/decode.py), that is the step timed; elsewhere the modules."""
    from model.decode import EagerDecodeStep
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, d_model=32, attn_impl=attn_impl))
    positions = []
    original = EagerDecodeStep.__call__
    monkeypatch.setattr(EagerDecodeStep, "__call__", lambda self, *a: positions.append(a[1]) or original(self, *a))
    with torch.no_grad():  # as compile_repays runs it
        eager_step_seconds(model.eval(), 1)
    assert positions == list(range(1, flat_steps + 1))


def test_an_int8_dynamic_models_matmuls_are_timed_on_the_compiled_path(monkeypatch):
    """Compiled code runs neither one-row int8-dynamic kernel (FBGEMM, oneDNN) but torch._int_mm: that path is
    what the compiled matmuls are timed on, one call per quantized layer, the LM head included."""
    from model.quantize import Int8Linear, quantize_int8
    model = tiny()
    quantize_int8(model, "int8-dynamic", lm_head=True)
    paths = []
    run = Int8Linear.run
    monkeypatch.setattr(Int8Linear, "run", lambda self, x, one_row_kernels: paths.append(one_row_kernels)
                        or run(self, x, one_row_kernels))
    int_mm = torch._int_mm
    int_mm_calls = []
    monkeypatch.setattr(torch, "_int_mm", lambda *a: int_mm_calls.append(1) or int_mm(*a))
    seconds = compiled_matmul_seconds(model, 1, clock=iter(range(10**6)).__next__)
    assert seconds > 0
    layers = 4 * model.config.n_layer + 1
    assert paths and set(paths) == {False} and len(paths) % layers == 0
    assert len(int_mm_calls) == len(paths)  # every timed call multiplied on torch._int_mm


def test_the_timings_leave_the_global_generator_where_it_was():
    """compile_repays runs between a user's seed and the generation it decides on: its timings draw their inputs from
    their own generator, so a seeded sample is the same whether or not the rule was asked first."""
    model = tiny()
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    eager_step_seconds(model, 1)
    compiled_matmul_seconds(model, 1)
    assert torch.equal(torch.rand(4), expected)

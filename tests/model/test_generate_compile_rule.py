"""model.generate.compile_repays: a CPU compile of the decode step is taken only when the most it can save in
this generation, tokens x (eager step - its matmuls alone), exceeds what a compile costs at the least."""
from __future__ import annotations

import math

import pytest
import torch

from model import GPT, ModelConfig
from model.generate import (CPU_COMPILE_FLOOR_S, compile_repays, compiled_matmul_seconds, eager_step_seconds,
                            generate)


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

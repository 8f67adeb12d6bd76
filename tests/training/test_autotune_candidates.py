"""Which candidates `dtype: auto` times (training/autotune.py): bfloat16 only where its matmuls are not
slower than float32's, as a short probe of square matmuls measures; an explicit dtype is the only one
timed. The probe itself on a scripted clock: the ratio of the two dtypes' times for the same work."""
from __future__ import annotations

import types

import pytest
import torch

import training.autotune as autotune
from model import GPT, ModelConfig
from training.config import TrainConfig
from training.optim import build_optimizers
from training.runtime import Runtime


def candidates(monkeypatch, dtype_setting: str, ratio: float) -> autotune.Choice:
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    monkeypatch.setattr(autotune, "bf16_matmul_ratio", lambda device: ratio)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, d_model=16))
    batch = (torch.randint(0, 32, (2, 16)), torch.randint(0, 32, (2, 16)))
    choice, _ = autotune.choose((model, build_optimizers(model, TrainConfig()), batch),
                                Runtime(torch.device("cpu"), None),
                                TrainConfig(grad_accum=1, grad_clip=1.0, compile=False), steps_left=3,
                                dtype_setting=dtype_setting)
    return choice


@pytest.mark.parametrize("dtype_setting, ratio, timed", [("auto", 1.6, ["float32", "bfloat16"]),
                                                         ("auto", 1.0, ["float32", "bfloat16"]),
                                                         ("auto", 0.6, ["float32"]),
                                                         ("float32", 1.6, ["float32"]),
                                                         ("bfloat16", 0.6, ["bfloat16"])])
def test_bfloat16_is_timed_only_for_auto_and_only_where_its_matmuls_keep_up(monkeypatch, dtype_setting, ratio, timed):
    choice = candidates(monkeypatch, dtype_setting, ratio)
    assert list(dict.fromkeys(name for c in choice.comparisons for name in c.ms_per_step)) == timed


def test_the_probe_times_the_same_square_matmuls_in_each_dtype(monkeypatch):
    """On a scripted clock, two rounds: float32 takes 3 s then 6 s, bfloat16 2 s then 1 s; each dtype's fastest
    round counts, so bfloat16 is 3x. Every product is size x size by size x size, each dtype warmed up once,
    then the rounds with the dtypes in turn, `reps` products each."""
    clock = iter([0.0, 3.0, 10.0, 12.0, 20.0, 26.0, 30.0, 31.0])
    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    products = []
    real_matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__",
                        lambda a, b: products.append((a.dtype, tuple(a.shape), tuple(b.shape))) or real_matmul(a, b))
    assert autotune.bf16_matmul_ratio(torch.device("cpu"), size=24, reps=3, rounds=2) == pytest.approx(3.0)
    square = ((24, 24), (24, 24))
    f32, bf16 = (torch.float32, *square), (torch.bfloat16, *square)
    assert products == [f32, bf16] + ([f32] * 3 + [bf16] * 3) * 2


def test_a_burst_during_one_round_of_the_probe_does_not_decide(monkeypatch):
    """bfloat16's first round is slowed 5x by a burst of load: the other rounds still show it 2x faster."""
    clock = iter([0.0, 2.0, 2.0, 7.0, 10.0, 12.0, 12.0, 13.0, 20.0, 22.0, 22.0, 23.0])
    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert autotune.bf16_matmul_ratio(torch.device("cpu"), size=8, reps=1) == pytest.approx(2.0)

"""dtype: auto / train.compile: auto (training/autotune.py): the measurement leaves no trace on the run, the
fastest candidate wins only by more than noise, explicit settings are obeyed, and a resume reuses the choice."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import training.autotune as autotune
from model import GPT, ModelConfig
from tests.helpers import shakespeare_data_dir, tiny_config
from training.config import TrainConfig
from training.optim import build_optimizers
from training.runtime import Runtime
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return shakespeare_data_dir(tmp_path_factory.mktemp("data"))


def small_model_and_optimizer():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16, dropout=0.1))
    return model, build_optimizers(model, TrainConfig())


def test_fastest_candidate_must_beat_the_baseline_by_more_than_noise():
    assert autotune._fastest({"float32": 100.0, "bfloat16": 97.0}, "float32") == "float32"  # 3%: noise
    assert autotune._fastest({"float32": 100.0, "bfloat16": 90.0}, "float32") == "bfloat16"
    assert autotune._fastest({"float32": 100.0, "bfloat16": 120.0}, "float32") == "float32"



def test_candidates_are_timed_in_turn_and_keep_their_fastest_round(monkeypatch):
    """On a scripted clock: eager steps take 0.5 s, but a burst of load makes the first round's 1.0 s; compiled
    steps take 0.45 s throughout. Timed one after the other the burst would decide (compiled 2.2x); in turn,
    each keeping its fastest round, eager is 500 ms and compiled 450 ms. A lone candidate gets one round."""
    import types
    clock, calls = [0.0], []
    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)  # each round is MIN_STEPS steps
    durations = {"eager": [1.0] * autotune.MIN_STEPS + [0.5] * 100, "compiled": [0.45] * 100}

    def step_of(name):
        def step():
            calls.append(name)
            clock[0] += durations[name].pop(0)
        return step
    ms = autotune._time_rounds({"eager": step_of("eager"), "compiled": step_of("compiled")}, torch.device("cpu"))
    assert ms == pytest.approx({"eager": 500.0, "compiled": 450.0})
    assert calls == (["eager"] * autotune.MIN_STEPS + ["compiled"] * autotune.MIN_STEPS) * autotune.ROUNDS
    calls.clear()
    autotune._time_rounds({"compiled": step_of("compiled")}, torch.device("cpu"))
    assert calls == ["compiled"] * autotune.MIN_STEPS


def test_the_peak_mfu_is_measured_against_is_the_fastest_round(monkeypatch):
    """On a scripted clock the first of three rounds is slowed 4x by a burst of load: the peak is the
    fastest round's rate, so a run's MFU is not inflated by the burst."""
    import types
    import training.runtime as runtime
    rounds = iter([(0.0, 1.0), (1.0, 1.25), (1.25, 1.5)])  # (start, end) of each round: 1.0 s, 0.25 s, 0.25 s
    clock = iter(t for pair in rounds for t in pair)
    monkeypatch.setattr(runtime, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    size, reps = 16, 4  # reps: the CPU default
    assert runtime.measure_peak_flops(torch.device("cpu"), None, size=size) == pytest.approx(2 * size**3 * reps / 0.25)


def test_measuring_leaves_weights_optimizer_and_rng_as_they_were(monkeypatch):
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    monkeypatch.setattr(autotune, "COMPILE_MIN_RUN_S", 0.0)  # try the compile candidate too...
    monkeypatch.setattr(torch, "compile", lambda module: module)  # ...without paying for a real compile
    model, optimizers = small_model_and_optimizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16)))
    rng = torch.get_rng_state()
    choice, _ = autotune.choose(model, optimizers, batch, Runtime(torch.device("cpu"), None), grad_accum=1,
                                grad_clip=1.0, steps_left=1000, dtype_setting="auto", compile_setting="auto")
    assert "float32" in choice.ms_per_step and f"{choice.dtype} compiled" in choice.ms_per_step
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert optimizers.state_dict()[0]["state"] == {}  # a fresh optimizer again: no moments, no step count
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_short_run_does_not_try_compiling(monkeypatch):
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda module: compiled.append(module) or module)
    model, optimizers = small_model_and_optimizer()
    batch = (torch.randint(0, 32, (4, 16)), torch.randint(0, 32, (4, 16)))
    choice, _ = autotune.choose(model, optimizers, batch, Runtime(torch.device("cpu"), None), 1, 1.0,
                                steps_left=3, dtype_setting="float32", compile_setting="auto")
    assert not compiled and choice.compile is False and "compile not tried" in choice.note
    assert list(choice.ms_per_step) == ["float32"]  # an explicit dtype is the only one timed


def test_auto_run_equals_the_same_run_with_its_choice_written_out(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    common = ["train.max_iters=6", "eval.interval=3", "attn.enabled=false", "model.dropout=0.1"]
    auto = train(tiny_config(tmp_path / "auto", *common, "dtype=auto", "train.compile=auto"))
    choice = json.loads((tmp_path / "auto" / autotune.CHOICE_FILE).read_text())
    explicit = train(tiny_config(tmp_path / "explicit", *common, f"dtype={choice['dtype']}",
                                 f"train.compile={str(choice['compile']).lower()}"))
    assert auto.losses == explicit.losses  # the measurement moved no weight, RNG stream or data position
    assert not (tmp_path / "explicit" / autotune.CHOICE_FILE).exists()  # explicit settings are never measured


def test_resume_reuses_the_saved_choice(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    common = ["eval.interval=3", "attn.enabled=false", "dtype=auto", "train.compile=auto"]
    train(tiny_config(tmp_path, *common, "train.max_iters=3"))
    saved = json.loads((tmp_path / autotune.CHOICE_FILE).read_text())
    saved["ms_per_step"] = {"float32": 12345.0}  # a marker only the saved file holds
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(saved))

    def no_measuring(*args, **kwargs):
        raise AssertionError("a resume measured again")
    monkeypatch.setattr("training.autotune.choose", no_measuring)
    capsys.readouterr()
    result = train(tiny_config(tmp_path, *common, "train.max_iters=6"))
    assert result.step == 6 and "float32 12345.0 ms/step" in capsys.readouterr().err


@pytest.mark.parametrize("dtype, compile_model", [("bfloat16", False), ("float32", True)])
def test_the_choice_is_what_the_run_then_uses(tmp_path, monkeypatch, dtype, compile_model):
    """decide_precision sets the runtime to what was chosen, whichever it is (on a CPU without bf16
    instructions the real measurement always says float32, so the choice is scripted here)."""
    def scripted(*args, **kwargs):
        return autotune.Choice(dtype=dtype, compile=compile_model, ms_per_step={"float32": 1.0}), None
    monkeypatch.setattr("training.autotune.choose", scripted)
    cfg = tiny_config(tmp_path, "dtype=auto", "train.compile=auto")
    model, optimizers = small_model_and_optimizer()
    loader = type("Loader", (), {"state_dict": lambda self: {}, "load_state_dict": lambda self, s: None,
                                 "next_batch": lambda self: None})()
    rt = Runtime(torch.device("cpu"), None)
    choice, _ = autotune.decide_precision(cfg, rt, model, optimizers, loader, steps_left=10, resumed=False)
    assert rt.autocast_dtype == (torch.bfloat16 if dtype == "bfloat16" else None)
    assert rt.compile is compile_model and choice.dtype == dtype
    assert json.loads((tmp_path / autotune.CHOICE_FILE).read_text())["dtype"] == dtype


@pytest.mark.parametrize("damage", [
    {"dtype": "float64"}, {"compile": "yes"}, {"ms_per_step": {"float32": "fast"}}, {"ms_per_step": {"float32": 0}},
    {"ms_per_step": {"float32": float("nan")}}, {"ms_per_step": {"float32": True}}, {"ms_per_step": [1.0]},
    {"compile_seconds": "12"}, {"compile_seconds": -1}, {"compile_seconds": float("inf")},
])
def test_a_damaged_saved_choice_is_measured_again_not_used(tmp_path, damage):
    """autotune.json is read on resume and its numbers printed: anything but a whole, sane choice reads as
    none saved (the run measures again) instead of failing later, mid-start, on a format string."""
    good = autotune.Choice(dtype="bfloat16", compile=True, ms_per_step={"float32": 2.0, "bfloat16": 1.0},
                           compile_seconds=12.5, note="n")
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(good.to_json()))
    assert autotune.saved_choice(tmp_path) == good
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps({**good.to_json(), **damage}))
    assert autotune.saved_choice(tmp_path) is None

"""dtype: auto / train.compile: auto (training/autotune.py): the measurement leaves no trace on the run, the
fastest candidate wins only by more than noise, explicit settings are obeyed, a resume reuses the choice, and
what the run prints says what it waits for and compares only numbers timed together."""
from __future__ import annotations

import json
import math
import re
import types
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    choice, _ = autotune.choose((model, optimizers, batch), Runtime(torch.device("cpu"), None),
                                TrainConfig(grad_accum=1, grad_clip=1.0, compile="auto"), steps_left=1000,
                                dtype_setting="auto")
    assert "float32" in choice.comparisons[0].ms_per_step
    assert list(choice.comparisons[1].ms_per_step) == [choice.dtype, f"{choice.dtype} compiled"]
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
    choice, _ = autotune.choose((model, optimizers, batch), Runtime(torch.device("cpu"), None),
                                TrainConfig(grad_accum=1, grad_clip=1.0, compile="auto"), steps_left=3,
                                dtype_setting="float32")
    assert not compiled and choice.compile is False and "compile not tried" in choice.note
    assert [list(c.ms_per_step) for c in choice.comparisons] == [["float32"]]  # an explicit dtype: the only one timed


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
    saved["comparisons"] = [{"ms_per_step": {"float32": 12345.0}, "baseline": "float32", "kept": "float32"}]  # a
    # marker only the saved file holds
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(saved))

    def no_measuring(*args, **kwargs):
        raise AssertionError("a resume measured again")
    monkeypatch.setattr("training.autotune.choose", no_measuring)
    capsys.readouterr()
    result = train(tiny_config(tmp_path, *common, "train.max_iters=6"))
    assert result.step == 6 and "float32 12345.0 ms/step" in capsys.readouterr().err


@pytest.mark.parametrize("dtype, compile_model", [("bfloat16", False), ("float32", True)])
def test_the_choice_is_what_the_run_then_uses(tmp_path, monkeypatch, dtype, compile_model):
    """decide_precision returns the precision that was chosen, whichever it is, and the run is planned with it
    (on a CPU without bf16 instructions the real measurement always says float32, so the choice is scripted
    here)."""
    def scripted(*args, **kwargs):
        return autotune.Choice(dtype=dtype, compile=compile_model,
                               comparisons=[autotune.Comparison({"float32": 1.0}, "float32", "float32")]), None
    monkeypatch.setattr("training.autotune.choose", scripted)
    cfg = tiny_config(tmp_path, "dtype=auto", "train.compile=auto")
    model, optimizers = small_model_and_optimizer()
    rt = Runtime(torch.device("cpu"), None)
    choice, precision = autotune.decide_precision(cfg, rt, lambda: (model, optimizers, None), steps_left=10,
                                                  resumed=False)
    assert precision.autocast_dtype == (torch.bfloat16 if dtype == "bfloat16" else None)
    assert precision.compile is compile_model and choice.dtype == dtype
    assert json.loads((tmp_path / autotune.CHOICE_FILE).read_text())["dtype"] == dtype


GOOD = autotune.Choice(dtype="bfloat16", compile=True, comparisons=[
    autotune.Comparison({"float32": 2.0, "bfloat16": 1.0}, "float32", "bfloat16"),
    autotune.Comparison({"bfloat16": 1.5, "bfloat16 compiled": 1.0}, "bfloat16", "bfloat16 compiled")],
    compile_seconds=12.5, note="n")
# the layout saved before comparisons were recorded: one flat table, which mixed numbers timed minutes apart
EARLIER = {"dtype": "bfloat16", "compile": True, "compile_seconds": 58.0, "note": "",
           "ms_per_step": {"float32": 854.7, "bfloat16": 2591.7, "bfloat16 compiled": 2162.1}}


@pytest.mark.parametrize("damage", [
    {"dtype": "float64"}, {"compile": "yes"}, {"compile_seconds": "12"}, {"compile_seconds": -1},
    {"compile_seconds": float("inf")}, {"comparisons": {"float32": 1.0}}, {"comparisons": [[1.0]]},
    *({"comparisons": [{**GOOD.to_json()["comparisons"][0], **bad}]} for bad in [
        {"ms_per_step": {"float32": "fast", "bfloat16": 1.0}}, {"ms_per_step": {"float32": 0, "bfloat16": 1.0}},
        {"ms_per_step": {"float32": float("nan"), "bfloat16": 1.0}}, {"ms_per_step": {"float32": True}},
        {"ms_per_step": [1.0]}, {"ms_per_step": {}}, {"baseline": "float16"}, {"kept": None}, {"kept": 3}]),
])
def test_a_damaged_saved_choice_is_measured_again_not_used(tmp_path, damage):
    """autotune.json is read on resume and its numbers printed: anything but a whole, sane choice reads as
    none saved (the run measures again) instead of failing later, mid-start, on a format string."""
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(GOOD.to_json()))
    assert autotune.saved_choice(tmp_path) == GOOD
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps({**GOOD.to_json(), **damage}))
    assert autotune.saved_choice(tmp_path) is None


@pytest.mark.parametrize("damage", [{"ms_per_step": {"float32": "fast"}}, {"ms_per_step": {"float32": 0}},
                                    {"ms_per_step": {"float32": float("nan")}}, {"ms_per_step": [1.0]}])
def test_a_choice_saved_in_the_earlier_layout_is_reused_without_ratios(tmp_path, damage):
    """A resume of a run that saved the earlier flat table reuses its dtype and compile; its numbers are
    printed as they were, with no ratio drawn between numbers that were not timed together. Damaged, it is
    measured again, as the current layout is."""
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(EARLIER))
    choice = autotune.saved_choice(tmp_path)
    assert (choice.dtype, choice.compile, choice.compile_seconds) == ("bfloat16", True, 58.0)
    assert choice.summary() == ("auto: dtype bfloat16, compile on (float32 854.7 ms/step; bfloat16 2591.7 ms/step; "
                                "bfloat16 compiled 2162.1 ms/step; compile took 58 s)")
    assert autotune.Choice.from_json(choice.to_json()) == choice  # saved again in the current layout, unchanged
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps({**EARLIER, **damage}))
    assert autotune.saved_choice(tmp_path) is None


# --- what the run prints -------------------------------------------------------------------------------

CANDIDATES = ("float32", "bfloat16", "compiled")


class ScriptedSteps:
    """choose() on a scripted clock: every training step advances it by the next of its candidate's durations
    (seconds, cycled), and does no work. `events` records the steps and what was said, in order."""

    def __init__(self, monkeypatch, durations: dict[str, list[float]]):
        self.clock, self.durations, self.taken, self.events = 0.0, durations, dict.fromkeys(durations, 0), []
        monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: self.clock))
        monkeypatch.setattr(autotune, "bf16_matmul_ratio", lambda device: 2.0)  # bfloat16 is a candidate
        monkeypatch.setattr(autotune, "_bf16_supported", lambda device: True)
        monkeypatch.setattr(autotune, "accumulate_gradients", self.step)
        monkeypatch.setattr(autotune, "apply_gradients", lambda optimizers: None)
        monkeypatch.setattr(torch, "compile", self.compile)

    def compile(self, module):
        self.events.append("torch.compile")
        return types.SimpleNamespace(compiled=module)

    def step(self, runner, model, next_batch, rt, *args):
        name = "compiled" if runner is not model else ("float32" if rt.autocast_dtype is None else "bfloat16")
        seconds = self.durations[name]
        self.clock += seconds[self.taken[name] % len(seconds)]
        self.taken[name] += 1
        self.events.append(name)
        return torch.tensor(1.0), torch.tensor(1.0)

    def choose(self, steps_left=10**6, dtype="auto", compile_model="auto"):
        model, optimizers = small_model_and_optimizer()
        batch = (torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 16, dtype=torch.long))
        return autotune.choose((model, optimizers, batch), Runtime(torch.device("cpu"), None),
                               TrainConfig(grad_accum=1, grad_clip=1.0, compile=compile_model), steps_left, dtype,
                               say=self.events.append)


def fastest_rounds(seconds: list[float], first: int) -> float:
    """ms per step an independent reading gives: ROUNDS rounds of MIN_STEPS steps from step `first` of a
    candidate's cycled durations, the fastest round's mean."""
    cycled = [seconds[(first + i) % len(seconds)] for i in range(autotune.ROUNDS * autotune.MIN_STEPS)]
    rounds = [cycled[i:i + autotune.MIN_STEPS] for i in range(0, len(cycled), autotune.MIN_STEPS)]
    return 1e3 * min(sum(r) / len(r) for r in rounds)


COMPARED = re.compile(r"(?:\(|; )(?P<name>[\w ]+?) (?P<ms>[\d.]+) vs (?P<base>[\w ]+?) (?P<base_ms>[\d.]+) ms/step: "
                      r"(?P<ratio>[\d.]+)x, (?P<verdict>kept|not kept)")


@st.composite
def step_timings(draw) -> dict[str, list[float]]:
    """Seconds per step for each candidate, cycled: one pace, each candidate 0.7-1.4x of it (so gains near
    MIN_GAIN come up often), times per-step factors of jitter (+-5%) and bursts of load (up to 8x)."""
    pace = draw(st.floats(0.005, 3.0))
    noise = st.lists(st.one_of(st.floats(0.95, 1.05), st.floats(1.0, 8.0)), min_size=1, max_size=9)
    return {name: [pace * draw(st.floats(0.7, 1.4)) * f for f in draw(noise)] for name in CANDIDATES}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step_timings())
def test_a_summary_never_shows_a_kept_candidate_slower_than_the_baseline_it_beat(monkeypatch, durations):
    """Timings of any pattern -- steady, noisy, a burst of load in any round of any candidate, an eager step
    that is fast in one comparison and slow in the next: each comparison is reported with the numbers it was
    decided on (equal to an independent reading of the scripted steps), a candidate is kept only when those
    numbers show it MIN_GAIN faster than its baseline, and the printed line says no less."""
    with monkeypatch.context() as mp:
        mp.setattr(autotune, "MEASURE_S", 0.0)  # each round is MIN_STEPS steps
        choice, compiled = ScriptedSteps(mp, durations).choose()
    first, then = choice.comparisons
    # the numbers: step 0 of each eager candidate warms up, steps 1.. are the first comparison; the winner's
    # eager steps after those, and the compiled steps after its two compiling calls, the second
    assert first.ms_per_step == pytest.approx({"float32": fastest_rounds(durations["float32"], 1),
                                               "bfloat16": fastest_rounds(durations["bfloat16"], 1)}, rel=1e-5)
    again = 1 + autotune.ROUNDS * autotune.MIN_STEPS
    assert then.ms_per_step == pytest.approx({first.kept: fastest_rounds(durations[first.kept], again),
                                              f"{first.kept} compiled": fastest_rounds(durations["compiled"], 2)},
                                             rel=1e-5)
    assert first.baseline == "float32" and then.baseline == first.kept == choice.dtype
    assert choice.compile == (then.kept == f"{first.kept} compiled") == (compiled is not None)
    for c in choice.comparisons:
        base, kept = c.ms_per_step[c.baseline], c.ms_per_step[c.kept]
        assert c.kept == c.baseline or base / kept >= autotune.MIN_GAIN * (1 - 1e-5)
        assert c.kept in (c.baseline, min(c.ms_per_step, key=c.ms_per_step.get))
    shown = [m.groupdict() for m in COMPARED.finditer(choice.summary())]
    assert [(m["name"], m["base"]) for m in shown] == [("bfloat16", "float32"), (f"{first.kept} compiled", first.kept)]
    assert [m["verdict"] == "kept" for m in shown] == [c.kept != c.baseline for c in choice.comparisons]
    for m in shown:
        if m["verdict"] == "kept":
            assert float(m["ms"]) <= float(m["base_ms"]) and float(m["ratio"]) >= autotune.MIN_GAIN - 0.005


def test_a_summary_reports_each_comparison_with_its_own_numbers(monkeypatch):
    """Load that came between the two comparisons: bfloat16 beat float32 1.42x, and later the compiled step
    beat a bfloat16 step that load had slowed to 2.6 s. Each ratio comes from its own pair of numbers, never
    bfloat16's later number against float32's earlier one (which read 0.33x: kept though slower)."""
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    scripted = ScriptedSteps(monkeypatch, {"float32": [0.8547], "bfloat16": [0.6023] * 7 + [2.5917] * 6,
                                           "compiled": [2.1621]})
    choice, _ = scripted.choose()
    assert choice.summary() == ("auto: dtype bfloat16, compile on (bfloat16 602.3 vs float32 854.7 ms/step: 1.42x, "
                                "kept; bfloat16 compiled 2162.1 vs bfloat16 2591.7 ms/step: 1.20x, kept; "
                                "compile took 4 s)")


@pytest.mark.parametrize("step_s", [0.3, 0.01])
def test_the_first_line_says_what_is_timed_for_about_how_long_and_how_to_skip_it(monkeypatch, step_s):
    """Said after the first warm-up step and before any other: the candidates, an estimate from that step's
    pace that the timing then keeps (to a step a round, where rounds run MEASURE_S / ROUNDS), and the settings
    that skip it. The compiling line comes just before torch.compile, saying why and about how long."""
    scripted = ScriptedSteps(monkeypatch, {"float32": [step_s], "bfloat16": [step_s], "compiled": [step_s]})
    ends = []
    real_rounds = autotune._time_rounds

    def time_rounds(steps, device):  # the clock when each comparison's timing ends
        out = real_rounds(steps, device)
        ends.append(scripted.clock)
        return out
    monkeypatch.setattr(autotune, "_time_rounds", time_rounds)
    scripted.choose(steps_left=10**5)
    first_line, compile_line = [e for e in scripted.events if e.startswith("auto:")]
    assert scripted.events.index(first_line) == 1  # after the first warm-up step, before every other one
    estimate = int(re.search(r"\(~(\d+) s at (\d+) ms a step\)", first_line).group(1))
    assert estimate == math.ceil(autotune.timing_seconds(2, step_s))
    took = ends[0] - step_s  # from the end of the first warm-up: the second warm-up, then the rounds
    assert autotune.timing_seconds(2, step_s) - 1e-9 <= took <= autotune.timing_seconds(2, step_s) + 6 * step_s
    assert "float32 and bfloat16 training steps to choose dtype" in first_line
    assert "a compiled step to choose train.compile" in first_line and autotune.FIRST_COMPILE in first_line
    assert first_line.endswith("skip it by setting dtype=float32 or bfloat16 and train.compile=false or true")
    assert scripted.events.index(compile_line) == scripted.events.index("torch.compile") - 1
    assert "compiling the model to time it against eager" in compile_line and autotune.FIRST_COMPILE in compile_line


def test_a_run_prints_what_auto_times_right_after_the_model_line(tmp_path, data_dir, monkeypatch, capsys):
    """Through train(): the line after the model line is the announcement (the progress bar aside), naming
    only the settings left on auto; then the summary."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    train(tiny_config(tmp_path, "train.max_iters=2", "eval.interval=2", "attn.enabled=false", "dtype=float32",
                      "train.compile=auto"))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("model:", "auto:"))]
    assert lines[0].startswith("model:")
    assert lines[1].startswith("auto: timing float32 training steps (~")
    assert lines[1].endswith("skip it by setting train.compile=false or true")
    assert lines[2].startswith("auto: dtype float32, compile off (float32 ") and "compile not tried" in lines[2]


@pytest.mark.parametrize("measure_s, calls", [(None, 3 * 34), (0.3, 3 * 10), (0.0, 3 * autotune.MIN_STEPS)])
def test_each_candidate_is_timed_for_its_budget_split_over_the_rounds(monkeypatch, measure_s, calls):
    """On a clock that a call advances by 10 ms, each of ROUNDS rounds runs until measure_s / ROUNDS has passed
    (MEASURE_S when none is given), and for MIN_STEPS calls at least."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    counts = {"a": 0, "b": 0}

    def call(name):
        def run():
            clock.now += 0.01
            counts[name] += 1
        return run
    timed = autotune._time_rounds({name: call(name) for name in counts}, torch.device("cpu"), measure_s)
    assert counts == {"a": calls, "b": calls}
    assert timed == {"a": pytest.approx(10.0), "b": pytest.approx(10.0)}

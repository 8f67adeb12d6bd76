"""`auto` decides only on rounds that agree (training/autotune.py: compare), and tries compiling only when the
run's remaining eager time repays it: the rule on generated round timings, and both sides of each decision
through choose() on a scripted clock (no real timing)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import training.autotune as autotune
from tests.training.test_autotune import ScriptedSteps


def spread(rounds: list[float]) -> float:
    """The second-fastest round over the fastest (1 for a lone round)."""
    ordered = sorted(rounds)
    return ordered[1] / ordered[0] if len(ordered) > 1 else 1.0


round_ms = st.lists(st.floats(1.0, 5000.0), min_size=1, max_size=autotune.ROUNDS)


@settings(max_examples=300, deadline=None)
@given(rounds=st.dictionaries(st.sampled_from(["float32", "bfloat16", "float32 compiled"]), round_ms, min_size=1))
def test_the_baseline_is_kept_when_rounds_disagree_by_more_than_the_gain(rounds):
    """Any rounds of any candidates: the fastest rounds decide (MIN_GAIN over the baseline); but when some
    candidate's fastest round has no other of its rounds within ROUND_NOISE, the load moved by up to that spread,
    and the fastest candidate is kept only when its gain exceeds the largest such spread times MIN_GAIN, else the
    baseline; either way the candidates that disagreed are named with their spread in the summary."""
    baseline = next(iter(rounds))
    c = autotune.compare(autotune.Timings(rounds), baseline)
    fastest = {name: min(ms) for name, ms in rounds.items()}
    disagree = {name: spread(ms) for name, ms in rounds.items() if spread(ms) > autotune.ROUND_NOISE}
    assert c.ms_per_step == pytest.approx(fastest, rel=1e-5)
    assert c.unsettled.keys() == disagree.keys()
    assert all(c.unsettled[n] == pytest.approx(disagree[n], abs=0.006) for n in disagree)
    best = min(fastest, key=fastest.get)
    gain = fastest[baseline] / fastest[best]
    needed = autotune.MIN_GAIN * max(disagree.values(), default=1.0)
    assert c.kept == (best if gain >= needed else baseline)
    if disagree and len(rounds) > 1:
        summary = c.describe()
        assert all(f"{n}'s rounds" in summary for n in disagree)
        assert ("kept the safe default" in summary) == (c.kept == baseline)
        assert (f"is beyond that times {autotune.MIN_GAIN:.2f}" in summary) == (c.kept != baseline)
    assert autotune.Comparison.from_json(c.__dict__) == c  # saved and read back whole


@pytest.mark.parametrize("float32_s, kept", [([0.191] * 3 + [2.863] * 4, "float32"), ([0.191] * 7, "bfloat16")])
def test_a_float32_step_timed_at_191_ms_and_moments_later_2863_ms_decides_nothing(monkeypatch, float32_s, kept):
    """Through choose(): float32's rounds of 191 and 2,863 ms disagree (15x), so bfloat16's 1.9x does not win and
    the summary says why; the same bfloat16 against float32 rounds that agree is kept."""
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)  # each round is MIN_STEPS steps
    scripted = ScriptedSteps(monkeypatch, {"float32": float32_s, "bfloat16": [0.1], "compiled": [0.1]})
    choice, _ = scripted.choose(compile_model=False)
    assert choice.dtype == kept
    summary = choice.summary()
    assert ("float32's rounds 14.99x apart, beyond the 1.25x of noise: kept the safe default" in summary) == \
        (kept == "float32"), summary


@pytest.mark.parametrize("bfloat16_s, kept", [([0.132] * 7, "bfloat16"), ([0.2] * 7, "float32")])
def test_a_gain_beyond_the_rounds_spread_stands(monkeypatch, bfloat16_s, kept):
    """Through choose(): float32's rounds of 251.7 and 350 ms disagree (1.39x, a train.py run on a loaded 2-core
    CPU); bfloat16 at 132 ms is 1.91x, beyond 1.39 x MIN_GAIN = 1.46: kept, the summary saying why; at 200 ms,
    1.26x, within what the load explains: the safe default."""
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)  # each round is MIN_STEPS steps
    scripted = ScriptedSteps(monkeypatch, {"float32": [0.2517] * 3 + [0.35] * 4, "bfloat16": bfloat16_s,
                                           "compiled": [0.1]})
    choice, _ = scripted.choose(compile_model=False)
    assert choice.dtype == kept
    summary = choice.summary()
    assert "float32's rounds 1.39x apart" in summary, summary
    assert ("kept the safe default" in summary) == (kept == "float32"), summary
    assert ("1.91x is beyond that times 1.05" in summary) == (kept == "bfloat16"), summary


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pace=st.sampled_from([0.125, 0.25, 0.5, 1.0, 2.0]), steps_left=st.integers(1, 1000))
def test_compiling_is_tried_exactly_when_the_eager_rest_of_the_run_lasts_long_enough(monkeypatch, pace, steps_left):
    """Few steps left: not tried, and the note says how long the run has; many: compiled and timed. The
    boundary is COMPILE_MIN_RUN_S of the eager pace, inclusive."""
    with monkeypatch.context() as mp:
        mp.setattr(autotune, "MEASURE_S", 0.0)
        scripted = ScriptedSteps(mp, {"float32": [pace], "bfloat16": [pace], "compiled": [pace / 2]})
        choice, compiled = scripted.choose(steps_left=steps_left, dtype="float32")
    tried = steps_left * pace >= autotune.COMPILE_MIN_RUN_S
    assert ("torch.compile" in scripted.events) == tried
    assert choice.compile == tried == (compiled is not None)  # twice as fast compiled: kept when tried
    assert ("compile not tried" in choice.note) == (not tried)

"""The heads-over-training picture and the phase change it names: series from rows, the phase-change rule on
generated score curves, the summary line, and the PNG."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from insight.role_plot import (PHASE_THRESHOLD, PhaseChange, draw_heads_over_training, head_series,
                               induction_heads, induction_summary, phase_change)


def test_head_series_orders_steps_fills_gaps_and_keeps_the_last_row():
    rows = [(20, 1, 0, 0.5), (10, 1, 0, 0.1), (10, 0, 3, "nan"), (20, 0, 3, ""), (10, 1, 0, 0.2)]
    steps, series = head_series(rows)
    assert steps.tolist() == [10, 20]
    assert list(series) == [(0, 3), (1, 0)]
    assert series[(1, 0)].tolist() == [0.2, 0.5]  # the later row of (10, 1, 0) wins
    assert np.isnan(series[(0, 3)]).all()
    steps, series = head_series([(5, 0, 0, 0.3), (6, 0, 1, 0.4)])
    assert series[(0, 0)][0] == 0.3 and np.isnan(series[(0, 0)][1]) and np.isnan(series[(0, 1)][0])


def test_phase_change_is_the_first_snapshot_past_the_threshold():
    assert phase_change([0, 10, 20, 30], [0.01, 0.2, 0.93, 0.97]) == PhaseChange(20, 0.93, 10, 0.2)
    assert phase_change([0, 10], [0.01, PHASE_THRESHOLD]) == PhaseChange(10, PHASE_THRESHOLD, 0, 0.01)
    assert phase_change([0, 10, 20], [0.6, 0.1, 0.9]) is None  # past it at the first snapshot: formed before
    assert phase_change([0, 10, 20], [0.1, 0.2, 0.3]) is None
    assert phase_change([0, 10, 20], [math.nan, 0.2, 0.7]).step == 20  # NaN counts as below
    assert phase_change([], []) is None and phase_change([5], [0.9]) is None
    with pytest.raises(ValueError):
        phase_change([0, 1], [0.5])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=0, max_size=30), st.floats(0.05, 0.95))
def test_phase_change_rule_against_a_loop(scores, threshold):
    steps = [10 * k for k in range(len(scores))]
    found = phase_change(steps, scores, threshold)
    first = next((k for k, s in enumerate(scores) if s >= threshold), None)
    if first is None or first == 0:
        assert found is None
    else:
        assert found == PhaseChange(steps[first], scores[first], steps[first - 1], scores[first - 1])
        assert all(s < threshold for s in scores[:first])


def rows_of(curves: dict[tuple[int, int], list[float]], steps: list[int]) -> list[tuple]:
    return [(step, layer, head, curve[k]) for k, step in enumerate(steps) for (layer, head), curve in curves.items()]


def test_summary_names_the_heads_and_the_phase_change():
    steps = [0, 50, 100, 150]
    curves = {(0, 0): [0.02, 0.03, 0.02, 0.03], (1, 0): [0.02, 0.1, 0.8, 0.93], (1, 2): [0.02, 0.2, 0.9, 0.97],
              (1, 3): [0.02, 0.05, 0.3, 0.41]}
    icl = [(0, 0.01), (50, -0.02), (100, -1.5), (150, -2.9)]
    line = induction_summary(rows_of(curves, steps), icl)
    assert line == ("induction heads: L1.H2 (0.97), L1.H0 (0.93), L1.H3 (0.41); phase change at step 100 "
                    "(largest induction score 0.20 at step 50 -> 0.90; ICL score 0.01 at step 0 -> -2.90 at step 150)")
    assert [h[:2] for h in induction_heads(head_series(rows_of(curves, steps))[1])] == [(1, 2), (1, 0), (1, 3)]


def test_summary_without_a_head_or_a_change():
    flat = {(0, 0): [0.01, 0.02], (1, 1): [0.03, 0.05]}
    assert induction_summary(rows_of(flat, [10, 20]), []) == (
        "induction heads: none above 0.4 (largest L1.H1 0.05); no phase change (largest induction score stayed "
        "below 0.5)")
    formed = {(2, 1): [0.95, 0.96]}
    assert induction_summary(rows_of(formed, [10, 20]), [(10, -3.0)]) == (
        "induction heads: L2.H1 (0.96); no phase change in this run (largest induction score 0.95 at its first "
        "snapshot, step 10)")
    assert induction_summary([], []) == "induction heads: no attention snapshot yet"
    many = {(1, h): [0.0, 0.9 - h / 100] for h in range(8)}
    assert "L1.H4 (0.86) and 3 more; phase change at step 20" in induction_summary(rows_of(many, [10, 20]), [])


def test_the_picture_draws_every_head_and_the_icl_score(tmp_path):
    steps = [0, 50, 100]
    curves = {(layer, head): [0.02, 0.05 * head, 0.3 * head * layer] for layer in range(2) for head in range(4)}
    icl = [(0, 0.0), (50, -0.5), (100, -2.0)]
    path = tmp_path / "heads.png"
    fig = draw_heads_over_training(rows_of(curves, steps), icl, path=path)
    top, bottom = fig.axes[:2]
    drawn = {line.get_label(): line.get_ydata().tolist() for line in top.get_lines() if not line.get_label().startswith("_")}
    assert drawn == {f"{layer}.{head}": curves[(layer, head)] for layer in range(2) for head in range(4)}
    assert [line for line in bottom.get_lines() if len(line.get_xdata()) == 3][0].get_ydata().tolist() == [0.0, -0.5, -2.0]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed


def test_the_picture_names_the_top_heads_of_many(tmp_path):
    curves = {(layer, head): [0.0, (layer * 12 + head) / 144] for layer in range(12) for head in range(12)}
    fig = draw_heads_over_training(rows_of(curves, [0, 10]), [], path=tmp_path / "many.png")
    named = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert len(named) == 12 and set(named) == {f"11.{h}" for h in range(12)}  # the twelve highest last scores

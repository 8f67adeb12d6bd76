"""A score exactly at a rule's threshold gets one verdict wherever a user reads it: the role label, the
explorer's labels, the list of induction heads, the summary line and the picture. Roles need a score strictly
above ROLE_THRESHOLDS (0.4 is not a role, the next float up is); the phase change needs the largest score to
reach PHASE_THRESHOLD (0.5 is a phase change, the float below is not). A score keeps its side of the line
through stats.csv, which the picture and the summary are drawn from."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from insight.explorer import HeadScores, explorer_html
from insight.role_plot import PHASE_THRESHOLD, draw_heads_over_training, head_series, induction_heads, \
    induction_summary, phase_change, score_text
from insight.roles import ROLE_THRESHOLDS, role_label, role_probe
from model import GPT, ModelConfig
from training.attn_monitor import _cell, _float

AT = ROLE_THRESHOLDS["induction"]
ABOVE = float(np.nextafter(AT, 1.0))


def explorer_roles(induction: np.ndarray) -> list[list[str]]:
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=16)).eval()
    internals = model.attention_internals(torch.arange(6)[None])
    import json
    import re
    html = explorer_html(internals, list("abcdef"), scores=HeadScores({"induction": induction}))
    meta = json.loads(re.search(r'<script type="[^"]+" id="attn-meta">(.*?)</script>', html, re.S).group(1))
    return meta["roles"]


def test_an_induction_score_at_the_threshold_is_no_role_anywhere_and_one_ulp_above_is_one_everywhere():
    assert role_label(0.0, 0.0, AT) == "" and role_label(0.0, 0.0, ABOVE) == "induction"
    assert explorer_roles(np.array([[AT, ABOVE]])) == [["", "induction"]]
    series = head_series([(10, 0, 0, AT), (10, 0, 1, ABOVE)])[1]
    assert induction_heads(series) == [(0, 1, ABOVE)]
    assert induction_summary([(10, 0, 0, AT)], []).startswith("induction heads: none above 0.4 (largest L0.H0 0.40)")
    named = induction_summary([(10, 0, 0, AT), (10, 0, 1, ABOVE)], [])
    assert named.startswith("induction heads: L0.H1 (") and float(named.split("(")[1].split(")")[0]) == ABOVE
    figure = draw_heads_over_training([(10, 0, 0, AT), (10, 0, 1, ABOVE)], [])
    dashed = [line for line in figure.axes[0].lines if line.get_linestyle() == "--"]
    assert [list(line.get_ydata()) for line in dashed] == [[AT, AT]]  # the line a head must pass, drawn at 0.4


@pytest.mark.parametrize("name,args", [("prev_token", (AT, 0.0, 0.0)), ("duplicate_token", (0.0, AT, 0.0))])
def test_the_other_roles_need_a_score_above_their_threshold_too(name, args):
    assert ROLE_THRESHOLDS[name] == AT and role_label(*args) == ""
    bumped = tuple(ABOVE if a == AT else a for a in args)
    assert role_label(*bumped) == {"prev_token": "previous-token", "duplicate_token": "duplicate-token"}[name]


def test_scores_keep_their_side_of_the_threshold_through_stats_csv():
    for score in (AT, ABOVE, float(np.nextafter(AT, 0.0)), PHASE_THRESHOLD, float(np.nextafter(PHASE_THRESHOLD, 0.0))):
        assert _float(_cell(score)) == score


def test_a_largest_score_reaching_exactly_the_phase_threshold_is_a_phase_change_in_the_summary_and_the_picture():
    below = float(np.nextafter(PHASE_THRESHOLD, 0.0))
    rows = [(10, 0, 0, 0.1), (20, 0, 0, PHASE_THRESHOLD)]
    assert phase_change([10, 20], [0.1, PHASE_THRESHOLD]).step == 20
    assert "; phase change at step 20 (largest induction score 0.10 at step 10 -> 0.50)" in induction_summary(rows, [])
    marks = [line for line in draw_heads_over_training(rows, []).axes[0].lines if line.get_color() == "tab:red"]
    assert [list(line.get_xdata()) for line in marks] == [[20, 20]]
    rows_below = [(10, 0, 0, 0.1), (20, 0, 0, below)]
    assert phase_change([10, 20], [0.1, below]) is None
    assert induction_summary(rows_below, []).endswith("no phase change (largest induction score stayed below 0.5)")
    assert not [line for line in draw_heads_over_training(rows_below, []).axes[0].lines if line.get_color() == "tab:red"]


def test_a_pool_exactly_as_large_as_the_probe_gives_each_sequence_every_id_once():
    R = 3  # block_size 7
    exact = role_probe([5, 6, 7], start_id=0, block_size=7, batch=6, seed=1)
    assert all(sorted(row[1:R + 1].tolist()) == [5, 6, 7] for row in exact)  # without replacement
    with_start = role_probe([0, 6, 7], start_id=0, block_size=7, batch=6, seed=1)  # 2 without the start: keep it
    assert all(sorted(row[1:R + 1].tolist()) == [0, 6, 7] for row in with_start)
    one_more = role_probe([0, 5, 6, 7], start_id=0, block_size=7, batch=6, seed=1)  # exactly R besides the start
    assert all(sorted(row[1:R + 1].tolist()) == [5, 6, 7] for row in one_more)
    short = role_probe([5, 6], start_id=0, block_size=7, batch=20, seed=1)  # one fewer than R: repeats
    assert all(len(set(row[1:R + 1].tolist())) < R for row in short)
    for probe in (exact, with_start, one_more, short):
        assert torch.equal(probe[:, 1:R + 1], probe[:, R + 1:]) and (probe[:, 0] == 0).all()


@given(value=st.floats(-2, 2), threshold=st.sampled_from([AT, PHASE_THRESHOLD, 0.0]), ulps=st.integers(-3, 3))
def test_a_score_is_shown_on_its_own_side_of_the_threshold(value, threshold, ulps):
    for v in (value, threshold + ulps * float(np.spacing(threshold or 1.0))):  # anywhere, and next to the line
        shown = float(score_text(v, threshold))
        assert (shown > threshold) == (v > threshold) and (shown < threshold) == (v < threshold)
        assert abs(shown - v) <= 0.005 + 1e-12  # never further than two decimals would be


def test_the_summary_never_shows_a_head_below_the_threshold_as_reaching_it():
    text = induction_summary([(10, 0, 0, 0.3996), (10, 0, 1, 0.1)], [])
    assert text.startswith("induction heads: none above 0.4 (largest L0.H0 0.3996)")
    assert score_text(0.97, AT) == "0.97"  # far from the line: two decimals, as before

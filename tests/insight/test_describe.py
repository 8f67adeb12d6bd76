"""insight/describe.py's rules on arrays built by hand: each clause appears exactly when its threshold is passed,
and each field it reads changes the line (a threshold or a field ignored would leave a line unchanged)."""
from __future__ import annotations

import numpy as np
import pytest

import insight.describe as describe
from insight.circuit_dump import PATH_NAMES
from insight.describe import (ABLATION_DLOSS_MIN, DIRECT_LOGIT_MIN, EDGE_Z_MIN, PATH_DLOSS_MIN, PATH_ROLE_MIN,
                              head_descriptions)
from insight.roles import ROLE_THRESHOLDS

L, H = 2, 2
K = 1  # kind index of "k" in COMPOSITION_KINDS
QUIET = "no role, direct write or confirmed edge"


def arrays():
    """Head scores and circuit arrays of a 2 × 2 model where nothing passes a threshold."""
    scores = {name: np.zeros((L, H)) for name in ("prev_token", "duplicate_token", "induction", "ablation_dloss")}
    z = np.full((3, L, H, L, H), np.nan)
    z[:, 0, :, 1, :] = 1.0
    circuit = {"circuit_z": z, "head_direct_logit": np.zeros((L, H))}
    for name in PATH_NAMES:
        circuit[f"circuit_path_{name}"] = np.full((3, L, H, L, H), np.nan)
    return scores, circuit


def with_edge(circuit, z, dloss, induction=0.0, kind=K, source=(0, 0), target=(1, 1)):
    """One path-ablated edge source -> target of `kind` with that z, Δloss and target's induction change."""
    at = (kind, *source, *target)
    circuit["circuit_z"][at] = z
    circuit["circuit_path_dloss"][at] = dloss
    circuit["circuit_path_prev_token"][at] = 0.0
    circuit["circuit_path_duplicate_token"][at] = 0.0
    circuit["circuit_path_induction"][at] = induction
    return circuit


def test_nothing_passed_says_so_with_the_ablation_cost():
    scores, circuit = arrays()
    scores["ablation_dloss"][0, 1] = -0.02
    lines = head_descriptions(scores, circuit)
    assert lines[0][1] == f"{QUIET} (ablation -0.02 nats)"
    del scores["ablation_dloss"]
    assert head_descriptions(scores, circuit)[0][1] == QUIET  # not measured: no number


def test_a_role_names_its_label_and_score_at_its_threshold():
    scores, circuit = arrays()
    scores["induction"][1, 0] = ROLE_THRESHOLDS["induction"] + 0.01
    scores["prev_token"][1, 1] = ROLE_THRESHOLDS["prev_token"]  # not above: no role
    lines = head_descriptions(scores, circuit)
    assert lines[1][0] == f"induction head ({ROLE_THRESHOLDS['induction'] + 0.01:.2f})"
    assert lines[1][1] == f"{QUIET} (ablation +0.00 nats)"


def test_a_direct_writer_at_the_threshold_and_its_sign():
    scores, circuit = arrays()
    circuit["head_direct_logit"][0, 0] = DIRECT_LOGIT_MIN + 0.32
    circuit["head_direct_logit"][0, 1] = -DIRECT_LOGIT_MIN - 0.05
    circuit["head_direct_logit"][1, 0] = DIRECT_LOGIT_MIN * 0.99
    lines = head_descriptions(scores, circuit)
    assert lines[0][0] == f"writes the next token directly: {DIRECT_LOGIT_MIN + 0.32:+.2f} logit"
    assert lines[0][1] == f"pushes the next token down directly: {-DIRECT_LOGIT_MIN - 0.05:+.2f} logit"
    assert lines[1][0].startswith(QUIET)


def test_an_edge_confirmed_by_the_loss_is_named_with_its_kind_z_and_dloss():
    scores, circuit = arrays()
    with_edge(circuit, z=35.2, dloss=1.234)
    assert head_descriptions(scores, circuit)[0][0] == "feeds L1.H1's keys (K, z 35.2; path ablation +1.23 nats)"


@pytest.mark.parametrize("field, value, named", [
    ("z", EDGE_Z_MIN, True), ("z", EDGE_Z_MIN * 0.99, False),
    ("dloss", PATH_DLOSS_MIN, True), ("dloss", -PATH_DLOSS_MIN, True), ("dloss", PATH_DLOSS_MIN * 0.99, False),
    ("induction", -PATH_ROLE_MIN, True), ("induction", PATH_ROLE_MIN * 0.99, False)])
def test_an_edge_is_named_only_past_each_threshold(field, value, named):
    scores, circuit = arrays()
    # the z cases on an edge the loss confirms; the others on a z of 10, past EDGE_Z_MIN
    edge = {"z": 10.0, "dloss": 1.0 if field == "z" else 0.0, "induction": 0.0, field: value}
    with_edge(circuit, **edge)
    line = head_descriptions(scores, circuit)[0][0]
    assert line.startswith("feeds L1.H1") == named, line
    if field == "induction" and named:
        assert line.endswith(f"induction {value:+.2f})")


def test_the_strongest_confirmed_edge_wins_not_the_strongest_edge():
    scores, circuit = arrays()
    with_edge(circuit, z=50.0, dloss=0.0, kind=0, target=(1, 0))  # the largest z; cutting it changes nothing
    with_edge(circuit, z=20.0, dloss=0.3, kind=2, target=(1, 1))
    with_edge(circuit, z=30.0, dloss=-0.2, kind=0, target=(1, 1))
    # the largest change wins over the larger z
    assert head_descriptions(scores, circuit)[0][0] == "feeds L1.H1's values (V, z 20.0; path ablation +0.30 nats)"


def test_a_role_change_larger_than_any_loss_change_wins():
    scores, circuit = arrays()
    with_edge(circuit, z=50.0, dloss=0.0, induction=-0.2, kind=1, target=(1, 0))
    with_edge(circuit, z=40.0, dloss=0.5, kind=0, target=(1, 1))
    with_edge(circuit, z=10.0, dloss=0.1, induction=-0.6, kind=1, target=(1, 1))  # 0.6 > the Q edge's 0.5 nats
    assert head_descriptions(scores, circuit)[0][0] == (
        "feeds L1.H1's keys (K, z 10.0; path ablation +0.10 nats, induction -0.60)")


def test_a_costly_head_nothing_explains_is_said_to_be():
    scores, circuit = arrays()
    scores["ablation_dloss"][0, 1] = ABLATION_DLOSS_MIN
    scores["ablation_dloss"][1, 1] = ABLATION_DLOSS_MIN * 0.99
    lines = head_descriptions(scores, circuit)
    assert lines[0][1] == (f"removing it costs {ABLATION_DLOSS_MIN:+.2f} nats, which no role, direct write or "
                           f"confirmed edge explains")
    assert lines[1][1].startswith(QUIET)


def test_clauses_join_in_order_role_feeds_direct():
    scores, circuit = arrays()
    scores["prev_token"][0, 0] = 0.9
    circuit["head_direct_logit"][0, 0] = 0.5
    with_edge(circuit, z=40.0, dloss=0.0, induction=-0.75)
    assert head_descriptions(scores, circuit)[0][0] == (
        "previous-token head (0.90); feeds L1.H1's keys (K, z 40.0; path ablation +0.00 nats, induction -0.75); "
        "writes the next token directly: +0.50 logit")


def test_the_thresholds_are_the_modules_constants(monkeypatch):
    """The rules read the module's constants when they run: raising one removes its clause."""
    scores, circuit = arrays()
    circuit["head_direct_logit"][0, 0] = 0.5
    with_edge(circuit, z=40.0, dloss=0.2, target=(1, 0))
    monkeypatch.setattr(describe, "DIRECT_LOGIT_MIN", 0.6)
    monkeypatch.setattr(describe, "PATH_DLOSS_MIN", 0.3)
    assert head_descriptions(scores, circuit)[0][0].startswith(QUIET)

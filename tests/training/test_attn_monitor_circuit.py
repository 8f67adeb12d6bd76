"""The circuit at each snapshot and in the summary line (training/attn_monitor.py): each head's strongest source
per composition kind equals composition_zscores recomputed by a loop, and the summary names the strongest
induction head's K-composer, its z, its path ablation and the step from which it stays the strongest, from a
scripted series of snapshots."""
from __future__ import annotations

import re
from types import SimpleNamespace


from insight.circuits import path_ablation
from tests.insight.test_circuits import text_and_probe, tiny
from training.attn_monitor import AttentionMonitor, circuit_text, formed_at, sources_by_target

CIRCUIT = re.compile(r"circuit: L(\d+)\.H(\d+) -K-> L(\d+)\.H(\d+) \(z (-?[\d.]+|inf), path ablation (-?[\d.]+) "
                     r"induction\) formed at step (\d+)")


def test_sources_by_target_names_each_edge_as_stats_csv_writes_it():
    edges = [("k", (0, 2), (1, 1), 6.5), ("q", (0, 1), (1, 1), 2.0), ("v", (1, 3), (2, 0), 4.0)]
    assert sources_by_target(edges) == {(1, 1): {"k": ("L0.H2", 6.5), "q": ("L0.H1", 2.0)},
                                        (2, 0): {"v": ("L1.H3", 4.0)}}


def test_formed_at_is_the_first_step_of_the_last_unbroken_run():
    target = (1, 1)
    series = [(50, "L0.H2"), (100, "L0.H0"), (150, "L0.H2"), (200, "L0.H2"), (250, "L0.H2")]
    rows = [(step, 1, 1, name) for step, name in series] + [(step, 1, 0, "L0.H0") for step, _ in series]
    assert formed_at(rows, target, "L0.H2") == 150  # not 50: it lost the lead at step 100
    assert formed_at(rows, target, "L0.H0") is None  # not the last snapshot's
    assert formed_at(rows, (1, 0), "L0.H0") == 50
    assert formed_at(rows + [(200, 1, 1, "")], target, "L0.H2") == 250  # a snapshot not measured breaks it
    assert formed_at(rows + [(100, 1, 1, "L0.H2")], target, "L0.H2") == 50  # a redone step replaces its row


def test_circuit_text_format():
    assert circuit_text("L0.H2", (1, 1), 66.31, -0.7512, 350) == \
        "circuit: L0.H2 -K-> L1.H1 (z 66.3, path ablation -0.75 induction) formed at step 350"
    assert circuit_text("L0.H2", (1, 1), 9.3, None, 300) == \
        "circuit: L0.H2 -K-> L1.H1 (z 9.3, path ablation not measured) formed at step 300"


def scripted_monitor(model, induction: dict[tuple[int, int], list[float]], k_sources: dict[tuple[int, int], list[str]],
                     steps: list[int]) -> AttentionMonitor:
    """A monitor as a run leaves it after the scripted snapshots, with `model` as its final weights."""
    monitor = AttentionMonitor.__new__(AttentionMonitor)
    text, probe = text_and_probe()
    monitor.model, monitor.circuit, monitor.seconds = model, True, 0.0
    monitor.probes = SimpleNamespace(text=text, roles=probe)
    monitor.induction_rows = [(s, l, h, v[i]) for i, s in enumerate(steps) for (l, h), v in induction.items()]
    monitor.k_rows = [(s, l, h, v[i], 10.0 * (i + 1)) for i, s in enumerate(steps) for (l, h), v in k_sources.items()]
    monitor.icl_rows = [(s, -0.5 * i) for i, s in enumerate(steps)]
    return monitor


def test_the_summary_names_the_circuit_and_when_it_formed():
    model = tiny()  # 3 layers: a source can be in layer 0 or 1
    steps = [50, 100, 150, 200, 250]
    induction = {(0, 0): [0.0] * 5, (1, 1): [0.05, 0.1, 0.6, 0.8, 0.9], (2, 3): [0.0, 0.1, 0.5, 0.7, 0.95]}
    k_sources = {(1, 1): ["L0.H1"] * 5, (2, 3): ["L1.H0", "L0.H2", "L1.H0", "L0.H2", "L0.H2"]}
    monitor = scripted_monitor(model, induction, k_sources, steps)
    line = monitor.summary()
    head, circuit = line.split("; circuit: ")
    assert head.startswith("induction heads: L2.H3 (0.95), L1.H1 (0.90); phase change at step 150")
    found = CIRCUIT.fullmatch("circuit: " + circuit)
    assert found, line
    drop = path_ablation(model, monitor.probes.text, monitor.probes.roles, "k", (2, 3), [(0, 2)])["induction"][0]
    assert found.groups() == ("0", "2", "2", "3", "50.0", f"{drop:.2f}", "200")  # the last snapshot's z: 10 × 5
    assert monitor.seconds > 0  # the path ablation counts in the snapshots' time


def test_no_circuit_without_an_induction_head():
    steps = [50, 100]
    monitor = scripted_monitor(tiny(), {(1, 1): [0.1, 0.3]}, {(1, 1): ["L0.H1", "L0.H1"]}, steps)
    assert "circuit" not in monitor.summary()

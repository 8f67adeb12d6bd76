"""End to end: configs/induction.yaml, shortened, grows an induction head in layer 1 and none in layer 0, and the
run records it where a user looks: stats.csv, icl.csv, the heads-over-training PNG and the summary line."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from data.prepare import prepare_data
from insight.roles import head_role_scores, role_probe
from tests.helpers import REPO
from training.attn_monitor import ROLE_PROBE_SEED, probe_ids
from training.config import load_run_config
from training.trainer import train

STEPS = 450  # the config runs 1000 steps; its heads pass 0.5 at ~350 and ~0.9 at 450 (measured)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")  # the repeated corpus is generated: nothing to copy in


pytestmark = pytest.mark.usefixtures("data_env")


@pytest.fixture(scope="module")
def induction_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("induction")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        patch.setenv("WANDB_MODE", "disabled")
        cfg = load_run_config(REPO / "configs" / "induction.yaml",
                              [f"out_dir={out}", f"train.max_iters={STEPS}", "eval.interval=150",
                               "train.peak_flops=1e12"])
        torch.manual_seed(0)
        result = train(cfg)
    return cfg, out, result


def stats_rows(out: Path) -> list[dict]:
    with open(out / "attn" / "stats.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_layer_1_grows_an_induction_head_and_layer_0_does_not(induction_run):
    cfg, out, result = induction_run
    last = [r for r in stats_rows(out) if int(r["step"]) == STEPS]
    score = {(int(r["layer"]), int(r["head"])): float(r["induction"]) for r in last}
    assert max(v for (layer, _), v in score.items() if layer == 1) >= 0.6
    assert max(v for (layer, _), v in score.items() if layer == 0) < 0.3
    # layer 0 holds the previous-token head the induction head reads from
    prev = {(int(r["layer"]), int(r["head"])): float(r["prev_token"]) for r in last}
    assert max(v for (layer, _), v in prev.items() if layer == 0) > 0.4
    # the recorded scores are those of the final model on the monitor's own probes
    prepared = prepare_data(cfg.data)
    tok = prepared.tokenizer
    probe = role_probe(tok.ordinary_ids(), tok.start_id, cfg.model.block_size, batch=cfg.attn.role_batch,
                       seed=ROLE_PROBE_SEED)
    text = torch.tensor([probe_ids(cfg, prepared, cfg.model.block_size)])
    expected = head_role_scores(result.model, text, probe)["induction"]
    recorded = np.array([[score[(layer, head)] for head in range(cfg.model.n_head)]
                         for layer in range(cfg.model.n_layer)])
    assert np.allclose(recorded, expected, atol=1e-5)


def test_the_second_copies_are_predicted_and_the_icl_score_falls(induction_run):
    cfg, out, result = induction_run
    with open(out / "attn" / "icl.csv", newline="") as f:
        icl = [(int(r["step"]), float(r["icl_score"])) for r in csv.DictReader(f)]
    assert [s for s, _ in icl] == list(range(150, STEPS + 1, 150))
    assert [s for s, _ in icl] == [e["step"] for e in result.evals]
    assert [v for _, v in icl] == pytest.approx([e["icl_score"] for e in result.evals])
    assert icl[-1][1] < icl[0][1] - 0.5  # late positions got far easier than early ones
    # a pair's second copy: every character after the first of the copy follows from the first copy
    prepared = prepare_data(cfg.data)
    tok = prepared.tokenizer
    line = "qwertyZXCV12"
    ids = torch.tensor([tok.encode("\n" + line + line)])
    logits, _ = result.model.eval()(ids)
    targets = ids[0, 1:]
    losses = torch.nn.functional.cross_entropy(logits[0, :-1], targets, reduction="none")
    second = losses[len(line) + 1:]  # predicting the copy's 2nd character onwards
    assert second.mean().item() < 1.0
    assert losses[1:len(line)].mean().item() > 2.0  # the first copy is random: nothing to learn


def test_the_picture_and_the_summary_name_the_phase_change(induction_run):
    cfg, out, result = induction_run
    png = out / "attn" / "heads_over_training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    line = result.induction_summary
    assert line.startswith("induction heads: L1.H")
    assert "phase change at step" in line
    step = int(line.split("phase change at step ")[1].split()[0])
    # the step named is the first snapshot whose largest induction score reached 0.5
    largest: dict[int, float] = {}
    for r in stats_rows(out):
        largest[int(r["step"])] = max(largest.get(int(r["step"]), -1.0), float(r["induction"]))
    steps = sorted(largest)
    assert step == next(s for s in steps if largest[s] >= 0.5) and largest[steps[0]] < 0.5

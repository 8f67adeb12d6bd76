"""The attention monitor's settings (attn.*, wandb.attn_interval) change what a run records: each test fails
when its setting is ignored or off by one."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.prepare import prepare_data
from insight.ablation import ablation_dloss
from insight.roles import head_role_scores, role_probe
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.attn_monitor import CIRCUIT_COLUMNS, ROLE_PROBE_SEED, STATS_COLUMNS, Probes, default_layers, probe_ids
from training.logger import RunLogger
from training.runtime import setup_runtime
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def test_the_probe_is_the_start_of_the_val_split_or_the_probe_text():
    cfg = tiny_config(Path("unused"))
    prepared = prepare_data(cfg.data)
    val = prepared.stream("val").read(0, 64)
    train_tokens = prepared.stream("train").read(0, 64)
    assert probe_ids(cfg, prepared, 32) == val[:32].tolist() != train_tokens[:32].tolist()
    assert probe_ids(cfg, prepared, 7) == val[:7].tolist()
    text_cfg = tiny_config(Path("unused"), "attn.probe_text=ROMEO: Who is there?")  # the text as the shell passes it
    assert probe_ids(text_cfg, prepared, 32) == prepared.tokenizer.encode("ROMEO: Who is there?")
    assert probe_ids(text_cfg, prepared, 5) == prepared.tokenizer.encode("ROMEO")  # cut to block_size


def test_default_layers_are_first_middle_and_last():
    assert default_layers(1) == [0] and default_layers(2) == [0, 1] and default_layers(5) == [0, 2, 4]
    assert default_layers(6) == [0, 3, 5]


def stats_keys(out: Path) -> list[tuple[int, int, int]]:
    rows = (out / "attn" / "stats.csv").read_text().splitlines()
    return [tuple(map(int, row.split(",")[:3])) for row in rows[1:]]


def test_stats_rows_stay_one_per_step_layer_and_head_across_a_crash_and_resume(tmp_path):
    """Snapshots every step, a checkpoint every 4: a crash after step 6 leaves rows for steps 5 and 6 that the
    resumed run redoes; the file ends with exactly one row per (step, layer, head)."""
    out = tmp_path / "run"
    overrides = ["train.max_iters=8", "eval.interval=4", "wandb.attn_interval=1", "attn.layers=[1]"]

    def crash_after_6(steps: int) -> bool:
        if steps == 6:
            raise RuntimeError("simulated crash")
        return False

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tiny_config(out, *overrides), should_stop=crash_after_6)
    assert sorted({k[0] for k in stats_keys(out)}) == [1, 2, 3, 4, 5, 6]
    train(tiny_config(out, *overrides))
    assert stats_keys(out) == [(step, layer, head) for step in range(1, 9) for layer in range(2) for head in range(4)]
    # a 32-token probe is drawn whole with every token labelled: no zoom beside it (LABEL_MAX_T = 48)
    assert sorted(p.name for p in (out / "attn" / "layer_1").iterdir()) == [f"step_{s:06d}.png" for s in range(1, 9)]
    assert not (out / "attn" / "layer_0").exists()  # attn.layers=[1]: only layer 1 is drawn
    # the evals' ICL scores: one row per eval (steps 4 and 8), the same values as metrics.jsonl's last ones
    icl = (out / "attn" / "icl.csv").read_text().splitlines()
    assert icl[0] == "step,icl_score" and [int(r.split(",")[0]) for r in icl[1:]] == [4, 8]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = {m["step"]: m["val/icl_score"] for m in metrics if "val/icl_score" in m}
    assert [float(r.split(",")[1]) for r in icl[1:]] == [last[4], last[8]]


def test_attn_enabled_false_records_no_attention(tmp_path):
    result = train(tiny_config(tmp_path / "off", "train.max_iters=2", "eval.interval=1", "attn.enabled=false"))
    assert result.attn_seconds == 0 and not (tmp_path / "off" / "attn").exists()
    result = train(tiny_config(tmp_path / "on", "train.max_iters=2", "eval.interval=1"))
    assert result.attn_seconds > 0
    assert sorted(p.name for p in (tmp_path / "on" / "attn").iterdir()) == [
        "circuit", "explorer", "heads_over_training.png", "icl.csv", "layer_0", "layer_1", "stats.csv"]


# --- head roles and ablation while training (attn.role_batch, attn.ablation) --------------------------------

def stats_at(out: Path, step: int) -> dict[tuple[int, int], dict[str, str]]:
    with open(out / "attn" / "stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {(int(r["layer"]), int(r["head"])): r for r in rows if int(r["step"]) == step}


def column(rows: dict, name: str, n_layer: int = 2, n_head: int = 4) -> np.ndarray:
    return np.array([[float(rows[(layer, head)][name]) for head in range(n_head)] for layer in range(n_layer)])


def text_probe(cfg, model) -> torch.Tensor:
    return torch.tensor([probe_ids(cfg, prepare_data(cfg.data), model.config.block_size)])


def test_role_batch_is_the_number_of_role_probe_sequences_the_scores_are_measured_on(tmp_path):
    cfg = tiny_config(tmp_path, "train.max_iters=3", "eval.interval=3", "attn.role_batch=3")
    result = train(cfg)
    rows = stats_at(tmp_path, 3)
    tok = prepare_data(cfg.data).tokenizer
    for batch, same in ((3, True), (8, False)):
        probe = role_probe(tok.ordinary_ids(), tok.start_id, 32, batch=batch, seed=ROLE_PROBE_SEED)
        expected = head_role_scores(result.model, text_probe(cfg, result.model), probe)
        for name in ("duplicate_token", "induction"):
            assert np.allclose(column(rows, name), expected[name], atol=1e-6) == same, (batch, name)
    assert np.allclose(column(rows, "prev_token"), expected["prev_token"], atol=1e-6)
    monitor_probes = Probes(cfg, result.model, prepare_data(cfg.data), setup_runtime("cpu", "float32"))
    assert monitor_probes.roles.shape == (3, 1 + 2 * 15)  # block 32: R = 15


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_mode_is_the_one_the_recorded_dloss_uses(tmp_path, mode):
    cfg = tiny_config(tmp_path, "train.max_iters=3", "eval.interval=3", f"attn.ablation={mode}")
    result = train(cfg)
    recorded = column(stats_at(tmp_path, 3), "ablation_dloss")
    idx = text_probe(cfg, result.model)
    other = "mean" if mode == "zero" else "zero"
    assert np.allclose(recorded, ablation_dloss(result.model, idx, mode), atol=1e-6)
    assert not np.allclose(recorded, ablation_dloss(result.model, idx, other), atol=1e-6)


def test_ablation_off_leaves_the_column_empty_and_logs_no_key(tmp_path, monkeypatch):
    logged: list[dict] = []
    monkeypatch.setattr(RunLogger, "_start_wandb", lambda self, cfg, mode, resumed: FakeRun(logged))
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)  # what the monitor imports to wrap its images
    train(tiny_config(tmp_path / "off", "train.max_iters=2", "eval.interval=2", "attn.ablation=off",
                      "wandb.mode=offline"))
    rows = stats_at(tmp_path / "off", 2)
    assert len(rows) == 8 and all(r["ablation_dloss"] == "" for r in rows.values())
    assert all(r["induction"] not in ("", "nan") for r in rows.values())  # the other columns are measured
    keys = set().union(*logged)
    assert "attn/L1.H3/induction" in keys and "val/icl_score" in keys
    assert not any(k.endswith("/ablation_dloss") for k in keys)
    assert isinstance(next(d for d in logged if "attn/heads_over_training" in d)["attn/heads_over_training"],
                      FakeWandb.Image)
    assert {"attn/layer_0", "attn/layer_1"} <= keys and not any(k.endswith("_zoom") for k in keys)  # 32 tokens
    picture = next(d for d in logged if "attn/circuit_picture" in d)["attn/circuit_picture"]
    assert isinstance(picture, FakeWandb.Image) and picture.path.endswith("circuit/step_000002.png")
    assert (tmp_path / "off" / "attn" / "circuit" / "step_000002.png").is_file()
    logged.clear()
    train(tiny_config(tmp_path / "on", "train.max_iters=2", "eval.interval=2", "wandb.mode=offline",
                      "model.block_size=64"))  # a 64-token probe: the zoom is logged beside each full map
    keys = set().union(*logged)
    assert "attn/L1.H3/ablation_dloss" in keys and {"attn/layer_0_zoom", "attn/layer_1_zoom"} <= keys
    assert (tmp_path / "on" / "attn" / "layer_1" / "step_000002_zoom.png").is_file()


class FakeRun:
    """A W&B run that keeps what is logged."""

    def __init__(self, logged: list[dict]):
        self.logged = logged

    def log(self, values: dict, step: int | None = None) -> None:
        self.logged.append(dict(values))

    def finish(self) -> None:
        pass


class FakeWandb:
    """Stands in for the wandb module: images and pages are what the monitor hands W&B."""

    class Image:
        def __init__(self, path, caption=""):
            self.path = path

    class Html:
        def __init__(self, path, inject=True):
            self.path = path


def test_an_older_stats_file_is_rewritten_under_the_new_header_on_resume(tmp_path):
    out = tmp_path / "run"
    overrides = ["train.max_iters=4", "eval.interval=2"]
    train(tiny_config(out, *overrides, "train.max_iters=2"))
    path = out / "attn" / "stats.csv"
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    old_header = ["step", "layer", "head", "entropy", "sink_mass", "mean_distance", "decay_gamma"]
    old = [old_header] + [[r[rows[0].index(name)] for name in old_header] for r in rows[1:]]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(old + [["2", "1"]])  # a line a crash cut short
    train(tiny_config(out, *overrides))
    with open(path, newline="") as f:
        new = list(csv.reader(f))
    assert new[0] == list(STATS_COLUMNS)
    kept = [r for r in new[1:] if r[0] == "2"]
    assert [r[:7] for r in kept] == old[1:]  # the old values, by column name
    assert all(cell == "" for r in kept for cell in r[7:])  # what the older run did not measure
    circuit = [STATS_COLUMNS.index(name) for name in CIRCUIT_COLUMNS]
    assert all(cell != "" for r in new[1:] if r[0] == "4" for k, cell in enumerate(r) if k not in circuit)
    # the circuit's columns: measured for every head of layer 1, empty for layer 0, which reads no earlier head
    assert all((r[k] != "") == (r[1] != "0") for r in new[1:] if r[0] == "4" for k in circuit)
    assert len(new) == 1 + 2 * 8

"""What a user reads of a run that stopped after 2 steps and was resumed to 4, through `train.py`'s main: the role
columns of stats.csv at both snapshots recomputed from the checkpoint weights of that step, the W&B scalars
equal to those cells, the heads-over-training picture drawing exactly the CSV's numbers, the induction
summary line and the final "done:" line recomputed from the files and the weights."""
from __future__ import annotations

import csv
import io
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

import train as train_cli
import training.attn_monitor as attn_monitor
from data.loader import BatchLoader
from data.prepare import prepare_data
from data.shards import SplitFiles
from insight.circuits import composition_zscores
from insight.roles import ROLE_NAMES, role_probe
from pretrained.checkpoint import load_model
from tests.helpers import TINY, prepared_shakespeare_dir, tiny_config
from tests.training.test_attn_monitor_settings import FakeRun, FakeWandb
from training.attn_monitor import CIRCUIT_COLUMNS, ROLE_PROBE_SEED, STATS_COLUMNS
from training.evaluate import EVAL_SEED_OFFSET
from training.logger import RunLogger

N_LAYER, N_HEAD = 2, 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, data_dir):
    """train.py for 2 steps, its latest/ kept aside, then train.py again to 4 steps. Returns the out_dir, the
    step-2 weights' folder, what W&B was handed and the pictures drawn during the resumed run, its stdout and
    stderr, and stats.csv as the first run left it."""
    root = tmp_path_factory.mktemp("resumed")
    out, logged, figures = root / "run", [], []
    args = [str(TINY), f"out_dir={out}", "train.peak_flops=1e12", "eval.interval=2", "wandb.mode=offline"]
    draw = attn_monitor.draw_heads_over_training
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        mp.setattr(RunLogger, "_start_wandb", lambda self, cfg, mode, resumed: FakeRun(logged))
        mp.setitem(sys.modules, "wandb", FakeWandb)
        mp.setattr(attn_monitor, "draw_heads_over_training",
                   lambda *a, **k: figures.append(draw(*a, **k)) or figures[-1])
        mp.setattr(sys, "stdout", io.StringIO())  # train.py routes both through its printer: private streams
        mp.setattr(sys, "stderr", io.StringIO())
        assert train_cli.main([*args, "train.max_iters=2"]) == 0
        shutil.copytree(out / "latest", root / "step2")
        first_stats = (out / "attn" / "stats.csv").read_text()
        logged.clear()
        figures.clear()
        stdout, stderr = io.StringIO(), io.StringIO()
        mp.setattr(sys, "stdout", stdout)
        mp.setattr(sys, "stderr", stderr)
        assert train_cli.main([*args, "train.max_iters=4"]) == 0
    return {"out": out, "step2": root / "step2", "logged": logged, "figures": figures, "stdout": stdout.getvalue(),
            "stderr": stderr.getvalue(), "first_stats": first_stats}


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def maps_by_hand(internals, n_head: int) -> dict[int, torch.Tensor]:
    """{layer: (B, n_head, T, T) float64}: softmax(q kᵀ / √d) under the causal mask, from the layer's own q, k."""
    maps = {}
    for layer, it in internals.items():
        q, k = it.q.double(), it.k.double()
        k = k.repeat_interleave(n_head // k.shape[1], dim=1)  # query head h reads kv head h // group
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        T = q.shape[2]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        maps[layer] = torch.softmax(scores, dim=-1)
    return maps


def role_scores_by_hand(weights_dir: Path, data_dir: Path) -> dict[tuple[int, int], dict[str, float]]:
    """Each head's three role scores, from the weights in weights_dir: prev_token over the probe text (the val
    split's first block_size tokens), duplicate_token and induction over the seeded role probe, each the
    mean of the one key per query the role names."""
    model, _ = load_model(weights_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        cfg = tiny_config(Path("unused"))
        prepared = prepare_data(cfg.data, quiet=True)
    T = model.config.block_size
    text = torch.tensor([[int(t) for t in prepared.stream("val").read(0, T)]])
    probe = role_probe(prepared.tokenizer.ordinary_ids(), prepared.tokenizer.start_id, T,
                       batch=cfg.attn.role_batch, seed=ROLE_PROBE_SEED)
    R = (probe.shape[1] - 1) // 2
    assert probe.shape[1] == 1 + 2 * R and torch.equal(probe[:, 1:R + 1], probe[:, R + 1:])
    with torch.no_grad():
        on_text = maps_by_hand(model.attention_internals(text), N_HEAD)
        on_probe = maps_by_hand(model.attention_internals(probe), N_HEAD)
    found = {}
    for layer in range(N_LAYER):
        for head in range(N_HEAD):
            w, p = on_text[layer][:, head], on_probe[layer][:, head]
            second = range(R + 1, 2 * R + 1)
            found[(layer, head)] = {
                "prev_token": sum(w[:, i, i - 1].mean().item() for i in range(1, T)) / (T - 1),
                "duplicate_token": sum(p[:, i, i - R].mean().item() for i in second) / R,
                "induction": sum(p[:, i, i - R + 1].mean().item() for i in second) / R}
    return found


@pytest.mark.parametrize("step", [2, 4])
def test_role_columns_at_each_snapshot_equal_the_scores_of_that_steps_weights(resumed, data_dir, step):
    rows = [r for r in csv_rows(resumed["out"] / "attn" / "stats.csv") if int(r["step"]) == step]
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [(l, h) for l in range(N_LAYER) for h in range(N_HEAD)]
    want = role_scores_by_hand(resumed["step2"] if step == 2 else resumed["out"] / "latest", data_dir)
    for r in rows:
        for name in ROLE_NAMES:
            assert float(r[name]) == pytest.approx(want[(int(r["layer"]), int(r["head"]))][name], abs=2e-6), \
                (step, r["layer"], r["head"], name)
    other = {2: resumed["out"] / "latest", 4: resumed["step2"]}[step]  # the other step's weights score otherwise
    wrong = role_scores_by_hand(other, data_dir)
    gap = max(abs(float(r[name]) - wrong[(int(r["layer"]), int(r["head"]))][name]) for r in rows for name in ROLE_NAMES)
    assert gap > 1e-4, gap


def test_the_resume_keeps_the_first_runs_rows_as_they_were(resumed):
    now = (resumed["out"] / "attn" / "stats.csv").read_text().splitlines()
    before = resumed["first_stats"].splitlines()
    assert now[:len(before)] == before and len(now) == 1 + 2 * N_LAYER * N_HEAD


def test_wandb_scalars_of_the_resumed_snapshot_equal_its_stats_cells(resumed):
    rows = [r for r in csv_rows(resumed["out"] / "attn" / "stats.csv") if r["step"] == "4"]
    logged = {k: v for d in resumed["logged"] for k, v in d.items() if k.startswith("attn/L")}
    per_head = [name for name in STATS_COLUMNS[3:] if name not in CIRCUIT_COLUMNS]
    want = {f"attn/L{r['layer']}.H{r['head']}/{name}": float(r[name]) for r in rows for name in per_head}
    assert logged == want  # every column of every head, and nothing else, at the value the CSV holds
    circuit = {k: v for d in resumed["logged"] for k, v in d.items() if k.startswith("attn/circuit/")}
    want = {f"attn/circuit/{kind}/L{r['layer']}.H{r['head']}": float(r[f"{kind}_z"])
            for r in rows if r["layer"] != "0" for kind in ("q", "k", "v")}
    assert circuit == want  # each layer-1 head's strongest source's z, per kind


def test_a_resumed_run_keeps_the_circuit_columns_of_both_snapshots(resumed):
    rows = csv_rows(resumed["out"] / "attn" / "stats.csv")
    assert list(rows[0]) == list(STATS_COLUMNS)
    for step, weights in (("2", resumed["step2"]), ("4", resumed["out"] / "latest")):
        model, _ = load_model(weights)
        z = composition_zscores(model)
        for r in rows:
            if r["step"] != step or r["layer"] == "0":
                continue
            head = int(r["head"])
            for kind in ("q", "k", "v"):
                column = head if z[kind].shape[3] == N_HEAD else head // (N_HEAD // z[kind].shape[3])
                values = z[kind][0, :, 1, column]
                assert r[f"{kind}_source"] == f"L0.H{int(values.argmax())}", (step, head, kind)
                assert float(r[f"{kind}_z"]) == pytest.approx(values.max(), rel=1e-9), (step, head, kind)


def test_the_picture_draws_the_csv_values_of_every_head_and_the_icl_csv(resumed):
    rows = csv_rows(resumed["out"] / "attn" / "stats.csv")
    icl = csv_rows(resumed["out"] / "attn" / "icl.csv")
    figure = resumed["figures"][-1]  # the one the resumed run drew last, after its step-4 snapshot
    top, bottom = figure.axes[:2]
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in top.lines
             if not line.get_label().startswith("_")}
    want = {f"{l}.{h}": ([2, 4], [float(r["induction"]) for r in rows if (r["layer"], r["head"]) == (str(l), str(h))])
            for l in range(N_LAYER) for h in range(N_HEAD)}
    assert drawn == want
    (icl_line,) = [line for line in bottom.lines if len(line.get_xdata()) > 0 and list(line.get_xdata()) != [0, 1]]
    assert list(icl_line.get_xdata()) == [2, 4]
    assert list(icl_line.get_ydata()) == [float(r["icl_score"]) for r in icl]
    assert any(msg.get("attn/heads_over_training") for msg in resumed["logged"])


def test_the_induction_summary_line_is_read_from_the_csv(resumed):
    rows = csv_rows(resumed["out"] / "attn" / "stats.csv")
    last = {(int(r["layer"]), int(r["head"])): float(r["induction"]) for r in rows if r["step"] == "4"}
    largest = {s: max(float(r["induction"]) for r in rows if r["step"] == s) for s in ("2", "4")}
    # a 4-step tiny model has no induction head and no phase change: the line says so with the CSV's numbers
    assert max(last.values()) <= 0.4 and max(largest.values()) < 0.5
    (l, h), top = max(last.items(), key=lambda item: item[1])
    line = (f"induction heads: none above 0.4 (largest L{l}.H{h} {top:.2f}); no phase change (largest induction "
            f"score stayed below 0.5)")
    assert line in resumed["stderr"].splitlines()


def test_the_done_line_reports_the_steps_and_the_val_loss_of_best(resumed, data_dir):
    (done,) = [line for line in resumed["stdout"].splitlines() if line.startswith("done:")]
    found = re.fullmatch(r"done: (\d+) steps in \d+s \(attention snapshots [\d.]+s, [\d.]+%\), best val loss "
                         r"([\d.]+); checkpoints in (.+)/best and .+/latest\. Sample with: .*", done)
    assert found and int(found.group(1)) == 4 and found.group(3) == str(resumed["out"]), done
    model, _ = load_model(resumed["out"] / "best")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        cfg = tiny_config(Path("unused"))
        prepared = prepare_data(cfg.data, quiet=True)
    loader = BatchLoader(SplitFiles(prepared.split_paths("val"), prepared.dtype), model.config.block_size,
                         cfg.train.batch_size, seed=cfg.seed + EVAL_SEED_OFFSET)
    losses = []
    for _ in range(cfg.eval.iters):
        x, y = loader.next_batch()
        with torch.no_grad():
            logits = model(x)[0].double()
        losses.append((torch.logsumexp(logits, -1) - logits.gather(-1, y[..., None])[..., 0]).mean().item())
    assert float(found.group(2)) == pytest.approx(sum(losses) / len(losses), abs=5.1e-5)

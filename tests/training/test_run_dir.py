"""A run directory has one writer, and readers never write, through the command lines.

A second train.py on a run's out_dir gets exit 2 naming the holder's pid, and the lock of a killed run blocks
nobody; sample.py reads a half-swapped run in place and writes nothing there; a reader in a loop never
disturbs a run that keeps saving. (The lock and the recovery in process: tests/training/test_run_dir_lock.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pretrained.checkpoint import load_checkpoint, read_config
from tests.helpers import REPO, assert_one_line_error, fresh_copy, prepared_shakespeare_dir, run_cli
from training.checkpoint import BEST, LATEST, TEST_SAVE_DELAY_ENV, load_train_state
from training.run_dir import LOCK_FILE

RUN_ARGS = ["train.log_interval=1", "attn.enabled=false", "wandb.mode=disabled", "train.peak_flops=1e12"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "ATTNGPT_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", **extra}


def start_train(out: Path, data_dir: Path, log: Path, *overrides: str, **env: str) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "train.py", "configs/tiny.yaml", f"out_dir={out}", *RUN_ARGS,
                                 *overrides], cwd=REPO, env=cli_env(data_dir, **env), stdout=subprocess.DEVNULL,
                                stderr=err)


def wait_until(condition, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "timed out waiting for the training process"
        time.sleep(0.02)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path below `folder` with its size and mtime: what a reader must leave exactly as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


# --- the lock ----------------------------------------------------------------------------------------------

def test_a_second_run_on_the_same_out_dir_is_refused_naming_the_holder(tmp_path, data_dir):
    out, log = tmp_path / "run", tmp_path / "first.txt"
    first = start_train(out, data_dir, log, "train.max_iters=100000", "eval.interval=100000")
    try:
        wait_until(lambda: (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size > 0,
                   first, log)
        before = (out / "metrics.jsonl").read_text()
        second = run_cli(["train.py", "configs/tiny.yaml", f"out_dir={out}", *RUN_ARGS],
                         env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
        assert_one_line_error(second, "train.py", f"out_dir '{out}' is in use by another training run "
                              f"(pid {first.pid} on", "wait for it to finish or stop it, or choose another out_dir")
        assert first.poll() is None  # the first run goes on, alone
        assert (out / "metrics.jsonl").read_text().startswith(before)  # and nobody else wrote its metrics
    finally:
        first.kill()
        first.wait()
    # killed (SIGKILL), it left its lock file behind: a stale file, which blocks nobody
    assert (out / LOCK_FILE).is_file() and str(first.pid) in (out / LOCK_FILE).read_text()
    third = run_cli(["train.py", "configs/tiny.yaml", f"out_dir={tmp_path / 'run'}", "train.max_iters=2",
                     "eval.interval=2", *RUN_ARGS], env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert third.returncode == 0, third.stderr[-2000:]


# --- readers never write -------------------------------------------------------------------------------

def test_sample_reads_a_half_swapped_run_in_place_and_writes_nothing(tmp_path, trained):
    """best/ caught between the two renames of a save: sample.py reads .best.old where it lies, and the run
    folder is exactly as before (nothing renamed back, no attention dump inside it)."""
    out, _ = fresh_copy(trained, tmp_path)
    os.replace(out / BEST, out / f".{BEST}.old")
    before = snapshot(out)
    proc = run_cli(["sample.py", "--ckpt", str(out), "--prompt", "ROMEO:", "--max-new-tokens", "5",
                    "--dump-attn", "0"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{out / ('.' + BEST + '.old')}]" in proc.stderr  # the folder it read, in its summary line
    assert snapshot(out) == before
    assert (tmp_path / "attn_dump" / "attn.npz").is_file()  # the dump went to ./attn_dump, outside the run


def test_a_reader_in_a_loop_never_disturbs_a_run_that_keeps_saving(tmp_path, data_dir):
    """A run evaluates and saves latest/ (and best/ whenever val improves) at every step, its saves slowed to
    widen the window between renames; meanwhile this test reads the run's checkpoint as fast as it can, the
    way sample.py does. The run finishes cleanly, every read returns a complete checkpoint, the reads never
    go back in time, and nothing is lost: best/ holds the eval with the lowest val loss."""
    out, log = tmp_path / "run", tmp_path / "train.txt"
    max_iters = 24
    proc = start_train(out, data_dir, log, f"train.max_iters={max_iters}", "eval.interval=1", "eval.iters=1",
                       "train.lr=1e-2", **{TEST_SAVE_DELAY_ENV: "0.05"})
    reads, kinds = [], set()
    try:
        wait_until(lambda: (out / BEST).is_dir() or (out / f".{BEST}.old").is_dir(), proc, log)
        while proc.poll() is None:
            folder, model, payload = load_checkpoint(out)
            assert all(torch.isfinite(p).all() for p in model.parameters())
            reads.append(payload["step"])
            kinds.add(folder.name)
        rc = proc.wait()
    finally:
        proc.kill()
        proc.wait()
    assert rc == 0, log.read_text()[-2000:]
    assert len(reads) > 20 and reads == sorted(reads), reads  # a checkpoint read never goes back in time
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(row["step"], row["val/loss"]) for row in evals if "val/loss" in row]
    assert [step for step, _ in evals] == list(range(1, max_iters + 1))
    best_step, best_val = min(evals, key=lambda e: e[1])
    assert read_config(out / BEST)["step"] == best_step
    assert read_config(out / BEST)["val_loss"] == pytest.approx(best_val)
    assert load_train_state(out / LATEST)["step"] == max_iters
    assert not [p for p in out.iterdir() if p.name.endswith((".old", ".tmp"))]
    print(f"{len(reads)} reads, folders read: {sorted(kinds)}")

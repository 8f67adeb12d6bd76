"""Nothing lost, nothing executed: SIGKILL at random moments (checkpoint saves included) never leaves an
unloadable checkpoint and the resumed run equals an uninterrupted one; SIGINT/SIGTERM save and exit
130/143; a failed write keeps the previous checkpoint; a non-finite model never overwrites a good one;
planted pickles are refused without running (tests/pretrained/test_checkpoint_safe_loading.py).

The crash test drives the real command line. To hit the save window on purpose (not only by chance) it
sets ATTNGPT_TEST_SAVE_DELAY, the hook of training/checkpoint.py that pauses a save once its temporary
folder is complete and again between its two renames.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from pretrained.checkpoint import find_checkpoint, load_model, read_config
from tests.helpers import REPO, default_sigint, fresh_copy, prepared_shakespeare_dir, run_cli, tiny_config
from training.checkpoint import BEST, LATEST, STATE_FILE, TEST_SAVE_DELAY_ENV, load_train_state, save_checkpoint
from training.trainer import train

# the tiny run of the crash and signal tests: a checkpoint every 2 steps; the peak FLOP/s is given, so no
# process spends its start measuring it
RUN_ARGS = ["eval.interval=2", "eval.iters=2", "train.log_interval=1", "attn.enabled=false", "wandb.mode=disabled",
            "train.peak_flops=1e12"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    # one thread: results do not depend on how many cores are free, and the test shares the machine nicely
    return {**os.environ, "ATTNGPT_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", **extra}


def train_argv(out_dir: Path, max_iters: int) -> list[str]:
    return [sys.executable, "train.py", "configs/tiny.yaml", f"out_dir={out_dir}", f"train.max_iters={max_iters}",
            *RUN_ARGS]


def start(out_dir: Path, max_iters: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as err:  # a file, not a pipe: a pipe nobody reads can block the process
        return subprocess.Popen(train_argv(out_dir, max_iters), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=default_sigint)


def metrics_lines(out_dir: Path) -> int:
    path = out_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def train_losses(out_dir: Path) -> dict[int, float]:
    """step -> train loss from metrics.jsonl; a resumed run logs redone steps again: the last entry wins."""
    losses = {}
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            losses[row["step"]] = row["train/loss"]
    return losses


def wait_for(condition, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Poll every 5 ms until condition() holds (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return condition()
        time.sleep(0.005)
    raise AssertionError("timed out waiting for the training process")


def modified_since(path: Path, t: float) -> bool:
    try:
        return path.stat().st_mtime > t
    except FileNotFoundError:
        return False


def complete_checkpoint(out_dir: Path, name: str) -> Path | None:
    """What a resume finds after a crash: `name`, or `.name.old` when the save died between its renames."""
    for candidate in (out_dir / name, out_dir / f".{name}.old"):
        if candidate.is_dir():
            return candidate
    return None


def assert_checkpoints_load(out_dir: Path, scratch: Path) -> int | None:
    """What a resume would find: the latest checkpoint (`.latest.old` if a save died between its renames)
    loads, weights and training state; best/ loads too (as a reader finds it). Checked on a copy, and
    without renaming anything: the next run has to do the recovery. Returns the latest step (None before
    the first save)."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(out_dir, scratch)
    step = None
    latest = complete_checkpoint(scratch, LATEST)
    if latest is not None:
        model, _ = load_model(latest)
        state = load_train_state(latest)
        step = state["step"]
        assert step % 2 == 0, step  # only evals (every 2 steps) and the end save
        assert all(torch.isfinite(p).all() for p in model.parameters())
    if complete_checkpoint(scratch, BEST) is not None:
        load_model(find_checkpoint(scratch))
    return step


def resumed_at(log: Path) -> int | None:
    """The step a train.py process said it resumed from ("resuming from '...' at step N"), if it got there."""
    return resumed_at_text(log.read_text() if log.is_file() else "")


def resumed_at_text(text: str) -> int | None:
    marker = text.rfind("' at step ")
    if "resuming from '" not in text or marker < 0:
        return None
    return int(text[marker + len("' at step "):].split()[0])


def test_sigkill_at_random_moments_never_loses_a_checkpoint_and_resume_is_exact(tmp_path, data_dir):
    """10 SIGKILLs: 2 early (start-up, data, resume loading), 4 at seeded random moments of training (evals
    and saves happen every 2 steps, so some land in saves), 2 with the temporary checkpoint folder complete
    but not yet renamed, 2 between the two renames. After each, the checkpoint on disk loads; at the end,
    the per-step losses equal an uninterrupted run's exactly."""
    max_iters = 50
    straight = tmp_path / "straight"
    proc = subprocess.run(train_argv(straight, max_iters), cwd=REPO, env=cli_env(data_dir), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = train_losses(straight)
    assert sorted(expected) == list(range(1, max_iters + 1))

    out, scratch = tmp_path / "crashed", tmp_path / "scratch"
    rng = random.Random(20240608)
    kinds = ["startup", "startup", "random", "random", "random", "random", "save_tmp", "save_tmp",
             "save_between", "save_between"]
    rng.shuffle(kinds)
    delay = 1.0  # seconds the save hook pauses in each of its two windows (margin for a loaded CI machine)
    steps_seen, kills = [], []  # the latest step on disk after each kill (None before the first save)
    for attempt, kind in enumerate(kinds):
        env = cli_env(data_dir, **({TEST_SAVE_DELAY_ENV: str(delay)} if kind.startswith("save") else {}))
        lines_before = metrics_lines(out)
        started = time.time()
        proc = start(out, max_iters, env, tmp_path / f"stderr_{attempt}.txt")
        # conditions look at this process's own progress and files: a killed save leaves a stale .latest.tmp
        # behind, and a stale .latest.old until the resume recovers it
        progressed = lambda extra=0: metrics_lines(out) > lines_before + extra  # noqa: E731
        tmp_state = out / f".{LATEST}.tmp" / STATE_FILE
        try:
            if kind == "startup":  # imports, data, resume loading (start-up takes ~3 s here)
                time.sleep(rng.uniform(0.1, 1.0))
                alive = proc.poll() is None
            elif kind == "random":  # a few steps in (1.5 metrics lines a step), then anywhere in what follows
                lines = rng.randint(0, 4)
                alive = wait_for(lambda: progressed(lines), proc)
                time.sleep(rng.uniform(0.0, 0.15))
                alive = alive and proc.poll() is None
            elif kind == "save_tmp":  # temp folder written, renames not yet done
                alive = wait_for(lambda: progressed() and modified_since(tmp_state, started), proc)
                time.sleep(delay / 4)
            else:  # save_between: latest moved aside, the new one not yet in place
                alive = wait_for(lambda: progressed() and (out / f".{LATEST}.old").is_dir(), proc)
            assert alive, (kind, (tmp_path / f"stderr_{attempt}.txt").read_text()[-2000:])
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            rc = proc.wait(timeout=60)
        assert rc == -signal.SIGKILL, (kind, rc)
        if kind == "save_tmp":  # the new one complete in .latest.tmp; latest still the previous one (if any)
            assert (out / f".{LATEST}.tmp").is_dir()
            assert (out / LATEST).is_dir() == any(s is not None for s in steps_seen)
        if kind == "save_between":  # caught in the window that only .latest.old recovery survives
            assert (out / f".{LATEST}.old").is_dir() and not (out / LATEST).exists()
        step = assert_checkpoints_load(out, scratch)
        saved_before = [s for s in steps_seen if s is not None]
        if saved_before:  # a checkpoint, once saved, is never lost and never goes back
            assert step is not None and step >= saved_before[-1], (kind, step, steps_seen)
        # the process just killed resumed from exactly what the previous kill left on disk (when it got that
        # far): a skipped recovery of .latest.old would restart it from step 0
        resumed = resumed_at(tmp_path / f"stderr_{attempt}.txt")
        if resumed is not None:
            assert saved_before and resumed == saved_before[-1], (kind, resumed, steps_seen)
        steps_seen.append(step)
        kills.append((kind, step, resumed))

    print(f"kills (kind, latest step on disk, step resumed from): {kills}")  # shown with pytest -s
    # the kills landed where they were aimed: at least one resume started from a checkpoint that only the
    # recovery of .latest.old could give back (a save_between kill, then a process that got to resuming)
    after_between = [kills[i + 1][2] for i, (kind, _, _) in enumerate(kills[:-1]) if kind == "save_between"]
    assert any(s is not None for s in steps_seen) and max(s for s in steps_seen if s is not None) < max_iters
    final = subprocess.run(train_argv(out, max_iters), cwd=REPO, env=cli_env(data_dir), capture_output=True,
                           text=True, timeout=180)
    assert final.returncode == 0 and "Traceback" not in final.stderr, final.stderr[-2000:]
    assert f"done: {max_iters} steps in " in final.stdout
    final_resume = resumed_at_text(final.stderr)
    assert final_resume == steps_seen[-1], (final_resume, kills)
    if kinds[-1] == "save_between":
        after_between.append(final_resume)
    assert any(s is not None for s in after_between), kills
    assert not (out / f".{LATEST}.tmp").exists() and not (out / f".{LATEST}.old").exists()
    assert train_losses(out) == expected  # exact float equality, every step 1..max_iters
    assert load_train_state(out / LATEST)["step"] == max_iters


def test_sigint_and_sigterm_save_exit_cleanly_and_the_run_resumes(tmp_path, data_dir):
    out, max_iters = tmp_path / "run", 40
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        lines_before = metrics_lines(out)
        log = tmp_path / f"{sig.name}.txt"
        proc = start(out, max_iters, cli_env(data_dir), log)
        try:
            assert wait_for(lambda: metrics_lines(out) > lines_before, proc), log.read_text()[-2000:]
            proc.send_signal(sig)
            rc = proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait()
        stderr = log.read_text()
        assert rc == status, (sig.name, rc, stderr[-2000:])
        assert "Traceback" not in stderr, stderr[-2000:]
        message = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith(f"{sig.name}: ")]
        assert len(message) == 1 and "checkpoint saved" in message[0] and "Run the same command" in message[0], \
            stderr[-2000:]
        stopped_at = int(message[0].split("stopped after step ")[1].split(";")[0])
        assert 0 < stopped_at < max_iters
        model, _ = load_model(out / LATEST)
        assert load_train_state(out / LATEST)["step"] == stopped_at
    proc = run_cli(train_argv(out, max_iters)[1:],
                   env_extra={"ATTNGPT_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"done: {max_iters} steps in " in proc.stdout
    assert sorted(train_losses(out)) == list(range(1, max_iters + 1))


# --- write errors and non-finite models, in-process --------------------------------------------------------

def assert_still_step_2(out: Path) -> None:
    load_model(out / LATEST)
    assert load_train_state(out / LATEST)["step"] == 2
    assert not (out / f".{LATEST}.tmp").exists() and not (out / f".{LATEST}.old").exists()


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_write_error_during_a_save_keeps_the_previous_checkpoint(tmp_path, trained, monkeypatch):
    out, model = fresh_copy(trained, tmp_path)
    extra = {k: v for k, v in read_config(out / LATEST).items() if k != "model"}
    state = {**load_train_state(out / LATEST), "step": 99}
    from safetensors import SafetensorError
    failures = [
        ("pretrained.checkpoint.save_file", disk_full),  # weights
        ("torch.save", disk_full),  # training state
        # what the libraries really raise on a full disk: not OSError
        ("pretrained.checkpoint.save_file", lambda *a, **k: (_ for _ in ()).throw(
            SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))),
        ("torch.save", lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file"))),
    ]
    for target, failure in failures:
        with monkeypatch.context() as mp:
            mp.setattr(target, failure)
            with pytest.raises(UserError) as e:
                save_checkpoint(out, LATEST, model, extra, state)
        message = str(e.value)
        assert "\n" not in message and "could not write checkpoint" in message, message
        assert "the previous checkpoint is intact" in message and "Free disk space" in message
        assert_still_step_2(out)

    # the second rename fails (latest already moved aside): the previous checkpoint is put back
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).endswith(f".{LATEST}.tmp"):
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    with monkeypatch.context() as mp:
        mp.setattr("training.checkpoint.os.replace", failing_replace)
        with pytest.raises(UserError, match="Input/output error.*previous checkpoint is intact"):
            save_checkpoint(out, LATEST, model, extra, state)
    assert_still_step_2(out)

    # inside a run: a resumed run whose save fails stops with the UserError; the step-2 checkpoint stays
    with monkeypatch.context() as mp:
        mp.setattr("torch.save", disk_full)
        with pytest.raises(UserError, match="could not write checkpoint .*No space left on device"):
            train(tiny_config(out, "train.max_iters=4", "eval.interval=2", "attn.enabled=false"))
    assert_still_step_2(out)


def test_a_nonfinite_model_never_overwrites_a_good_checkpoint(tmp_path, trained):
    out, model = fresh_copy(trained, tmp_path)
    extra = {k: v for k, v in read_config(out / LATEST).items() if k != "model"}
    poisoned = type(model)(model.config)
    poisoned.load_state_dict(model.state_dict())
    for value in (float("nan"), float("inf")):
        with torch.no_grad():
            next(poisoned.parameters()).view(-1)[3] = value
        with pytest.raises(UserError, match="NaN or inf.*keeps the last good checkpoint"):
            save_checkpoint(out, LATEST, poisoned, extra, {**load_train_state(out / LATEST), "step": 99})
        with pytest.raises(UserError, match="NaN or inf"):
            save_checkpoint(out, BEST, poisoned, extra)
        assert_still_step_2(out)
        assert torch.equal(load_model(out / BEST)[0].tok_emb.weight, model.tok_emb.weight)


NAN_AT_STEP_5 = """
import sys
from model.gpt import GPT
real_forward = GPT.forward
calls = [0]
def poisoned(self, idx, targets=None, input_pos=None):
    logits, loss = real_forward(self, idx, targets, input_pos)
    if self.training and loss is not None:
        calls[0] += 1
        if calls[0] == 6:  # step 5 (0-based), after the checkpoint at step 4
            loss = loss * float("nan")
    return logits, loss
GPT.forward = poisoned
import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_cli_nonfinite_loss_exits_2_with_one_line_and_keeps_the_checkpoint(tmp_path, data_dir):
    """The real train.py main in a subprocess whose model turns NaN at step 5 (GPT.forward patched there)."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", NAN_AT_STEP_5, "configs/tiny.yaml", f"out_dir={out}",
                           "train.max_iters=8", "eval.interval=4", "attn.enabled=false", "train.peak_flops=1e12"],
                          cwd=REPO, env=cli_env(data_dir), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], proc.stderr[-2000:]  # one line, the last one
    assert lines[-1].startswith("train.py: error: step 5: the loss or gradient norm is not finite")
    assert "the last good checkpoint" in lines[-1] and "train.nonfinite=skip" in lines[-1]
    model, _ = load_model(out / LATEST)
    assert load_train_state(out / LATEST)["step"] == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())

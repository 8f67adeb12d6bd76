"""training/dist_checkpoint.py, the checkpoints of an FSDP run (dcp/ shards, fsdp_state.pt, consolidated weights),
through torchrun as a user runs it, on CPU (gloo):

- a run killed (SIGKILL, torchrun and every worker) and resumed from its sharded checkpoint equals the
  uninterrupted run (tests/training/conftest.py), step by step, weights bit for bit;
- a sharded checkpoint is refused, with one line, by a run of another kind or process count.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from pretrained.checkpoint import load_model
from tests.helpers import REPO, TINY_SIX_STEPS, TORCHRUN, assert_one_line_error, kill_tree, needs_cpu_fsdp, run_cli
from tests.training.test_parallel_fsdp import losses


@pytest.mark.slow
@needs_cpu_fsdp
def test_killed_fsdp_run_resumes_exactly(tmp_path, env, uninterrupted):
    out = tmp_path / "run"
    argv = [sys.executable, *TORCHRUN, *TINY_SIX_STEPS, f"out_dir={out}", "train.parallel=fsdp"]
    with open(tmp_path / "killed.log", "w") as log:  # slow saves: the kill may land inside one
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env, "WANDB_MODE": "disabled",
                                                     "ATTNGPT_TEST_SAVE_DELAY": "1"},
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out / "latest" / "fsdp_state.pt").is_file():  # the step-2 save is complete
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(0.02)
    time.sleep(1.5)  # into the steps or the pauses of the step-4 save
    kill_tree(proc.pid)  # torchrun and both workers
    proc.wait()
    resumed = run_cli([*TORCHRUN, *TINY_SIX_STEPS, f"out_dir={out}", "train.parallel=fsdp"], env_extra=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert losses(out) == pytest.approx(losses(uninterrupted), rel=1e-6, abs=1e-7)
    a, _ = load_model(out / "latest")
    b, _ = load_model(uninterrupted / "latest")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.slow
@needs_cpu_fsdp
def test_a_sharded_checkpoint_needs_fsdp_and_the_same_process_count(tmp_path, env, uninterrupted):
    more = ["train.max_iters=8", f"out_dir={uninterrupted}"]
    as_ddp = run_cli(["train.py", *TINY_SIX_STEPS, *more], env_extra=env)
    assert_one_line_error(as_ddp, "train.py", "was saved by train.parallel=fsdp", "train.parallel=fsdp")
    one_process = run_cli(["train.py", *TINY_SIX_STEPS, *more, "train.parallel=fsdp"], env_extra=env)
    assert_one_line_error(one_process, "train.py", "saved by 2 processes and this run has 1", "same number")

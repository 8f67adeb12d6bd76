"""FSDP2 on CPU (gloo), through torchrun as a user runs it:

- 2 processes (train.parallel=fsdp) give the losses of 1 process with twice the accumulation, and the
  same weights (the consolidated model.safetensors), as tests/training/test_parallel_ddp.py shows for DDP;
- a run killed (SIGKILL, torchrun and every worker) and resumed equals the uninterrupted run, step by step;
- a sharded checkpoint is refused, with one line, by a run of another kind or process count.
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

from pretrained.checkpoint import load_model
from tests.helpers import (REPO, assert_one_line_error, kill_tree, needs_cpu_fsdp, prepared_shakespeare_dir,
                           run_cli)

COMMON = ["configs/tiny.yaml", "train.max_iters=6", "train.log_interval=1", "eval.interval=2", "eval.iters=2",
          "model.dropout=0.0", "train.peak_flops=1e12"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {"ATTNGPT_DATA_DIR": str(prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))),
            "OMP_NUM_THREADS": "1"}


def losses(out_dir: Path) -> dict[int, float]:
    """step -> train loss; a resumed run logs redone steps again: the last entry wins."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env) -> Path:
    """2 processes, FSDP, 6 steps; the attention monitor on (its probe is a collective under FSDP)."""
    out = tmp_path_factory.mktemp("fsdp") / "run"
    proc = run_cli([*TORCHRUN, *COMMON, f"out_dir={out}", "train.parallel=fsdp"], env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
@needs_cpu_fsdp
def test_two_fsdp_processes_match_one_process_with_double_accumulation(tmp_path, env, uninterrupted):
    single = run_cli(["train.py", *COMMON, f"out_dir={tmp_path / 'one'}", "train.grad_accum=2",
                      "attn.enabled=false"], env_extra=env)
    assert single.returncode == 0, single.stderr[-2000:]
    one, two = losses(tmp_path / "one"), losses(uninterrupted)
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6), step
    sharded = sorted(p.name for p in (uninterrupted / "latest" / "dcp").iterdir())
    assert sharded == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name in ("latest", "best"):  # consolidated: a plain model, loadable by sample.py, equal to 1 process's
        fsdp_model, _ = load_model(uninterrupted / name)
        one_model, _ = load_model(tmp_path / "one" / name)
        for (key, a), (_, b) in zip(fsdp_model.state_dict().items(), one_model.state_dict().items()):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (name, key)
    assert len((uninterrupted / "attn" / "stats.csv").read_text().splitlines()) > 1  # rank 0's monitor wrote


@pytest.mark.slow
@needs_cpu_fsdp
def test_killed_fsdp_run_resumes_exactly(tmp_path, env, uninterrupted):
    out = tmp_path / "run"
    argv = [sys.executable, *TORCHRUN, *COMMON, f"out_dir={out}", "train.parallel=fsdp"]
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
    resumed = run_cli([*TORCHRUN, *COMMON, f"out_dir={out}", "train.parallel=fsdp"], env_extra=env, timeout=300)
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
    as_ddp = run_cli(["train.py", *COMMON, *more], env_extra=env)
    assert_one_line_error(as_ddp, "train.py", "was saved by train.parallel=fsdp", "train.parallel=fsdp")
    one_process = run_cli(["train.py", *COMMON, *more, "train.parallel=fsdp"], env_extra=env)
    assert_one_line_error(one_process, "train.py", "saved by 2 processes and this run has 1", "same number")


def test_the_fsdp2_api_is_found_where_each_pytorch_keeps_it(monkeypatch):
    """Public in torch.distributed.fsdp from PyTorch 2.6; under torch.distributed._composable.fsdp in 2.4 and 2.5."""
    import torch.distributed.fsdp as public
    from torch.distributed._composable import fsdp as composable

    from training.parallel import fsdp2
    assert fsdp2() is (public if hasattr(public, "fully_shard") else composable)
    monkeypatch.delattr(public, "fully_shard", raising=False)  # as in PyTorch 2.4 and 2.5
    assert fsdp2() is composable and callable(fsdp2().fully_shard)


def test_fsdp_on_a_cpu_needs_pytorch_2_6(monkeypatch):
    """Before 2.6 FSDP2 creates CUDA streams whatever the device: one clear line instead of a CUDA error."""
    from common.errors import UserError
    from training.parallel import check_fsdp_settings

    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.raises(UserError, match=r"needs PyTorch >= 2.6 \(this is 2.5.1\+cpu\).*train.parallel=ddp"):
        check_fsdp_settings(None, torch.device("cpu"))
    check_fsdp_settings(None, torch.device("cuda"))  # a GPU shards through the older module
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    check_fsdp_settings(None, torch.device("cpu"))

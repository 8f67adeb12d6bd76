"""PyTorch DDP on CPU (gloo): 2 processes give the same losses as 1 process with twice the accumulation,
and a 2-process run stopped and resumed gives the losses of the uninterrupted one.

The loader keys every micro-batch by its global index, so both setups see the same batches in each
step; DDP averages the two ranks' gradients, which equals accumulating over both halves in one process.
A resume restores each process's own loader position (every rank draws its own batches).
"""
from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli, shakespeare_data_dir


def losses(out_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_double_accumulation_and_resume_exactly(tmp_path):
    data_dir = shakespeare_data_dir(tmp_path / "data")
    common = ["configs/tiny.yaml", "train.max_iters=6", "train.log_interval=1", "eval.interval=3",
              "attn.enabled=false", "model.dropout=0.0", "train.lr_decay_iters=6"]
    env = {"ATTNGPT_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"}
    single = run_cli(["train.py", *common, f"out_dir={tmp_path / 'one'}", "train.grad_accum=2"], env_extra=env)
    assert single.returncode == 0, single.stderr[-2000:]
    ddp = run_cli(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *common,
                   f"out_dir={tmp_path / 'two'}", "train.grad_accum=1", "train.compile=auto"],
                  env_extra=env, timeout=300)  # compile: auto is timed on rank 0 and shared with rank 1
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4, abs=1e-5), step
    # only rank 0 saved, and the choice of compile: auto reached both ranks (they would hang otherwise)
    assert (tmp_path / "two" / "latest" / "model.safetensors").is_file()
    assert (tmp_path / "two" / "autotune.json").is_file()
    # stopped after step 3 (its checkpoint), then resumed to step 6: the losses of the uninterrupted run
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *common,
                f"out_dir={tmp_path / 'resumed'}"]
    first = run_cli([*torchrun, "train.max_iters=3"], env_extra=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli(torchrun, env_extra=env, timeout=300)
    assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr[-3000:]
    assert losses(tmp_path / "resumed") == pytest.approx(two, rel=1e-6, abs=1e-7)

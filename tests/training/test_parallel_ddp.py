"""PyTorch DDP on CPU (gloo): 2 processes give the same losses as 1 process with twice the accumulation,
and a 2-process run stopped and resumed gives the losses of the uninterrupted one. A process that finished
waits for the others before it leaves the group.

The loader keys every micro-batch by its global index, so both setups see the same batches in each
step; DDP averages the two ranks' gradients, which equals accumulating over both halves in one process.
A resume restores each process's own loader position (every rank draws its own batches).
"""
from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, run_cli, shakespeare_data_dir, tiny_config


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


TEARDOWN = """
import sys, time
from pathlib import Path
from training.runtime import setup_runtime, teardown_runtime
rt = setup_runtime("cpu", "float32")
marker = Path(sys.argv[1])
if rt.rank == 1:
    time.sleep(3)  # the slower process: rank 0 reaches its teardown long before
    marker.write_text("rank 1 is tearing down")
teardown_runtime(rt, finished=True)
if rt.rank == 0:
    print("rank 0 left after rank 1 arrived" if marker.exists() else "rank 0 left first", flush=True)
"""


def test_a_finished_process_leaves_the_group_only_when_every_process_has_finished(tmp_path):
    """A process that finished its run waits for the others before tearing down its gloo threads."""
    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN, encoding="utf-8")
    proc = run_cli(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                    str(tmp_path / "rank1")], env_extra={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 left after rank 1 arrived" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_train_tells_the_teardown_whether_the_run_finished(tmp_path, monkeypatch):
    """Only a run that ended normally waits for its peers at the barrier; one leaving on an error must not."""
    import training.trainer as trainer

    told = []
    monkeypatch.setattr(trainer, "teardown_runtime", lambda rt, finished=False: told.append(finished))
    trainer.train(tiny_config(tmp_path / "ok", "train.max_iters=2", "eval.interval=2", "attn.enabled=false"))

    def crash(steps: int) -> bool:
        raise RuntimeError("simulated crash")
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(tiny_config(tmp_path / "crash", "train.max_iters=2", "attn.enabled=false"), should_stop=crash)
    assert told == [True, False]


def test_mfu_under_ddp_is_per_device(tmp_path):
    """tokens_per_s counts both processes' tokens; MFU is one device's FLOP/s over one device's peak, so it is
    half of what the global token rate alone would give (a formula that divided every process's FLOPs by one
    device's peak reports world_size times the true MFU)."""
    from model import GPT, ModelConfig
    from pretrained.checkpoint import read_config
    data_dir = shakespeare_data_dir(tmp_path / "data")
    args = ["configs/tiny.yaml", f"out_dir={tmp_path / 'run'}", "train.max_iters=3", "train.log_interval=1",
            "eval.interval=100", "attn.enabled=false", "train.peak_flops=3e12", "train.compile=false", "dtype=float32"]
    proc = run_cli(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *args],
                   env_extra={"ATTNGPT_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_cfg = ModelConfig.from_dict(read_config(tmp_path / "run" / "latest")["model"])  # the model it trained
    flops_per_token = GPT(model_cfg).flops_per_token(model_cfg.block_size)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "mfu" in row]
    assert len(rows) == 3
    for row in rows:
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * flops_per_token / (2 * 3e12), rel=1e-9), row

"""The eval losses of a DDP run: every process evaluates its own batches (rank r of W draws the eval stream's
batches r, r + W, ...), and every process reports the mean over all of them. So two gloo processes with
eval.iters = I each report exactly what one process with eval.iters = 2I reports; neither reports its own
half. This process is rank 0 (in process, so mutation testing sees the code); rank 1 is a child process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from data.loader import BatchLoader
from model import GPT
from model.checkpoint import load_model, save_model
from tests.helpers import REPO, prepared_shakespeare_dir, tiny_config
from training.evaluate import EVAL_SEED_OFFSET, evaluate
from training.runtime import Runtime
from training.trainer import model_config_for

ITERS = 3
RANK_1 = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from data.prepare import prepare_data
from model.checkpoint import load_model
from tests.helpers import tiny_config
from training.evaluate import evaluate
from training.runtime import Runtime
store, ckpt, out_dir, result, iters = sys.argv[1:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=1, world_size=2, timeout=timedelta(seconds=120))
try:
    cfg = tiny_config(out_dir, f"eval.iters={iters}", "eval.batch_size=4")
    model, _ = load_model(ckpt)
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=None, rank=1, local_rank=1, world_size=2)
    losses = evaluate(model, cfg, prepare_data(cfg.data, quiet=True), rt, model.config.block_size)
    open(result, "w").write(json.dumps(losses))
finally:
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def local_mean(model: GPT, prepared, cfg, split: str, rank: int, world_size: int, iters: int) -> float:
    """The mean loss over the eval batches one process draws, computed from the loader directly."""
    loader = BatchLoader(prepared.split_paths(split), prepared.dtype, model.config.block_size, 4,
                         seed=cfg.seed + EVAL_SEED_OFFSET, rank=rank, world_size=world_size)
    with torch.no_grad():
        return sum(model(*loader.next_batch())[1].item() for _ in range(iters)) / iters


def test_two_processes_report_the_mean_over_both_processes_batches(tmp_path, data_dir):
    from data.prepare import prepare_data
    cfg = tiny_config(tmp_path / "run", f"eval.iters={ITERS}", "eval.batch_size=4")
    prepared = prepare_data(cfg.data, quiet=True)
    torch.manual_seed(0)
    model = GPT(model_config_for(cfg, prepared)).eval()
    save_model(model, tmp_path / "ckpt")
    model, _ = load_model(tmp_path / "ckpt")  # exactly the weights rank 1 reads

    store, result = tmp_path / "store", tmp_path / "rank1.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "ATTNGPT_DATA_DIR": str(data_dir)}
    child = subprocess.Popen([sys.executable, "-c", RANK_1, str(store), str(tmp_path / "ckpt"), str(tmp_path / "run"),
                              str(result), str(ITERS)], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=2,
                                timeout=timedelta(seconds=120))
        try:
            rt = Runtime(device=torch.device("cpu"), autocast_dtype=None, rank=0, local_rank=0, world_size=2)
            rank0 = evaluate(model, cfg, prepared, rt, model.config.block_size)
        finally:
            dist.destroy_process_group()
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-3000:]
    rank1 = json.loads(result.read_text())

    single = Runtime(device=torch.device("cpu"), autocast_dtype=None)
    one_process = evaluate(model, tiny_config(tmp_path / "run", f"eval.iters={2 * ITERS}", "eval.batch_size=4"),
                           prepared, single, model.config.block_size)
    assert rank0 == rank1  # every process logs the same number
    for split in ("train", "val"):
        assert rank0[split] == pytest.approx(one_process[split], rel=1e-6, abs=0), split
        halves = [local_mean(model, prepared, cfg, split, r, 2, ITERS) for r in (0, 1)]
        assert rank0[split] == pytest.approx(sum(halves) / 2, rel=1e-6, abs=0), split
        assert abs(halves[0] - halves[1]) > 1e-4, halves  # so a process's own half would not pass for the mean

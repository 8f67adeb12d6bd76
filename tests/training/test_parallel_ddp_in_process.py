"""Two gloo processes whose rank 0 is this test process (so mutation testing sees the code it runs) and whose
rank 1 is a child process running the same function: what every process of a DDP run must agree on.

- Eval losses: rank r of W draws the eval stream's batches r, r + W, ...; every process reports the mean over
  all of them. So two processes with eval.iters = I each report exactly what one process with eval.iters = 2I
  reports; neither reports its own half.
- dtype: auto: only rank 0 measures; every process runs at the choice it made.
tests/training/test_parallel_ddp.py runs whole training runs under torchrun.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from data.loader import BatchLoader
from data.shards import SplitFiles
from model import GPT
from pretrained.checkpoint import load_model, save_model
from tests.helpers import REPO, prepared_shakespeare_dir, tiny_config
from training.evaluate import EVAL_SEED_OFFSET, evaluate
from training.runtime import Runtime
from training.plan import with_vocab_size

ITERS = 3
# rank 1 ends with exit_now once it has left the group, as train.py under torchrun does: the interpreter's
# finalization can destroy gloo's threads unjoined ("terminate called without an active exception", SIGABRT), which
# once failed this test after rank 1 had written its result
RANK_1 = """
import json, sys, traceback
from datetime import timedelta
import torch, torch.distributed as dist
from common.errors import exit_now
from training.runtime import Runtime
store, result, *args = sys.argv[1:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=1, world_size=2, timeout=timedelta(seconds=120))
code = 0
try:
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=None, rank=1, local_rank=1, world_size=2)
    out = rank_1(rt, *args)
    with open(result, "w") as f:
        f.write(json.dumps(out))
except BaseException:
    traceback.print_exc()
    code = 1
finally:
    dist.destroy_process_group()
exit_now(code)
"""


def two_processes(tmp_path: Path, rank_0: Callable[[Runtime], Any], rank_1_code: str, *args: str) -> tuple[Any, Any]:
    """(rank 0's result, rank 1's JSON result): rank_0(rt) here, `def rank_1(rt, *args)` of rank_1_code in a
    child process, in one gloo group of two."""
    store, result = tmp_path / "store", tmp_path / "rank1.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", rank_1_code + RANK_1, str(store), str(result), *args], env=env,
                             cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=2,
                                timeout=timedelta(seconds=120))
        try:
            ours = rank_0(Runtime(device=torch.device("cpu"), autocast_dtype=None, rank=0, local_rank=0, world_size=2))
        finally:
            dist.destroy_process_group()
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-3000:]
    return ours, json.loads(result.read_text())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off

EVAL_RANK_1 = """
from data.prepare import prepare_data
from pretrained.checkpoint import load_model
from tests.helpers import tiny_config
from training.evaluate import evaluate

def rank_1(rt, ckpt, out_dir, iters):
    cfg = tiny_config(out_dir, f"eval.iters={iters}", "eval.batch_size=4")
    model, _ = load_model(ckpt)
    return evaluate(model, cfg, prepare_data(cfg.data, quiet=True), rt, model.config.block_size)
"""


def local_mean(model: GPT, prepared, cfg, split: str, rank: int, world_size: int, iters: int) -> float:
    """The mean loss over the eval batches one process draws, computed from the loader directly."""
    loader = BatchLoader(SplitFiles(prepared.split_paths(split), prepared.dtype), model.config.block_size, 4,
                         seed=cfg.seed + EVAL_SEED_OFFSET, rank=rank, world_size=world_size)
    with torch.no_grad():
        return sum(model(*loader.next_batch())[1].item() for _ in range(iters)) / iters


def test_two_processes_report_the_mean_over_both_processes_batches(tmp_path):
    from data.prepare import prepare_data
    cfg = tiny_config(tmp_path / "run", f"eval.iters={ITERS}", "eval.batch_size=4")
    prepared = prepare_data(cfg.data, quiet=True)
    torch.manual_seed(0)
    save_model(GPT(with_vocab_size(cfg, cfg.model, prepared.tokenizer.vocab_size)), tmp_path / "ckpt")
    model, _ = load_model(tmp_path / "ckpt")  # exactly the weights rank 1 reads

    rank0, rank1 = two_processes(tmp_path, lambda rt: evaluate(model, cfg, prepared, rt, model.config.block_size),
                                 EVAL_RANK_1, str(tmp_path / "ckpt"), str(tmp_path / "run"), str(ITERS))
    one_process = evaluate(model, tiny_config(tmp_path / "run", f"eval.iters={2 * ITERS}", "eval.batch_size=4"),
                           prepared, Runtime(device=torch.device("cpu"), autocast_dtype=None), model.config.block_size)
    assert rank0 == rank1  # every process logs the same number
    for split in ("train", "val"):
        assert rank0[split] == pytest.approx(one_process[split], rel=1e-6, abs=0), split
        halves = [local_mean(model, prepared, cfg, split, r, 2, ITERS) for r in (0, 1)]
        assert rank0[split] == pytest.approx(sum(halves) / 2, rel=1e-6, abs=0), split
        assert abs(halves[0] - halves[1]) > 1e-4, halves  # so a process's own half would not pass for the mean


AUTOTUNE_RANK_1 = """
import training.autotune as autotune
from tests.helpers import tiny_config

def rank_1(rt, out_dir):
    def never(*args, **kwargs):
        raise AssertionError("only rank 0 measures")
    autotune.choose = never
    cfg = tiny_config(out_dir, "dtype=auto", "train.compile=auto")
    choice, precision = autotune.decide_precision(cfg, rt, None, steps_left=100, resumed=False)
    return {"choice": choice.to_json(), "autocast": str(precision.autocast_dtype), "compile": precision.compile}
"""


def test_every_process_runs_at_the_precision_rank_0_chose(tmp_path, monkeypatch):
    import training.autotune as autotune
    cfg = tiny_config(tmp_path / "run", "dtype=auto", "train.compile=auto")
    (tmp_path / "run").mkdir()
    made = autotune.Choice(dtype="bfloat16", compile=True, comparisons=[
        autotune.Comparison({"float32": 2.0, "bfloat16": 1.5}, baseline="float32", kept="bfloat16"),
        autotune.Comparison({"bfloat16": 1.5, "bfloat16 compiled": 1.0}, baseline="bfloat16", kept="bfloat16 compiled")])
    monkeypatch.setattr(autotune, "choose", lambda *args, **kwargs: (made, None))

    def rank_0(rt):
        choice, precision = autotune.decide_precision(cfg, rt, lambda: (None, None, None), steps_left=100,
                                                      resumed=False)
        return choice, precision

    (choice, rank0), rank1 = two_processes(tmp_path, rank_0, AUTOTUNE_RANK_1, str(tmp_path / "run"))
    assert choice == made and (rank0.autocast_dtype, rank0.compile) == (torch.bfloat16, True)
    assert rank1 == {"choice": made.to_json(), "autocast": "torch.bfloat16", "compile": True}
    assert autotune.saved_choice(tmp_path / "run") == made  # saved once, by rank 0

"""training/parallel.py's FSDP2 on CPU (gloo), through torchrun as a user runs it: 2 processes
(train.parallel=fsdp) give the losses of 1 process with twice the accumulation, and the same weights (the
consolidated model.safetensors), as tests/training/test_parallel_ddp.py shows for DDP; where each PyTorch keeps
the FSDP2 API, and the version a CPU needs. The run's sharded checkpoints (a killed run resumed, a checkpoint
refused by another kind of run): test_dist_checkpoint.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pretrained.checkpoint import load_model
from tests.helpers import TINY_SIX_STEPS, needs_cpu_fsdp, run_cli


def losses(out_dir: Path) -> dict[int, float]:
    """step -> train loss; a resumed run logs redone steps again: the last entry wins."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


@pytest.mark.slow
@needs_cpu_fsdp
def test_two_fsdp_processes_match_one_process_with_double_accumulation(tmp_path, env, uninterrupted):
    single = run_cli(["train.py", *TINY_SIX_STEPS, f"out_dir={tmp_path / 'one'}", "train.grad_accum=2",
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

"""data/loader.py, BatchLoader: exact shifted windows, in bounds, seeded, resumable, distinct per rank and split
(a split of several shards read as one stream: test_shards.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import UserError
from data.loader import BatchLoader
from data.shards import SplitFiles
from tests.helpers import write_bin


def draw(loader: BatchLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def same(a: list, b: list) -> bool:
    return all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def test_windows_are_exact_shifts(train_bin: Path) -> None:
    loader = BatchLoader(SplitFiles(train_bin, np.uint16), block_size=8, batch_size=4, seed=0)
    for x, y in draw(loader, 20):
        assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        # the bin holds 0..999, so a window starting at s is s, s+1, ...: x is consecutive and y = x + 1
        assert torch.equal(x, x[:, :1] + torch.arange(8))
        assert torch.equal(y, x + 1)


def test_windows_reach_both_ends_and_stay_in_bounds(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "train.bin", np.arange(70000, 70010, dtype=np.uint32))  # ids past uint16
    loader = BatchLoader(SplitFiles(path, "uint32"), block_size=8, batch_size=16, seed=1)
    starts = set()
    for x, y in draw(loader, 10):
        assert int(x.min()) >= 70000 and int(y.max()) <= 70009
        starts.update(x[:, 0].tolist())
    assert starts == {70000, 70001}  # only two windows of 9 tokens fit in 10: both are drawn


def test_same_seed_same_batches_other_seed_others(train_bin: Path) -> None:
    a = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=7), 5)
    b = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=7), 5)
    c = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=8), 5)
    assert same(a, b) and not same(a, c)


def test_resume_draws_exactly_the_next_batches(train_bin: Path) -> None:
    run = BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=3)
    draw(run, 3)
    state = json.loads(json.dumps(run.state_dict()))  # as a checkpoint would store it
    uninterrupted = draw(run, 4)
    resumed = BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=3)
    resumed.load_state_dict(state)
    assert resumed.batches_drawn == 3
    assert same(draw(resumed, 4), uninterrupted)
    assert resumed.batches_drawn == 7


def test_ranks_and_splits_draw_different_streams(tmp_path: Path, train_bin: Path) -> None:
    val_bin = write_bin(tmp_path / "val.bin", np.arange(1000, dtype=np.uint16))
    rank0 = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=0, rank=0, world_size=2), 3)
    rank1 = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=0, rank=1, world_size=2), 3)
    val = draw(BatchLoader(SplitFiles(val_bin, np.uint16), 16, 4, seed=0), 3)
    assert not same(rank0, rank1) and not same(rank0, val)
    # two ranks interleave the single-process stream: together they draw exactly its batches
    single = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=0), 6)
    assert same(single[0::2], rank0) and same(single[1::2], rank1)


def test_state_of_another_rank_or_garbage_is_refused(train_bin: Path) -> None:
    state = BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=0, rank=0, world_size=2).state_dict()
    other = BatchLoader(SplitFiles(train_bin, np.uint16), 16, 4, seed=0, rank=1, world_size=2)
    with pytest.raises(UserError, match="rank 0 of 2"):
        other.load_state_dict(state)
    with pytest.raises(UserError, match="not valid"):
        other.load_state_dict({"rank": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 1000}, "fewer than block_size"),
    ({"rank": 2, "world_size": 2}, "outside world_size"),
    ({"batch_size": 0}, "at least 1"),
    ({"seed": -1}, "non-negative"),
])
def test_bad_arguments(train_bin: Path, kwargs: dict, message: str) -> None:
    args = {"block_size": 16, "batch_size": 4, "seed": 0, **kwargs}
    with pytest.raises(UserError, match=message):
        BatchLoader(SplitFiles(train_bin, np.uint16), **args)


def test_missing_or_ragged_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        BatchLoader(SplitFiles(tmp_path / "train.bin", np.uint16), 4, 2, seed=0)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 101)
    with pytest.raises(UserError, match="whole number"):
        BatchLoader(SplitFiles(tmp_path / "odd.bin", np.uint16), 4, 2, seed=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_batches_equal_cpu_batches(train_bin: Path) -> None:
    cpu = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 32, 8, seed=5), 3)
    gpu = draw(BatchLoader(SplitFiles(train_bin, np.uint16), 32, 8, seed=5, device="cuda"), 3)
    assert all(x.is_cuda and y.is_cuda for x, y in gpu)
    assert same(cpu, [(x.cpu(), y.cpu()) for x, y in gpu])


def test_ids_past_the_vocabulary_never_leave_the_loader(train_bin: Path) -> None:
    loader = BatchLoader(SplitFiles(train_bin, np.uint16, vocab_size=1000), block_size=16, batch_size=4, seed=0)
    draw(loader, 5)  # ids 0..999 fit
    with pytest.raises(UserError, match="holds token id 9[0-9][0-9], but the tokenizer has only 900 ids"):
        draw(BatchLoader(SplitFiles(train_bin, np.uint16, vocab_size=900), block_size=16, batch_size=64, seed=0), 20)

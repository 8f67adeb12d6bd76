"""data/shards.py: the shards of a split read as one stream (windows that straddle a shard boundary are exact, and
the batches those of one file), and the check of the ids a folder holds (whole up to FULL_CHECK_TOKENS, sampled
past it, with every batch the loader draws checked as well)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import UserError
from data import shards as shards_module
from data.loader import BatchLoader
from data.prepare import load_prepared
from data.shards import SplitFiles
from tests.data.test_loader import draw
from tests.data.test_prepared_trust import folder_of
from tests.helpers import prepared_shakespeare_dir, write_bin


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A prepared tinyshakespeare (as test_prepared_trust.py's), in place of conftest.py's empty folder."""
    return prepared_shakespeare_dir(tmp_path / "data")


def test_shards_read_as_one_stream_give_the_batches_of_one_file(tmp_path: Path, train_bin: Path) -> None:
    """The same 1000 ids cut into 3 unequal shards: every window is exact (some straddle a boundary) and
    the batches equal those of the single file."""
    ids = np.arange(1000, dtype=np.uint16)
    cuts = [0, 17, 600, 1000]
    paths = [write_bin(tmp_path / f"train_{k:05d}.bin", ids[a:b]) for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    sharded = BatchLoader(SplitFiles(paths, np.uint16), block_size=32, batch_size=8, seed=4)
    single = BatchLoader(SplitFiles(train_bin, np.uint16), block_size=32, batch_size=8, seed=4)
    assert sharded.split == single.split == "train" and sharded.n_tokens == 1000
    straddling = 0
    for (x, y), (x1, y1) in zip(draw(sharded, 40), draw(single, 40)):
        assert torch.equal(x, x1) and torch.equal(y, y1)
        assert torch.equal(x, x[:, :1] + torch.arange(32)) and torch.equal(y, x + 1)
        straddling += int(((x[:, 0] < 600) & (x[:, -1] >= 600)).sum() + ((x[:, 0] < 17) & (x[:, -1] >= 17)).sum())
    assert straddling > 0
    assert sharded.stream.read(10, 620).tolist() == list(range(10, 620))
def test_a_large_folder_is_sampled_and_the_loader_checks_every_batch(data_dir, monkeypatch):
    """Past FULL_CHECK_TOKENS only sampled blocks are read when a folder opens; an id outside them is
    caught by the batch that draws it, before it reaches the model."""
    folder = folder_of(data_dir)
    monkeypatch.setattr(shards_module, "FULL_CHECK_TOKENS", 0)
    monkeypatch.setattr(shards_module, "SAMPLE_TOKENS", 1000)
    ids = np.memmap(folder / "train_00000.bin", dtype=np.uint16, mode="r+")
    hidden = len(ids) // 3  # between the sampled blocks (at 0, 1/3 - 1000/3, 2/3 - ... of the shard)
    ids[hidden + 5000] = 65
    ids.flush()
    del ids
    prepared = load_prepared(folder)  # the sample misses it
    loader = BatchLoader(prepared.split_files("train"), block_size=64, batch_size=64, seed=0)
    drawn = 0
    with pytest.raises(UserError, match="holds token id 65, but the tokenizer has only 65 ids"):
        for drawn in range(2000):  # seeded: the same batches every run; one of them covers the bad id
            loader.next_batch()
    assert drawn > 0  # the batches before it passed
    monkeypatch.setattr(shards_module, "FULL_CHECK_TOKENS", 1 << 27)
    with pytest.raises(UserError, match="train_00000.bin' holds token id 65"):
        load_prepared(folder)

"""Prepared data is checked before it is trusted, and reading it never writes (through the real command lines).

- ids at or past the vocabulary, or a meta.json whose tokenizer is shorter than the ids used: the writer
  (`python -m data.prepare`) prepares the folder again; a reader that cannot (train.py on a read-only
  mount) exits 2 with one line naming the file;
- a complete folder on a read-only mount trains as it is, and nothing in it changes (no lock file);
- a folder of the older layout (train.bin / val.bin) is still read, and gives the same batches.

The sampled check of a large folder's ids: test_shards.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from data.loader import BatchLoader
from data.prepare import load_prepared, prepare_data
from data.shards import SplitFiles
from tests.helpers import TINY, assert_one_line_error, prepared_shakespeare_dir, run_cli
from tests.data.test_sharded import run_read_only, snapshot

TRAIN = ["train.py", str(TINY), "train.max_iters=1", "eval.interval=1", "eval.iters=1", "attn.enabled=false",
         "train.peak_flops=1e12"]


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return prepared_shakespeare_dir(tmp_path / "data")


def folder_of(data_dir: Path) -> Path:
    return next(p for p in (data_dir / "prepared").glob("tinyshakespeare-char-*") if p.is_dir())


def test_a_shortened_tokenizer_in_meta_is_refused_by_a_reader_and_repaired_by_the_writer(data_dir, tmp_path):
    folder = folder_of(data_dir)
    meta = json.loads((folder / "meta.json").read_text())
    meta["tokenizer"]["chars"] = meta["tokenizer"]["chars"][:-1]  # 64 characters left; the data uses id 64 ('z')
    (folder / "meta.json").write_text(json.dumps(meta))
    env = {"ATTNGPT_DATA_DIR": str(data_dir)}
    refused = run_read_only(data_dir, [*TRAIN, f"out_dir={tmp_path / 'out'}"], env)
    assert_one_line_error(refused, "train.py", "train_00000.bin' holds token ids up to 64",
                          "tokenizer in", "meta.json' has only 64 ids", "--force", "not writable here")
    repaired = run_cli(["-m", "data.prepare", str(TINY)], env_extra=env)
    assert repaired.returncode == 0 and "cannot be used" in repaired.stderr, repaired.stderr[-2000:]
    assert load_prepared(folder).tokenizer.vocab_size == 65


def test_a_complete_folder_on_a_read_only_mount_trains_and_is_left_as_it_was(data_dir, tmp_path):
    for lock in (data_dir / "prepared").glob("*.lock"):
        lock.unlink()
    before = snapshot(data_dir)
    proc = run_read_only(data_dir, [*TRAIN, f"out_dir={tmp_path / 'out'}"], {"ATTNGPT_DATA_DIR": str(data_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "latest" / "model.safetensors").is_file()
    assert snapshot(data_dir) == before


def test_ids_past_the_vocabulary_stop_training_with_one_line(data_dir, tmp_path):
    folder = folder_of(data_dir)
    ids = np.memmap(folder / "val_00000.bin", dtype=np.uint16, mode="r+")
    ids[1000] = 65  # tinyshakespeare's char vocabulary has ids 0..64
    ids.flush()
    del ids
    env = {"ATTNGPT_DATA_DIR": str(data_dir)}
    refused = run_read_only(data_dir, [*TRAIN, f"out_dir={tmp_path / 'out'}"], env)
    assert_one_line_error(refused, "train.py", "val_00000.bin' holds token id 65", "only 65 ids")
    trained = run_cli([*TRAIN, f"out_dir={tmp_path / 'out'}"], env_extra=env)  # the writer prepares it again
    assert trained.returncode == 0 and "preparing it again" in trained.stderr, trained.stderr[-2000:]


def test_a_folder_of_the_older_layout_is_read_and_gives_the_same_batches(data_dir):
    """train.bin / val.bin and a format-1 meta.json (before shards): reused as it is, one shard per split."""
    folder = folder_of(data_dir)
    prepared = load_prepared(folder)
    files = SplitFiles(prepared.split_paths("train"), prepared.dtype, "train")
    batches = [BatchLoader(files, 32, 4, seed=1).next_batch() for _ in range(1)]
    meta = json.loads((folder / "meta.json").read_text())
    for split in ("train", "val"):
        shutil.move(folder / f"{split}_00000.bin", folder / f"{split}.bin")
    for key in ("shards", "max_id", "parts"):
        meta.pop(key)
    meta["format_version"] = 1
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        from training.config import load_run_config
        old = prepare_data(load_run_config(TINY).data, quiet=True)
    assert old.reused and old.split_paths("train") == [folder / "train.bin"]
    assert old.train_tokens == prepared.train_tokens and old.tokenizer.to_json() == prepared.tokenizer.to_json()
    x, y = BatchLoader(SplitFiles(old.split_paths("train"), old.dtype), 32, 4, seed=1).next_batch()
    assert (x == batches[0][0]).all() and (y == batches[0][1]).all()


def test_the_help_names_a_config_that_exists():
    proc = run_cli(["-m", "data.prepare", "--help"])
    assert proc.returncode == 0 and "e.g. configs/small.yaml" in proc.stdout
    assert (TINY.parent / "small.yaml").is_file()

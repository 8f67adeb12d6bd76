"""A resume's data check: a checkpoint continues only on the data it was trained on. The tokenizer, both
splits' token counts and the content fingerprint are each compared on their own (a difference in any one is
other data); where the data lies is not compared. End to end: a corpus edited in the middle, to the same
size and the same characters, is other data, and the resume is refused before anything in latest/ changes."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.errors import UserError
from pretrained.checkpoint import read_config
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.checkpoint import LATEST
from training.resume import check_same_data, data_fingerprint
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled", "eval.iters=1"]
TOKENIZER = {"kind": "char", "chars": "abc"}
DATA = {"source": "text: corpus.txt", "train_tokens": 900, "val_tokens": 100, "fingerprint": "0123456789abcdef"}


def ours(**data) -> dict:
    return {"tokenizer": TOKENIZER, "data": {**DATA, **data}}


@pytest.mark.parametrize("key, value", [("train_tokens", 901), ("val_tokens", 99), ("fingerprint", "0123456789abcdee")])
def test_each_part_of_the_data_record_alone_makes_it_other_data(tmp_path, key, value):
    saved = {"tokenizer": TOKENIZER, "data": DATA}
    check_same_data(saved, ours(), tmp_path)  # the same data
    with pytest.raises(UserError, match="trained on other data") as e:
        check_same_data(saved, ours(**{key: value}), tmp_path)
    assert f"train.init_from={tmp_path}" in str(e.value)


def test_the_source_in_words_and_a_missing_record_are_not_compared(tmp_path):
    """The source's description says where the data came from (a moved corpus is the same data); a
    checkpoint from before data was recorded is compared on its tokenizer alone."""
    check_same_data({"tokenizer": TOKENIZER, "data": DATA}, ours(source="text: moved/corpus.txt"), tmp_path)
    check_same_data({"tokenizer": TOKENIZER}, ours(train_tokens=5, fingerprint="ffff"), tmp_path)
    with pytest.raises(UserError, match="another tokenizer"):
        check_same_data({"tokenizer": {"kind": "char", "chars": "abd"}, "data": DATA}, ours(), tmp_path)


def corpus(seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    return "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)) + "\n"


def test_a_corpus_edited_to_the_same_size_is_other_data_and_the_checkpoint_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    text = corpus()
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    out = tmp_path / "run"
    overrides = ["data.source=text", f"data.path={path}", "train.max_iters=4", "eval.interval=2", *QUIET]
    train(tiny_config(out, *overrides), should_stop=lambda steps: steps == 2)
    before = {p.name: p.read_bytes() for p in (out / LATEST).iterdir()}

    middle = len(text) // 3  # in the train split; swap two different characters: same size, same vocabulary
    j = next(k for k in range(middle + 1, len(text)) if text[k] != text[middle])
    edited = list(text)
    edited[middle], edited[j] = edited[j], edited[middle]
    path.write_text("".join(edited))
    with pytest.raises(UserError, match="trained on other data") as e:
        train(tiny_config(out, *overrides))
    saved = read_config(out / LATEST)["data"]  # the same counts, another fingerprint: only the content tells
    counts = f"{saved['train_tokens']} train / {saved['val_tokens']} val tokens, fingerprint "
    assert str(e.value).count(counts) == 2 and str(e.value).count(saved["fingerprint"]) == 1
    assert {p.name: p.read_bytes() for p in (out / LATEST).iterdir()} == before

    path.write_text(text)  # the data it was trained on: the resume goes on
    assert train(tiny_config(out, *overrides)).step == 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def test_the_fingerprint_covers_both_ends_of_both_splits(tmp_path, data_dir, monkeypatch):
    """One token changed at the first or the last position of either split changes the fingerprint (and
    nothing else in the record); the same tokens in another folder keep it. tinyshakespeare's train split
    (~1M tokens) is longer than what one read at its start covers."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    from data.prepare import load_prepared, prepare_data
    prepared = prepare_data(tiny_config(tmp_path).data, quiet=True)
    assert prepared.train_tokens * prepared.dtype.itemsize > 1 << 20
    record = data_fingerprint(prepared)
    seen = {record["fingerprint"]}
    for split in ("train", "val"):
        for where in (0, -1):
            copy = tmp_path / f"copy_{split}_{where}"
            shutil.copytree(prepared.dir, copy)
            shard = copy / prepared.split_paths(split)[where].name
            tokens = np.fromfile(shard, dtype=prepared.dtype)
            tokens[where] = (int(tokens[where]) + 1) % prepared.tokenizer.vocab_size
            tokens.tofile(shard)
            changed = data_fingerprint(load_prepared(copy))
            assert {k: v for k, v in changed.items() if k != "fingerprint"} == \
                {k: v for k, v in record.items() if k != "fingerprint"}
            seen.add(changed["fingerprint"])
            shutil.rmtree(copy)
    assert len(seen) == 5
    moved = tmp_path / "moved"
    shutil.copytree(prepared.dir, moved)
    assert data_fingerprint(load_prepared(moved)) == record


def test_a_sharded_resume_checks_the_config_first_and_names_the_checkpoint(tmp_path):
    """train.parallel=fsdp resumes through resume (its FSDP path), after read_resume_point: an unreadable config.json is
    refused naming latest/ before anything distributed is touched."""
    from model.config import ModelConfig
    from training.config import TrainConfig
    from training.resume import read_resume_point
    latest = tmp_path / "run" / LATEST
    latest.mkdir(parents=True)
    (latest / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_resume_point(latest, tmp_path / "run", ModelConfig(), ours(), TrainConfig(parallel="fsdp"))
    assert str(e.value).startswith(f"cannot resume from '{latest}': '{latest / 'config.json'}' is corrupted")
    assert str(e.value).endswith(f"use another out_dir, or delete '{tmp_path / 'run'}' to start over")

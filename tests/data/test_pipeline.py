"""data/pipeline.py, encoding a continuous text, through prepare_data: the tokens do not depend on streaming or
the process count (many small pieces), a parallel encoding leaves os.environ as it was, and a vocabulary past
uint16 is stored as uint32."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from data import pipeline
from data.prepare import prepare_data
from tests.data.test_prepare import cfg, tokens


def test_streaming_and_num_proc_do_not_change_the_bins(data_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "group_rows", _small_pieces(pipeline.group_rows))
    path = tmp_path / "t.txt"
    path.write_text("".join(f"Line {i} of the corpus.\n" for i in range(400)), encoding="utf-8")
    base = prepare_data(cfg(source="text", path=str(path)), quiet=True)
    expected = {s: tokens(base, s) for s in ("train", "val")}
    for extra in ({"streaming": True}, {"num_proc": 2}):
        again = prepare_data(cfg(source="text", path=str(path), **extra), quiet=True, force=True)
        assert {s: tokens(again, s) for s in ("train", "val")} == expected, extra


def test_a_parallel_prepare_leaves_os_environ_as_it_was(data_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets' map(num_proc > 1) rebinds os.environ to a copy: a variable set before it (here data_dir's
    ATTNGPT_DATA_DIR, which monkeypatch removes afterwards) would outlive its undo and send a later run's
    data elsewhere."""
    monkeypatch.setattr(pipeline, "group_rows", _small_pieces(pipeline.group_rows))
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    path = tmp_path / "t.txt"
    path.write_text("".join(f"Line {i} of the corpus.\n" for i in range(400)), encoding="utf-8")
    environ = os.environ
    prepare_data(cfg(source="text", path=str(path), num_proc=2), quiet=True)
    assert os.environ is environ
    assert "TOKENIZERS_PARALLELISM" not in os.environ
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    prepare_data(cfg(source="text", path=str(path), num_proc=2), quiet=True, force=True)
    assert os.environ is environ and os.environ["TOKENIZERS_PARALLELISM"] == "true"


def _small_pieces(group_rows):
    """Force many pieces on a tiny corpus so the piece boundaries and the split inside a piece are exercised."""
    return lambda rows, target_chars=0, max_chars=None: group_rows(rows, target_chars=500)


def test_a_vocabulary_past_uint16_is_stored_as_uint32(data_dir: Path, tmp_path: Path) -> None:
    chars = [chr(c) for c in range(0x21, 0x11000) if not 0xD800 <= c <= 0xDFFF]  # 67,551 distinct characters
    text = "".join("".join(chars[i:i + 100]) + "\n" for i in range(0, len(chars), 100))
    (tmp_path / "wide.txt").write_text(text, encoding="utf-8")
    prepared = prepare_data(cfg(source="text", path=str(tmp_path / "wide.txt")), quiet=True)
    assert prepared.tokenizer.vocab_size == len(chars) + 1 and prepared.dtype == np.uint32
    assert prepared.split_paths('train')[0].stat().st_size == 4 * prepared.train_tokens
    assert prepared.tokenizer.decode(tokens(prepared, "train") + tokens(prepared, "val")) == text

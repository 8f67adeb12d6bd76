"""data/prepare.py, prepare_data end to end on tiny corpora: bins, reuse, re-prepare, the datasets path, and
bad input (where the text comes from: test_sources.py; how a continuous text is encoded: test_pipeline.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.config_io import from_dict
from common.errors import UserError
from data import sources
from data.config import DataConfig
from data.prepare import load_prepared, prepare_data
from data.tokenizer import CharTokenizer, TiktokenTokenizer

SHARED_SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare" / "input.txt"


@pytest.fixture
def shakespeare(data_dir: Path) -> str:
    if not SHARED_SHAKESPEARE.is_file():
        pytest.skip("tinyshakespeare not available offline")
    target = data_dir / "tinyshakespeare" / "input.txt"
    target.parent.mkdir(parents=True)
    shutil.copy(SHARED_SHAKESPEARE, target)
    return target.read_text(encoding="utf-8")


def gpt2() -> TiktokenTokenizer:
    try:
        return TiktokenTokenizer("gpt2")
    except UserError as e:
        pytest.skip(f"GPT-2 vocabulary not available offline: {e}")


def cfg(**raw: object) -> DataConfig:
    return from_dict(DataConfig, raw, "data.")


def tokens(prepared, split: str) -> list[int]:
    stream = prepared.stream(split)
    return stream.read(0, stream.n_tokens).tolist()


DOCS = [f"Story {i}: the fox number {i} jumped over {i % 7} lazy dogs." for i in range(40)]


def write_docs(tmp_path: Path, fmt: str, docs: list[str] = DOCS, column: str = "text") -> Path:
    import datasets

    table = datasets.Dataset.from_dict({column: docs, "id": list(range(len(docs)))})
    path = tmp_path / f"docs.{fmt}"
    table.to_parquet(str(path)) if fmt == "parquet" else table.to_json(str(path))
    return path


# --- tinyshakespeare --------------------------------------------------------------------------------------

def test_tinyshakespeare_char_matches_nanogpt(shakespeare: str) -> None:
    prepared = prepare_data(cfg(), quiet=True)
    split_at = int(len(shakespeare) * 0.9)
    assert (prepared.train_tokens, prepared.val_tokens) == (split_at, len(shakespeare) - split_at) == (1003854, 111540)
    assert prepared.dtype == np.uint16 and prepared.meta["dtype"] == "uint16"
    tok = prepared.tokenizer
    assert isinstance(tok, CharTokenizer) and tok.vocab_size == 65
    assert tok.decode(tokens(prepared, "val")) == shakespeare[split_at:]
    assert tok.decode(tokens(prepared, "train")[:1000]) == shakespeare[:1000]
    assert prepared.dir.parent == sources.data_dir() / "prepared"


def test_tinyshakespeare_gpt2_counts_equal_the_tokenizers(shakespeare: str) -> None:
    enc = gpt2()
    prepared = prepare_data(cfg(tokenizer="gpt2"), quiet=True)
    split_at = int(len(shakespeare) * 0.9)
    assert prepared.train_tokens == len(enc.encode(shakespeare[:split_at])) == 301966
    assert prepared.val_tokens == len(enc.encode(shakespeare[split_at:])) == 36059
    assert tokens(prepared, "val") == enc.encode(shakespeare[split_at:])
    assert prepared.meta["tokenizer"] == {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257}


def test_unchanged_source_is_reused_and_a_changed_one_prepared_again(shakespeare: str, data_dir: Path) -> None:
    first = prepare_data(cfg(), quiet=True)
    mtime = first.split_paths('train')[0].stat().st_mtime_ns
    again = prepare_data(cfg(), quiet=True)
    assert again.reused and not first.reused
    assert again.split_paths('train')[0].stat().st_mtime_ns == mtime
    (data_dir / "tinyshakespeare" / "input.txt").write_text(shakespeare[:50000], encoding="utf-8")
    changed = prepare_data(cfg(), quiet=True)
    assert not changed.reused and changed.dir == first.dir
    assert changed.train_tokens + changed.val_tokens == 50000


# --- documents through datasets (parquet / json stand in for the hub: same load_dataset call) ---------------

@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_document_corpus_bpe_with_separators(data_dir: Path, tmp_path: Path, fmt: str) -> None:
    enc = gpt2()
    path = write_docs(tmp_path, fmt)
    prepared = prepare_data(cfg(source="hub", name=fmt, data_files=str(path), tokenizer="gpt2"), quiet=True)
    val_docs = [d for i, d in enumerate(DOCS) if i % 10 == 9]
    train_docs = [d for i, d in enumerate(DOCS) if i % 10 != 9]
    assert tokens(prepared, "val") == [t for d in val_docs for t in enc.encode(d) + [enc.eot]]
    assert tokens(prepared, "train") == [t for d in train_docs for t in enc.encode(d) + [enc.eot]]
    assert prepared.meta["documents"] == {"train": 36, "val": 4}


def test_document_corpus_char_streaming_and_parallel_agree(data_dir: Path, tmp_path: Path) -> None:
    path = write_docs(tmp_path, "parquet")
    base = prepare_data(cfg(source="hub", name="parquet", data_files=str(path)), quiet=True)
    tok = base.tokenizer
    assert tok.decode(tokens(base, "val")) == "".join(d + "\n" for i, d in enumerate(DOCS) if i % 10 == 9)
    for extra in ({"streaming": True}, {"num_proc": 2}):
        again = prepare_data(cfg(source="hub", name="parquet", data_files=str(path), **extra), quiet=True, force=True)
        assert (tokens(again, "train"), tokens(again, "val")) == (tokens(base, "train"), tokens(base, "val")), extra


def test_empty_documents_are_skipped(data_dir: Path, tmp_path: Path) -> None:
    docs = [d if i % 3 else "" for i, d in enumerate(DOCS)]
    prepared = prepare_data(cfg(source="hub", name="parquet", data_files=str(write_docs(tmp_path, "parquet", docs)),
                                tokenizer="gpt2"), quiet=True)
    assert sum(prepared.meta["documents"].values()) == sum(1 for d in docs if d)


# --- interrupted prepares -----------------------------------------------------------------------------------

def _text_cfg(tmp_path: Path) -> DataConfig:
    path = tmp_path / "t.txt"
    if not path.exists():
        path.write_text("some words here.\n" * 100, encoding="utf-8")
    return cfg(source="text", path=str(path))


def test_missing_meta_means_prepare_again(data_dir: Path, tmp_path: Path) -> None:
    first = prepare_data(_text_cfg(tmp_path), quiet=True)
    (first.dir / "meta.json").unlink()
    (first.dir / ".work").mkdir()
    (first.dir / ".work" / "train_00000.bin").write_bytes(b"\0" * 7)  # debris of a killed run
    again = prepare_data(_text_cfg(tmp_path), quiet=True)
    assert not again.reused and (again.dir / "meta.json").is_file()
    assert not (again.dir / ".work").exists()
    assert again.train_tokens == first.train_tokens


def test_truncated_bin_is_not_trusted(data_dir: Path, tmp_path: Path) -> None:
    first = prepare_data(_text_cfg(tmp_path), quiet=True)
    with open(first.split_paths('train')[0], "r+b") as f:
        f.truncate(10)
    with pytest.raises(UserError, match="does not hold"):
        load_prepared(first.dir)
    again = prepare_data(_text_cfg(tmp_path), quiet=True)
    assert not again.reused and again.split_paths('train')[0].stat().st_size == first.train_tokens * 2


def test_interrupt_during_encoding_leaves_nothing_trusted(data_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first = prepare_data(_text_cfg(tmp_path), quiet=True)
    (tmp_path / "t.txt").write_text("other words now.\n" * 120, encoding="utf-8")

    def killed(*args, **kwargs):
        (args[2] / "train_00000.bin").write_bytes(b"\1\0" * 5)  # half-written output in the work folder
        raise KeyboardInterrupt

    monkeypatch.setattr("data.prepare.write_text_shards", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(_text_cfg(tmp_path), quiet=True)
    assert not (first.dir / "meta.json").exists() and not (first.dir / ".work").exists()
    monkeypatch.undo()
    again = prepare_data(_text_cfg(tmp_path), quiet=True)
    assert not again.reused and again.train_tokens + again.val_tokens == len("other words now.\n" * 120)


# --- bad input -----------------------------------------------------------------------------------------------


def test_all_empty_documents_is_an_empty_corpus(data_dir: Path, tmp_path: Path) -> None:
    path = write_docs(tmp_path, "parquet", ["", "", ""])
    with pytest.raises(UserError, match="empty"):
        prepare_data(cfg(source="hub", name="parquet", data_files=str(path)), quiet=True)
    assert not list((data_dir / "prepared").glob("*/meta.json"))


@pytest.mark.parametrize("streaming", [False, True])
def test_non_utf8_text_is_refused_with_file_and_offset(data_dir: Path, tmp_path: Path, streaming: bool) -> None:
    (tmp_path / "ok.txt").write_text("fine\n" * 3, encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    files = [str(tmp_path / "ok.txt"), str(tmp_path / "latin1.txt")]
    with pytest.raises(UserError, match=r"latin1\.txt' is not UTF-8 text \(byte 0xe9 at offset 3\)"):
        prepare_data(cfg(source="text", path=files, streaming=streaming), quiet=True)


def test_unreachable_hub_dataset_is_one_line(data_dir: Path) -> None:
    with pytest.raises(UserError, match="cannot load hub: roneneldan/TinyStories") as info:
        prepare_data(cfg(source="hub", name="roneneldan/TinyStories"), quiet=True)
    assert "\n" not in str(info.value)


def test_unknown_split_and_small_val(data_dir: Path, tmp_path: Path) -> None:
    path = write_docs(tmp_path, "parquet", DOCS[:5])
    with pytest.raises(UserError, match="Unknown split"):
        prepare_data(cfg(source="hub", name="parquet", data_files=str(path), split="validation"), quiet=True)
    with pytest.raises(UserError, match="val split is empty.*val_fraction"):
        prepare_data(cfg(source="hub", name="parquet", data_files=str(path)), quiet=True)


def test_block_size_longer_than_a_split(data_dir: Path, tmp_path: Path) -> None:
    prepared = prepare_data(_text_cfg(tmp_path), quiet=True)
    prepare_data(_text_cfg(tmp_path), block_size=prepared.val_tokens - 1, quiet=True)
    with pytest.raises(UserError, match=f"val split has {prepared.val_tokens} tokens but block_size"):
        prepare_data(_text_cfg(tmp_path), block_size=prepared.val_tokens, quiet=True)


def test_load_prepared_on_a_plain_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no meta.json"):
        load_prepared(tmp_path)
    (tmp_path / "meta.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="not valid JSON"):
        load_prepared(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 99}), encoding="utf-8")
    with pytest.raises(UserError, match="format version"):
        load_prepared(tmp_path)



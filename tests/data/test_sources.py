"""data/sources.py, where text comes from, through prepare_data: the tinyshakespeare download (and where to put
the file without a network), local text read like `cat` (a folder sorted, a list in its order), the rows of a
`datasets` source (its text column chosen, max_docs), and each bad path or column in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import UserError
from data import sources
from data.prepare import prepare_data
from tests.data.test_prepare import cfg, gpt2, tokens, write_docs, DOCS


def test_tinyshakespeare_download_through_urllib(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    served = tmp_path / "served.txt"
    served.write_text("To be, or not to be, that is the question.\n" * 20, encoding="utf-8")
    monkeypatch.setattr(sources, "TINYSHAKESPEARE_URL", served.as_uri())
    path = sources.ensure_tinyshakespeare(quiet=True)
    assert path == data_dir / "tinyshakespeare" / "input.txt"
    assert path.read_bytes() == served.read_bytes()


def test_tinyshakespeare_without_network_says_where_to_put_it(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setattr(sources, "TINYSHAKESPEARE_URL", (tmp_path / "nowhere.txt").as_uri())
    with pytest.raises(UserError, match=r"save .* as .*tinyshakespeare/input\.txt"):
        prepare_data(cfg(), quiet=True)
    assert list((data_dir / "tinyshakespeare").iterdir()) == []  # no temp file left behind


def test_text_folder_is_read_sorted_like_cat(data_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second file\nline two\n", encoding="utf-8")
    (folder / "a.txt").write_text("first file\r\nno newline at end", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text("third\n", encoding="utf-8")
    (folder / ".hidden").write_text("never read", encoding="utf-8")
    prepared = prepare_data(cfg(source="text", path=str(folder), val_fraction=0.2), quiet=True)
    text = "first file\nno newline at endsecond file\nline two\nthird\n"
    split_at = int(len(text) * 0.8)
    tok = prepared.tokenizer
    assert tok.decode(tokens(prepared, "train")) == text[:split_at]
    assert tok.decode(tokens(prepared, "val")) == text[split_at:]


def test_text_file_list_keeps_its_order(data_dir: Path, tmp_path: Path) -> None:
    enc = gpt2()
    (tmp_path / "a.txt").write_text("Alpha beta gamma.\n" * 30, encoding="utf-8")
    (tmp_path / "b.txt").write_text("Delta epsilon.\n" * 30, encoding="utf-8")
    files = [str(tmp_path / "b.txt"), str(tmp_path / "a.txt")]
    prepared = prepare_data(cfg(source="text", path=files, tokenizer="gpt2"), quiet=True)
    text = (tmp_path / "b.txt").read_text() + (tmp_path / "a.txt").read_text()
    split_at = int(len(text) * 0.9)
    assert tokens(prepared, "train") == enc.encode(text[:split_at])
    assert tokens(prepared, "val") == enc.encode(text[split_at:])


def test_max_docs_caps_and_text_column_is_chosen(data_dir: Path, tmp_path: Path) -> None:
    path = write_docs(tmp_path, "json", column="story")
    for streaming in (False, True):
        prepared = prepare_data(cfg(source="hub", name="json", data_files=str(path), text_column="story",
                                    max_docs=20, streaming=streaming), quiet=True, force=True)
        assert prepared.meta["documents"] == {"train": 18, "val": 2}
        assert prepared.tokenizer.decode(tokens(prepared, "val")) == DOCS[9] + "\n" + DOCS[19] + "\n"


def test_missing_path_and_empty_inputs(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        prepare_data(cfg(source="text", path=str(tmp_path / "nope.txt")), quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no files"):
        prepare_data(cfg(source="text", path=str(tmp_path / "empty")), quiet=True)
    (tmp_path / "zero.txt").write_bytes(b"")
    with pytest.raises(UserError, match="empty"):
        prepare_data(cfg(source="text", path=str(tmp_path / "zero.txt")), quiet=True)
    with pytest.raises(UserError, match="matches no file"):
        prepare_data(cfg(source="hub", name="parquet", data_files=str(tmp_path / "*.parquet")), quiet=True)


def test_missing_text_column_names_the_columns(data_dir: Path, tmp_path: Path) -> None:
    path = write_docs(tmp_path, "parquet", column="story")
    for streaming in (False, True):
        with pytest.raises(UserError, match=r"no column 'text' \(columns: story, id\)"):
            prepare_data(cfg(source="hub", name="parquet", data_files=str(path), streaming=streaming), quiet=True)
    with pytest.raises(UserError, match="not text"):
        prepare_data(cfg(source="hub", name="parquet", data_files=str(path), text_column="id"), quiet=True)

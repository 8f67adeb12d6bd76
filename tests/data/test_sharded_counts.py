"""The bookkeeping of a document corpus's preparation (data/sharded.py), in process: how many documents
it holds before reading it (for the progress bar's ETA: the rows of a Dataset, the splits' counts a hub
dataset declares, the row counts in parquet footers, else unknown; capped by data.max_docs), a quiet
preparation that prints nothing, and the peak memory it reports."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.config_io import from_dict
from data import sharded
from data.config import DataConfig
from data.prepare import prepare_data
from data.sources import load_rows, resolve_corpus
from data.tokenizer import TiktokenTokenizer

DOCS = [f"document {i}: " + "the fox jumps. " * (1 + i % 4) for i in range(37)]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, list[Path]]:
    import datasets
    folder = tmp_path_factory.mktemp("docs")
    out = {"parquet": [folder / "a.parquet", folder / "b.parquet"], "json": [folder / "a.jsonl"]}
    datasets.Dataset.from_dict({"text": DOCS[:20]}).to_parquet(str(out["parquet"][0]))
    datasets.Dataset.from_dict({"text": DOCS[20:]}).to_parquet(str(out["parquet"][1]))
    datasets.Dataset.from_dict({"text": DOCS}).to_json(str(out["json"][0]))
    return out


def corpus_and_rows(paths: list[Path], tmp_path: Path, **raw):
    cfg = from_dict(DataConfig, {"source": "hub", "name": paths[0].suffix.lstrip(".").replace("jsonl", "json"),
                                 "data_files": [str(p) for p in paths], "tokenizer": "gpt2", **raw}, "data.")
    corpus = resolve_corpus(cfg, quiet=True)
    return corpus, load_rows(corpus, tmp_path / "cache")


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("max_docs, expected", [(None, 37), (10, 10), (1000, 37)])
def test_the_documents_of_parquet_files_are_known_before_reading_them(files, tmp_path, streaming, max_docs, expected):
    corpus, rows = corpus_and_rows(files["parquet"], tmp_path, streaming=streaming, max_docs=max_docs)
    assert sharded.known_documents(rows, corpus) == expected


def test_a_streamed_corpus_without_a_count_is_unknown_and_a_declared_count_is_used(files, tmp_path):
    import datasets
    corpus, rows = corpus_and_rows(files["json"], tmp_path, streaming=True, max_docs=5)
    assert isinstance(rows, datasets.IterableDataset)
    assert sharded.known_documents(rows, corpus) is None  # json lines: counted only by reading them
    rows.info.splits = datasets.SplitDict({"train": datasets.SplitInfo(name="train", num_examples=123)})
    assert sharded.known_documents(rows, corpus) == 5  # what a hub dataset declares, capped by max_docs
    corpus.max_docs = None
    assert sharded.known_documents(rows, corpus) == 123
    rows.info.splits = datasets.SplitDict({"train": datasets.SplitInfo(name="train", num_examples=0)})
    assert sharded.known_documents(rows, corpus) is None  # a declared 0 is "not counted", not an empty corpus


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_a_quiet_preparation_prints_nothing(files, tmp_path, monkeypatch, capfd, tokenizer):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    cfg = {"source": "hub", "name": "parquet", "data_files": [str(p) for p in files["parquet"]], "tokenizer": tokenizer}
    prepared = prepare_data(from_dict(DataConfig, cfg, "data."), quiet=True)
    assert prepared.train_tokens > 0
    assert capfd.readouterr() == ("", "")
    prepare_data(from_dict(DataConfig, {**cfg, "val_fraction": 0.2}, "data."))  # not quiet: it says what it does
    assert "scan documents" in capfd.readouterr().err or tokenizer != "char"


def test_the_peak_memory_is_in_mib_also_where_proc_is_not_readable(monkeypatch):
    """/proc/self/status's VmHWM (kB) where there is one, else getrusage's ru_maxrss (kB on Linux): both MiB."""
    import resource
    hwm_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmHWM:"))
    assert sharded.peak_rss_mb() == pytest.approx(hwm_kib / 1024, rel=0.05)

    class NoProc(type(Path())):
        def read_text(self, *args, **kwargs):
            raise OSError("no /proc here")

    monkeypatch.setattr(sharded, "Path", NoProc)
    rusage_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert sharded.peak_rss_mb() == pytest.approx(rusage_mib, rel=0.05)
    assert sharded.peak_rss_mb() == pytest.approx(hwm_kib / 1024, rel=0.5)  # the same quantity, roughly


@pytest.mark.parametrize("n_docs, val_fraction, val_docs", [(10, 0.1, 1), (20, 0.1, 2), (5, 0.1, 0)])
def test_a_val_split_of_one_document_is_a_val_split_and_one_of_none_is_refused(tmp_path, monkeypatch, n_docs,
                                                                                val_fraction, val_docs):
    import datasets
    from common.errors import UserError
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "docs.parquet"
    datasets.Dataset.from_dict({"text": DOCS[:n_docs]}).to_parquet(str(path))
    cfg = from_dict(DataConfig, {"source": "hub", "name": "parquet", "data_files": [str(path)], "tokenizer": "gpt2",
                                 "val_fraction": val_fraction}, "data.")
    if val_docs == 0:
        with pytest.raises(UserError, match=f"val split is empty: val_fraction 0.1 of {n_docs} document"):
            prepare_data(cfg, quiet=True)
        return
    prepared = prepare_data(cfg, quiet=True)
    assert prepared.meta["documents"] == {"train": n_docs - val_docs, "val": val_docs}
    assert prepared.val_tokens == sum(len(TiktokenTokenizer("gpt2").encode(DOCS[i])) + 1
                                      for i in range(n_docs) if i % 10 == 9)

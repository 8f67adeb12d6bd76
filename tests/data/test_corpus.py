"""data/corpus.py: a resolved corpus. LOCAL_BUILDERS are the `datasets` builders that read local files: each is
one `datasets` ships, and a hub source naming one resolves to a Corpus whose file_stats are its files' name,
size and sha256 (what the prepare fingerprint compares), computed here with hashlib; a hub dataset is remote,
with no local files to fingerprint."""
from __future__ import annotations

import hashlib

import pytest

from common.config_io import from_dict
from data.config import DataConfig
from data.corpus import LOCAL_BUILDERS, Corpus
from data.sources import resolve_corpus


def test_the_local_builders_are_builders_datasets_ships():
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    assert set(LOCAL_BUILDERS) <= set(_PACKAGED_DATASETS_MODULES)


@pytest.mark.parametrize("builder", LOCAL_BUILDERS)
def test_a_local_builders_files_are_fingerprinted_by_name_size_and_content(tmp_path, builder):
    content = f"bytes standing in for a {builder} file\n".encode() * 3
    path = tmp_path / f"docs.{builder}"
    path.write_bytes(content)
    corpus = resolve_corpus(from_dict(DataConfig, {"source": "hub", "name": builder, "data_files": str(path)}, "data."))
    assert isinstance(corpus, Corpus) and corpus.kind == "documents" and not corpus.remote
    assert corpus.local_files == [path.resolve()]
    assert corpus.file_stats == [[path.name, len(content), hashlib.sha256(content).hexdigest()]]


def test_a_hub_dataset_is_remote_with_no_local_files():
    corpus = resolve_corpus(from_dict(DataConfig, {"source": "hub", "name": "roneneldan/TinyStories"}, "data."))
    assert corpus.remote and corpus.local_files == [] and corpus.file_stats == []
    assert corpus.identity["name"] == "roneneldan/TinyStories"

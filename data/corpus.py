"""A resolved corpus: what to load, how to describe it and what identifies its content.

data/sources.py resolves one from the data settings and loads its rows; data/source_errors.py explains why
it failed to load or read. Both import it from here, so neither imports the other back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# `datasets` builders that read local files given in data_files (their names, sizes and content hashes go
# in the fingerprint: data/sources.py's _stats)
LOCAL_BUILDERS = ("parquet", "json", "csv", "text", "arrow")


@dataclass
class Corpus:
    kind: Literal["text", "documents"]
    label: str  # short name for the prepared folder, e.g. "tinyshakespeare"
    description: str  # one line for meta.json and messages
    identity: dict[str, Any]  # JSON: which corpus this is (goes into the folder name and the fingerprint)
    file_stats: list[list[Any]] = field(default_factory=list)  # [name, size, content sha256] of local files
    load_kwargs: dict[str, Any] = field(default_factory=dict)  # for datasets.load_dataset
    local_files: list[Path] = field(default_factory=list)  # for UTF-8 diagnosis
    remote: bool = False  # a hub dataset: its download cache is kept in the data folder
    text_column: str = "text"
    streaming: bool = False
    max_docs: int | None = None
    repeated: dict[str, int] | None = None  # source repeated: repeated_lines' arguments (the rows are generated)

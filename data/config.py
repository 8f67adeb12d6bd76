"""DataConfig: the `data:` section of a run's YAML — where the text comes from and how it becomes tokens.

Why a dataclass: `common.config_io` type-checks every YAML value against these annotations, and
`__post_init__` checks the rules between fields (raising ValueError, which config_io reports as a one-line
UserError), so a bad config fails before any download or tokenization starts.

Four kinds of source:
    source: tinyshakespeare                    # the default; fetched once into the data folder
    source: text                               # local text: one file, a folder, or a list of files
    path: notes/                               #   (a folder means every non-hidden file under it, sorted)
    source: hub                                # any `datasets` dataset, e.g. TinyStories:
    name: roneneldan/TinyStories               #   name, config_name, split, text_column, streaming
    source: hub                                # ...or local parquet/json/csv through the same call:
    name: parquet                              #   name is the builder, data_files the files
    data_files: [shards/a.parquet, shards/b.parquet]
    source: repeated                           # seeded random sequences, each followed by its copy (the
    alphabet_size: 64                          #   data an induction head forms on, data/repeated.py):
    sequence_length: [8, 24]                   #   alphabet_size, sequence_length, num_sequences, seed
    num_sequences: 20000
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from common.config_io import PATH
from data.repeated import MAX_ALPHABET_SIZE, MAX_REPEATED_CHARS
from data.tokenizer import check_tokenizer_name

SOURCES = ("tinyshakespeare", "text", "hub", "repeated")
# the fields each source reads (the others must stay unset), and the repeated source's defaults
SOURCE_FIELDS = {"tinyshakespeare": (), "text": ("path",), "hub": ("name", "config_name", "data_files", "max_docs"),
                 "repeated": ("alphabet_size", "sequence_length", "num_sequences", "seed")}
REPEATED_DEFAULTS = {"alphabet_size": 64, "sequence_length": [8, 24], "num_sequences": 20_000, "seed": 0}


@dataclass
class DataConfig:
    # tinyshakespeare | text (local text files in `path`) | hub (a `datasets` dataset named `name`) | repeated
    # (seeded random sequences, each followed by its copy: data/repeated.py)
    source: Literal["tinyshakespeare", "text", "hub", "repeated"] = "tinyshakespeare"
    # source text: a text file, a folder of text files, or a list of files (read as one text, like `cat`)
    path: str | list[str] | None = field(default=None, metadata=PATH)
    # source hub: dataset name on the hub (e.g. roneneldan/TinyStories) or a builder: parquet, json, csv, text
    name: str | None = field(default=None, metadata=PATH)  # a local dataset folder may start with ~
    # source hub: the dataset's configuration (subset) name, if it has several
    config_name: str | None = None
    # source hub: files for a builder name (local paths or URLs), or a subset of a hub dataset's files
    data_files: str | list[str] | None = field(default=None, metadata=PATH)
    # source hub: which split of the dataset to read (our own train/val split is made from it)
    split: str = "train"
    # source hub: the column that holds each document's text
    text_column: str = "text"
    # source hub/text: iterate without downloading/converting everything first (corpora larger than disk/RAM)
    streaming: bool = False
    # "char" (vocabulary built from the corpus) or a tiktoken encoding name: gpt2, r50k_base, cl100k_base, ...
    tokenizer: str = "char"
    # share of the corpus held out for validation: the last share of the text, or every k-th document
    val_fraction: float = 0.1
    # processes that encode: document corpora, one part (a streamed corpus's file, or 100K documents) at a
    # time each (data/sharded.py); a continuous text, its pieces through datasets.map. The tokens are
    # identical for any value
    num_proc: int = 1
    # source hub: read at most this many documents (a cap for huge or streamed corpora); null = all
    max_docs: int | None = None
    # source repeated: how many distinct characters the sequences are drawn from (1..20000; null -> 64)
    alphabet_size: int | None = None
    # source repeated: each sequence's length before its copy, [min, max] drawn uniformly, or one number for
    # all (null -> [8, 24]). Lengths that vary keep a model from copying by position instead of by content
    sequence_length: int | list[int] | None = None
    # source repeated: how many sequences (each with its copy and a line break) the corpus holds (null -> 20000)
    num_sequences: int | None = None
    # source repeated: the generator's seed; the same settings and seed give the same text (null -> 0)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        self._check_source_fields()
        for field_name in ("split", "text_column", "tokenizer"):
            if not isinstance(getattr(self, field_name), str) or not getattr(self, field_name).strip():
                raise ValueError(f"{field_name} must be a non-empty string")
        check_tokenizer_name(self.tokenizer)
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        if self.num_proc < 1:
            raise ValueError(f"num_proc must be at least 1, got {self.num_proc}")
        if self.max_docs is not None and self.max_docs < 1:
            raise ValueError(f"max_docs must be at least 1 (or null for all documents), got {self.max_docs}")
        if self.source == "repeated":
            self._check_repeated()

    def _check_repeated(self) -> None:
        """Fill the repeated source's unset settings with their defaults, then check their ranges and the
        size of the text they make (built in memory) before anything is generated."""
        for name, default in REPEATED_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)
        if not 1 <= self.alphabet_size <= MAX_ALPHABET_SIZE:
            raise ValueError(f"alphabet_size must be from 1 to {MAX_ALPHABET_SIZE}, got {self.alphabet_size}")
        low, high = self.length_range()
        if not 1 <= low <= high:
            raise ValueError(f"sequence_length must be a length >= 1 or [min, max] with 1 <= min <= max, got "
                             f"{self.sequence_length}")
        if self.num_sequences < 1:
            raise ValueError(f"num_sequences must be at least 1, got {self.num_sequences}")
        if self.num_sequences * (2 * high + 1) > MAX_REPEATED_CHARS:
            raise ValueError(f"num_sequences {self.num_sequences} of up to {high} characters (twice, and a line "
                             f"break) make more than {MAX_REPEATED_CHARS:,} characters: lower num_sequences or "
                             f"sequence_length")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer from 0 to 2**63-1, got {self.seed}")

    def length_range(self) -> tuple[int, int]:
        """`sequence_length` as (min, max); a list must hold exactly two lengths."""
        value = self.sequence_length
        if isinstance(value, int):
            return value, value
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError(f"sequence_length must be one length or a list [min, max] of two, got {value}")
        return value[0], value[1]

    def _check_source_fields(self) -> None:
        """Each source uses its own fields; a field set for another source is a mistake worth naming."""
        for owner, fields in SOURCE_FIELDS.items():
            for field_name in fields:
                if getattr(self, field_name) is not None and owner != self.source:
                    raise ValueError(f"{field_name} is only used with source '{owner}', not '{self.source}'")
        if self.source == "text" and not self.text_paths():
            raise ValueError("source 'text' needs path: a text file, a folder, or a list of files")
        if self.source == "hub" and not (self.name or "").strip():
            raise ValueError("source 'hub' needs name: a hub dataset (e.g. roneneldan/TinyStories) or a builder "
                             "(parquet, json, csv, text) with data_files")
        for field_name in ("path", "data_files"):
            value = getattr(self, field_name)
            items = value if isinstance(value, list) else [value] if value is not None else []
            if any(not isinstance(v, str) or not v.strip() for v in items) or value == []:
                raise ValueError(f"{field_name} must be a non-empty path or a list of non-empty paths")

    def text_paths(self) -> list[str]:
        """`path` as a list (empty when unset)."""
        return [] if self.path is None else [self.path] if isinstance(self.path, str) else list(self.path)

    def data_file_list(self) -> list[str] | None:
        """`data_files` as a list, or None when unset."""
        files = self.data_files
        return None if files is None else [files] if isinstance(files, str) else list(files)

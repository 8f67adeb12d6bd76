"""A prepared data folder, opened for reading: `load_prepared(folder)` checks it and describes it.

Readers never write: opening a folder renames, deletes and creates nothing, so a complete folder on a
read-only mount (or one that another process is reading) opens as it is. The one writer is `data.prepare`,
which holds the folder's lock while it (re)makes it. A training run, which reads the shards again for every
batch, holds `reading(folder)` while it trains: a shared lock on meta.json, opened read-only (nothing is
created or changed), that `data.prepare` checks before it remakes a folder (data/prepare.py: `_no_readers`),
so that no run's files are deleted under it.

What is checked before anything is trusted: meta.json is valid and complete, every shard it lists exists
with exactly the recorded number of tokens, and no shard holds an id outside the tokenizer's vocabulary
(data/shards.py: `check_ids`). Anything wrong is one UserError line saying how to prepare it again.

Layouts read:
    format 2   shards: {"train": [{"file": "train_00000.bin", "tokens": N, "max_id": M}, ...], "val": [...]}
    format 1   train.bin and val.bin (one shard each): folders prepared before shards, still read as they are
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from common.errors import UserError
from common.json_file import FileContentError, parse_json
from common.schema import is_int
from data.shards import Shard, SplitFiles, TokenStream, check_ids
from data.tokenizer import Tokenizer, tokenizer_from_json

META_FILE = "meta.json"
SPLITS = ("train", "val")
LAYOUT_VERSION = 2  # meta.json's format_version for sharded folders; 1 = one train.bin / val.bin
REDO = "run `python -m data.prepare CONFIG` to prepare it again"


@dataclass
class PreparedData:
    """A complete prepared folder: its shards, how to read them, and how to decode them."""

    dir: Path
    meta: dict[str, Any]
    tokenizer: Tokenizer
    dtype: np.dtype
    shards: dict[str, list[Shard]] = field(default_factory=dict)
    reused: bool = False  # True when an earlier prepare was found complete and up to date

    def split_shards(self, split: str) -> list[Shard]:
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return self.shards[split]

    def split_paths(self, split: str) -> list[Path]:
        """The split's token files, in stream order."""
        return [s.path for s in self.split_shards(split)]

    def split_files(self, split: str) -> SplitFiles:
        """The split's token files with their dtype, name and the tokenizer's vocabulary size (BatchLoader's input)."""
        return SplitFiles(self.split_paths(split), self.dtype, split, self.tokenizer.vocab_size)

    def split_tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.split_shards(split))

    def stream(self, split: str) -> TokenStream:
        """The split's shards as one flat stream (e.g. `stream("val").read(0, 256)`)."""
        return TokenStream(self.split_shards(split), self.dtype)

    @property
    def train_tokens(self) -> int:
        return self.split_tokens("train")

    @property
    def val_tokens(self) -> int:
        return self.split_tokens("val")

    def check_block_size(self, block_size: int) -> None:
        """Every split must hold at least one window of block_size + 1 tokens."""
        for split in SPLITS:
            n = self.split_tokens(split)
            if n < block_size + 1:
                share = "raise data.val_fraction" if split == "val" else "lower data.val_fraction"
                raise UserError(f"the {split} split has {n} tokens but block_size {block_size} needs at least "
                                f"{block_size + 1}: lower model.block_size, {share}, or use more data")


def read_meta(directory: Path) -> dict[str, Any]:
    """meta.json of `directory` as a dict, or a UserError saying why it cannot be used."""
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise UserError(f"'{directory}' is not a complete prepared data folder (no {META_FILE}): {REDO}")
    try:  # the rules of untrusted JSON (common/json_file.py): its vocabulary is printed and saved later
        meta = parse_json(meta_path.read_bytes(), META_FILE, meta_path)
    except FileContentError as e:
        raise UserError(f"'{meta_path}' {e.problem}: {REDO}") from None
    if not isinstance(meta, dict) or meta.get("format_version") not in (1, LAYOUT_VERSION):
        raise UserError(f"'{meta_path}' is from another format version (want {LAYOUT_VERSION}): {REDO}")
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise UserError(f"'{meta_path}' names dtype {meta.get('dtype')!r}, not uint16 or uint32: {REDO}")
    return meta


def _listed_shards(directory: Path, meta: dict[str, Any]) -> dict[str, list[Shard]]:
    """The shards meta.json lists (format 2), or train.bin / val.bin (format 1); not yet checked."""
    if meta["format_version"] == 1:
        return {split: [Shard(directory / f"{split}.bin", meta.get(f"{split}_tokens"))] for split in SPLITS}
    listed = meta.get("shards")
    out: dict[str, list[Shard]] = {}
    for split in SPLITS:
        entries = listed.get(split) if isinstance(listed, dict) else None
        if not isinstance(entries, list) or not entries:
            raise UserError(f"'{directory / META_FILE}' lists no {split} shards: {REDO}")
        out[split] = []
        for entry in entries:
            name = entry.get("file") if isinstance(entry, dict) else None
            if not isinstance(name, str) or Path(name).name != name or not name.endswith(".bin"):
                raise UserError(f"'{directory / META_FILE}' lists a {split} shard {str(entry)[:60]!r} that is not "
                                f"a .bin file of the folder: {REDO}")
            max_id = entry.get("max_id")
            out[split].append(Shard(directory / name, entry.get("tokens"), max_id if is_int(max_id) else None))
    return out


def load_prepared(directory: str | Path) -> PreparedData:
    """Open a prepared folder for reading (module doc: it writes nothing), checking that it is complete and
    that its ids fit its tokenizer."""
    directory = Path(directory)
    meta = read_meta(directory)
    dtype = np.dtype(meta["dtype"])
    shards = _listed_shards(directory, meta)
    for split in SPLITS:
        for shard in shards[split]:
            tokens = shard.tokens
            if (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1 or not shard.path.is_file()
                    or shard.path.stat().st_size != tokens * dtype.itemsize):
                raise UserError(f"'{shard.path}' is missing or does not hold the {tokens} tokens meta.json "
                                f"records: {REDO}")
    tokenizer = tokenizer_from_json(meta.get("tokenizer"), base_dir=directory)  # a tokenizer.json sits beside
    check_ids(shards, dtype, tokenizer.vocab_size, f"'{directory / META_FILE}'")
    return PreparedData(dir=directory, meta=meta, tokenizer=tokenizer, dtype=dtype, shards=shards)


@contextmanager
def reading(folder: Path) -> Iterator[None]:
    """The block reads the prepared `folder` (module doc): a shared flock on its meta.json, dropped at the end
    or when the process dies. Refused, in one line, when the folder was remade between its loading and now."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    meta = Path(folder) / META_FILE
    try:
        fd = os.open(meta, os.O_RDONLY)
    except OSError as e:
        raise UserError(f"prepared data '{folder}' changed while the run started ({e.strerror or e}): run the "
                        f"command again") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_ino != os.stat(meta).st_ino:  # a prepare replaced meta.json before the lock
            raise UserError(f"prepared data '{folder}' was prepared again while the run started: run the "
                            f"command again")
        yield
    finally:
        os.close(fd)

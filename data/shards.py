"""Token shards: one split of a prepared corpus as an ordered list of flat token files, read as one stream.

Why shards: a corpus of billions of tokens is encoded by several processes, part by part, and a killed
prepare resumes at the first part not yet finished; so each part's tokens land in files of their own
(`train_00000.bin`, `train_00001.bin`, ..., `val_00000.bin`, ...), listed in order in meta.json.

Readers see a split as the concatenation of its shards: position p of the split is position
p - start[k] of the shard k holding it. A training window of block_size + 1 tokens may therefore straddle
two shards, and is read exactly as if the split were one file. That is a choice: the batches a seed gives
do not depend on how the split was cut into shards (one shard or fifty, the same windows), and windows
across a shard boundary are no different from windows across any other document boundary (shards end
at document boundaries, and documents end with a separator).

Ids are checked against the vocabulary before they can reach an embedding (`check_ids`): a shard is
read whole when the folder is small, sampled when it is large, and the batch loader checks every batch
it draws (data/loader.py), so a damaged or edited folder is caught either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from common.errors import UserError

FULL_CHECK_TOKENS = 1 << 27  # folders up to this many tokens (256 MB of uint16) are checked whole when opened
SAMPLE_BLOCKS, SAMPLE_TOKENS = 4, 1 << 18  # larger ones: this many evenly spaced blocks of each shard
READ_CHUNK = 1 << 24  # tokens read at a time by a whole-shard check (bounded memory)
REPREPARE = "prepare it again with `python -m data.prepare CONFIG --force`"


@dataclass(frozen=True)
class SplitFiles:
    """One split's token files as a reader is given them: the files in stream order (or one file), the
    dtype of their ids, the split's name (None: from the first file's name, train_00000.bin -> "train"),
    and the vocabulary size every id must stay under (None: unchecked). They describe the same files and
    go everywhere together, so they are one record: PreparedData.split_files(split) gives all four, and a
    lone token file is SplitFiles(path, np.uint16)."""

    source: str | Path | Sequence[str | Path]
    dtype: np.dtype | str | type
    split: str | None = None
    vocab_size: int | None = None


@dataclass(frozen=True)
class Shard:
    """One token file: its path, its token count, and its largest id as the preparer recorded it."""

    path: Path
    tokens: int
    max_id: int | None = None  # None: not recorded (a folder from before shards existed)


def shard_name(split: str, index: int) -> str:
    """train_00000.bin, val_00003.bin, ..."""
    return f"{split}_{index:05d}.bin"


class TokenStream:
    """The shards of one split read as one flat stream of `n_tokens` ids. Every read maps the files it
    needs afresh (np.memmap) and drops them after: a long-lived map keeps every page it ever touched
    mapped, which shows up as ever-growing memory on big corpora."""

    def __init__(self, shards: list[Shard], dtype: np.dtype | str | type):
        self.shards = list(shards)
        self.dtype = np.dtype(dtype)
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards], dtype=np.int64)  # (n_shards + 1,)
        self.n_tokens = int(self.starts[-1])

    def _map(self, k: int) -> np.ndarray:
        return np.memmap(self.shards[k].path, dtype=self.dtype, mode="r", shape=(self.shards[k].tokens,))

    def read(self, start: int, stop: int) -> np.ndarray:
        """Ids [start, stop) of the split, as a fresh array of the stored dtype."""
        start, stop = max(0, int(start)), min(self.n_tokens, int(stop))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        for k in range(first, len(self.shards)):  # shard `first` holds `start`: every one from it ends after start
            lo, hi = int(self.starts[k]), int(self.starts[k + 1])
            if lo >= stop:
                break
            pieces.append(np.array(self._map(k)[max(start, lo) - lo:min(stop, hi) - lo]))
        return np.concatenate(pieces)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(B, length) ids: the windows beginning at `starts` (B,), each possibly spanning shards."""
        positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)  # (B, L)
        if len(self.shards) == 1:
            return np.asarray(self._map(0)[positions])
        which = np.searchsorted(self.starts, positions, side="right") - 1  # (B, L) shard of each position
        out = np.empty(positions.shape, dtype=self.dtype)
        for k in np.unique(which):
            here = which == k
            out[here] = self._map(int(k))[positions[here] - self.starts[k]]
        return out


def _blocks(shard: Shard, full: bool) -> Iterator[tuple[int, int]]:
    """[start, stop) token ranges of `shard` to check: all of it, or SAMPLE_BLOCKS evenly spaced blocks."""
    n = shard.tokens
    if full or n <= SAMPLE_BLOCKS * SAMPLE_TOKENS:
        yield from ((lo, min(n, lo + READ_CHUNK)) for lo in range(0, n, READ_CHUNK))
        return
    for i in range(SAMPLE_BLOCKS):  # the first and the last block included
        lo = (n - SAMPLE_TOKENS) * i // (SAMPLE_BLOCKS - 1)
        yield lo, lo + SAMPLE_TOKENS


def shard_max(shard: Shard, dtype: np.dtype, full: bool = True) -> int:
    """The largest id in `shard` (or in its sampled blocks), read with bounded memory."""
    best = -1
    with open(shard.path, "rb") as f:
        for lo, hi in _blocks(shard, full):
            f.seek(lo * dtype.itemsize)
            chunk = np.fromfile(f, dtype=dtype, count=hi - lo)
            if chunk.size:
                best = max(best, int(chunk.max()))
    return best


def check_ids(shards: dict[str, list[Shard]], dtype: np.dtype, vocab_size: int, where: str) -> None:
    """Refuse a folder whose shards hold an id >= vocab_size (UserError naming the shard and the id). The max
    the preparer recorded is compared first (it catches a meta.json whose tokenizer was cut short); then the
    data itself is read (meta.json can be edited: it is not trusted alone), whole up to FULL_CHECK_TOKENS."""
    everything = [s for split in shards.values() for s in split]
    full = sum(s.tokens for s in everything) <= FULL_CHECK_TOKENS
    for shard in everything:
        if shard.max_id is not None and shard.max_id >= vocab_size:
            raise UserError(f"'{shard.path}' holds token ids up to {shard.max_id}, but the tokenizer in {where} has "
                            f"only {vocab_size} ids: the folder is damaged or {where} was edited; {REPREPARE}")
    for shard in everything:
        found = shard_max(shard, dtype, full)
        if found >= vocab_size:
            raise UserError(f"'{shard.path}' holds token id {found}, but the tokenizer in {where} has only "
                            f"{vocab_size} ids: the folder is damaged; {REPREPARE}")

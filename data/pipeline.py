"""Rows to shards: encoding a continuous text, and the helpers every encoding pass shares.

Why passes: a character vocabulary must be known before anything is encoded, and nanoGPT's character split
needs the corpus length, so a continuous text is scanned once (counting characters, collecting the
character set, and noting where the safe cuts are) before it is encoded.

A continuous text (tinyshakespeare, local text files) is encoded by `Dataset.map(num_proc=N)` over its
pieces into an Arrow file in the work folder (output order and content do not depend on N), then copied in
order onto the split's shards (`ShardWriter`); a streamed text, a piece at a time in this process. No more
than one batch (or one ~256K-character piece) of text is ever held in memory. An interrupted text prepare
starts over: corpora that take long to encode are document corpora (jsonl, parquet, the hub), which
data/sharded.py encodes part by part, in parallel and resumably.

Documents are each followed by a separator so the model sees where one ends: `<|endoftext|>` with BPE,
a line break with the char tokenizer (which has no special tokens).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from common.errors import UserError
from common.writes import writing
from data.corpus import Corpus
from data.source_errors import corpus_errors
from data.shards import shard_name
from data.splitting import group_rows, split_piece, text_split_point
from data.tokenizer import CharTokenizer, HFTokenizer, TiktokenTokenizer, tokenizer_from_json

AnyTokenizer = CharTokenizer | TiktokenTokenizer | HFTokenizer
CHAR_DOC_SEPARATOR = "\n"
DOC_BATCH = 1000  # documents encoded at a time
SHARD_TOKENS = 100_000_000  # a continuous text's shards hold at most this many tokens
TEXT_BATCH = 10_000  # rows (lines) per read during a scan


def bin_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (GPT-2's 50257 does), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass
class BinCounts:
    """What was written: tokens per split, and documents per split (document corpora only)."""

    tokens: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})
    documents: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})
    characters: int = 0


@dataclass(frozen=True)
class EncodeSettings:
    """How a prepare encodes its corpus, a continuous text (write_text_shards) or documents
    (data.sharded.encode_documents_sharded) alike, read from one DataConfig: the tokenizer the config names,
    or `fixed` in its place (a pretrained model's; a char vocabulary is kept as it is, not rebuilt)."""
    tokenizer_name: str
    val_fraction: float
    num_proc: int = 1
    quiet: bool = False
    fixed: AnyTokenizer | None = None

    def given_tokenizer(self) -> AnyTokenizer | None:
        """The tokenizer to encode with, or None where it is built from the corpus's own characters."""
        if self.fixed is not None:
            return self.fixed
        return TiktokenTokenizer(self.tokenizer_name) if self.tokenizer_name != "char" else None


class ShardWriter:
    """Appends ids to one split's shards in `folder` (train_00000.bin, ...), starting a new shard once one
    holds `shard_tokens`; `close` fsyncs and returns meta.json's entries {file, tokens, max_id}."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int | None = None) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.entries: list[dict[str, Any]] = []
        self.file: Any = None
        self.tokens = 0  # in all shards

    def write(self, ids: Any) -> None:
        arr = np.asarray(ids).astype(self.dtype, copy=False)  # (n,)
        while arr.size:
            if self.file is None:
                name = shard_name(self.split, len(self.entries))
                self._writing = writing(self.folder / name)  # common/writes.py: renamed in whole at _finish
                self.file = self._writing.__enter__()
                self.entries.append({"file": name, "tokens": 0, "max_id": -1})
            entry = self.entries[-1]
            room = arr.size if self.shard_tokens is None else self.shard_tokens - entry["tokens"]
            head, arr = arr[:room], arr[room:]
            head.tofile(self.file)
            entry["tokens"] += int(head.size)
            entry["max_id"] = max(entry["max_id"], int(head.max()))
            self.tokens += int(head.size)
            if self.shard_tokens is not None and entry["tokens"] >= self.shard_tokens:
                self._finish()

    def _finish(self) -> None:
        if self.file is not None:
            self._writing.__exit__(None, None, None)
        self.file = None

    def close(self) -> list[dict[str, Any]]:
        self._finish()
        return self.entries


# --- encoding functions (run inside datasets.map workers, so they rebuild the tokenizer from JSON) ---------

_TOKENIZERS: dict[str, AnyTokenizer] = {}


def _tokenizer(spec: dict[str, Any]) -> AnyTokenizer:
    key = json.dumps(spec, sort_keys=True)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = tokenizer_from_json(spec)
    return _TOKENIZERS[key]


def encode_text(tok: AnyTokenizer, text: str) -> Any:
    """Ids of one piece of continuous text (a numpy array for char, a list for BPE)."""
    return tok.encode_array(text) if isinstance(tok, CharTokenizer) else tok.encode(text)


def encode_documents(tok: AnyTokenizer, texts: list[str | None]) -> list[Any]:
    """Ids of each document followed by the separator; an empty document gives no ids at all."""
    texts = [t or "" for t in texts]
    if isinstance(tok, CharTokenizer):
        return [tok.encode_array(t + CHAR_DOC_SEPARATOR) if t else [] for t in texts]
    # one tiktoken call per document: its batch call, even with one thread, hands every document to a
    # thread pool and back, which costs ~3x the encoding itself on documents of a few KB
    eot = tok.eot
    out: list[Any] = []
    for text in texts:
        ids = tok.encode(text) if text else []
        if ids:
            ids.append(eot)
        out.append(ids)
    return out


def _ids(ids: Any) -> np.ndarray:
    """(n,) uint32: one array type for every map output row (Arrow wants the same type across a batch)."""
    return np.asarray(ids, dtype=np.uint32)


def _encode_text_ranges(batch: dict[str, list], lines: Any, tokenizer: dict, split_at: int) -> dict[str, list]:
    tok = _tokenizer(tokenizer)
    train, val = [], []
    for start, stop, start_char in zip(batch["start_row"], batch["stop_row"], batch["start_char"]):
        text = "".join(lines[start:stop]["text"])
        train_text, val_text = split_piece(text, start_char, split_at)
        train.append(_ids(encode_text(tok, train_text)))
        val.append(_ids(encode_text(tok, val_text)))
    return {"train": train, "val": val}


# --- the passes ------------------------------------------------------------------------------------------

def _is_streaming(rows: Any) -> bool:
    import datasets

    return isinstance(rows, datasets.IterableDataset)


def iter_text_batches(rows: Any, batch_size: int = TEXT_BATCH) -> Iterator[list[str]]:
    """The "text" column a batch at a time (None read as "")."""
    if _is_streaming(rows):
        for batch in rows.iter(batch_size=batch_size):
            yield [t or "" for t in batch["text"]]
    else:
        for table in rows.with_format("arrow").iter(batch_size=batch_size):
            yield [t or "" for t in table.column("text").to_pylist()]


def _iter_rows(rows: Any) -> Iterator[str]:
    for batch in iter_text_batches(rows):
        yield from batch


@contextmanager
def datasets_progress(enabled: bool) -> Iterator[None]:
    """Turn `datasets`' own progress bars off for a quiet run, and back to how they were after."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    if not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            datasets.enable_progress_bars()


def write_text_shards(corpus: Corpus, rows: Any, work_dir: Path, settings: EncodeSettings
                      ) -> tuple[AnyTokenizer, BinCounts, dict[str, list[dict[str, Any]]]]:
    """Encode a continuous text (`rows`: a Dataset or IterableDataset of lines in a "text" column) into
    token shards in work_dir. Returns the tokenizer, the counts, and meta.json's shard entries per split.
    A fixed char vocabulary (settings.fixed) refuses text outside it."""
    with corpus_errors(corpus, work_dir, reading=True):
        return _write_text(corpus, rows, work_dir, settings)


def _write_text(corpus: Corpus, rows: Any, work_dir: Path, settings: EncodeSettings
                ) -> tuple[AnyTokenizer, BinCounts, dict[str, list[dict[str, Any]]]]:
    val_fraction, num_proc, quiet = settings.val_fraction, settings.num_proc, settings.quiet
    given = settings.given_tokenizer()
    streaming = _is_streaming(rows)
    # pass 1: length, character set and piece boundaries
    chars: set[str] = set()
    total = 0
    ranges: dict[str, list[int]] = {"start_row": [], "stop_row": [], "start_char": []}
    with tqdm(desc="scan text", unit="char", unit_scale=True, disable=quiet) as bar:
        for piece in group_rows(_iter_rows(rows)):
            if given is None:
                chars.update(piece.text)
            if not streaming:
                ranges["start_row"].append(piece.start_row)
                ranges["stop_row"].append(piece.stop_row)
                ranges["start_char"].append(piece.start_char)
            total += len(piece.text)
            bar.update(len(piece.text))
    if total == 0:
        raise UserError(f"the corpus {corpus.description} is empty: give it some text")
    split_at = text_split_point(total, val_fraction)
    if split_at == 0 or split_at == total:
        raise UserError(f"the corpus {corpus.description} has only {total} characters: too few for a train and a "
                        f"val split with val_fraction {val_fraction}; use more text")
    tok: AnyTokenizer = given if given is not None else CharTokenizer("".join(chars))
    dtype = bin_dtype(tok.vocab_size)
    writers = {split: ShardWriter(work_dir, split, dtype, SHARD_TOKENS) for split in ("train", "val")}
    try:
        # pass 2: encode each piece (train part / val part) and append
        if streaming:
            with tqdm(total=total, desc="encode text", unit="char", unit_scale=True, disable=quiet) as bar:
                for piece in group_rows(_iter_rows(rows)):
                    train_text, val_text = split_piece(piece.text, piece.start_char, split_at)
                    writers["train"].write(encode_text(tok, train_text))
                    writers["val"].write(encode_text(tok, val_text))
                    bar.update(len(piece.text))
        else:
            import datasets

            table = datasets.Dataset.from_dict(ranges)
            ids = datasets.List(datasets.Value(dtype.name))
            with _environ_kept():  # output to the work folder as typed token lists, never from a stale cache
                encoded = table.map(_encode_text_ranges, batched=True, batch_size=1, writer_batch_size=4,
                                    fn_kwargs={"lines": rows, "tokenizer": tok.to_json(), "split_at": split_at},
                                    features=datasets.Features({"train": ids, "val": ids}), desc="encode",
                                    remove_columns=table.column_names, num_proc=num_proc if num_proc > 1 else None,
                                    cache_file_name=str(work_dir / "encoded.arrow"), load_from_cache_file=False,
                                    new_fingerprint=f"attngpt-{os.getpid()}-{id(work_dir)}")
            _copy_encoded(encoded, writers, batch_size=4, quiet=quiet)
    finally:
        shards = {split: writer.close() for split, writer in writers.items()}
    tokens = {split: writer.tokens for split, writer in writers.items()}
    return tok, BinCounts(tokens, documents={}, characters=total), shards  # one text: its pieces are not documents


@contextmanager
def _environ_kept() -> Iterator[None]:
    """Leave os.environ as it was around a datasets.map(num_proc > 1).

    That map sets TOKENIZERS_PARALLELISM=false for its forked workers and then rebinds `os.environ` to a
    deep copy it took before. Whoever still holds the real mapping (the process's own environment, a
    caller that set a variable and will unset it) would then change a mapping nobody reads any more, and
    the copy would keep the old value. The same mapping object comes back, with TOKENIZERS_PARALLELISM as
    it was.
    """
    environ = os.environ
    parallelism = environ.get("TOKENIZERS_PARALLELISM")
    try:
        yield
    finally:
        os.environ = environ
        if parallelism is None:
            environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            environ["TOKENIZERS_PARALLELISM"] = parallelism


def _copy_encoded(encoded: Any, writers: dict[str, ShardWriter], batch_size: int, quiet: bool) -> None:
    """Append the map output's token lists, in row order, to the shards (zero-copy from Arrow)."""
    import pyarrow.compute as pc

    with tqdm(total=len(encoded), desc="write shards", unit="row", unit_scale=True, disable=quiet) as bar:
        for table in encoded.with_format("arrow").iter(batch_size=batch_size):
            for split, writer in writers.items():
                for chunk in pc.list_flatten(table.column(split)).chunks:
                    writer.write(chunk.to_numpy(zero_copy_only=False))
            bar.update(table.num_rows)

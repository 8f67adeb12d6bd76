"""Rows to bins: the passes that turn a corpus's rows into train.bin and val.bin with bounded memory.

Why passes: a character vocabulary must be known before anything is encoded, and nanoGPT's character split
needs the corpus length, so a continuous text is scanned once (counting characters, collecting the
character set, and noting where the safe cuts are) before it is encoded. Documents need that first pass
only for a char vocabulary; with BPE they are encoded straight away.

Encoding runs through `Dataset.map(batched=True, num_proc=N)` (one process per shard; output order and
content do not depend on N), writing token lists to an Arrow file in the work folder, which is then copied
in order, a batch at a time, onto the two flat bin files. A streamed corpus (`IterableDataset`) cannot be
sharded that way: it is read a batch at a time and encoded in this process. Nothing ever holds more than
one batch (or one ~256K-character piece) of text in memory.

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
from data.sources import Corpus, read_errors
from data.splitting import group_rows, split_piece, text_split_point, val_document_count, val_document_mask
from data.tokenizer import CharTokenizer, HFTokenizer, TiktokenTokenizer, tokenizer_from_json

AnyTokenizer = CharTokenizer | TiktokenTokenizer | HFTokenizer
CHAR_DOC_SEPARATOR = "\n"
DOC_BATCH = 1000  # documents per map batch
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


class BinWriter:
    """Appends token ids to train.bin and val.bin; `close` flushes and fsyncs them."""

    def __init__(self, paths: dict[str, Path], dtype: np.dtype) -> None:
        self.dtype = dtype
        self.files = {split: open(path, "wb") for split, path in paths.items()}
        self.counts = BinCounts()

    def write(self, split: str, ids: Any) -> None:
        arr = np.asarray(ids).astype(self.dtype, copy=False)  # (n,)
        if arr.size:
            arr.tofile(self.files[split])
            self.counts.tokens[split] += int(arr.size)

    def close(self) -> None:
        for f in self.files.values():
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())
                f.close()


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
    encoded = tok.encode_batch(texts)
    return [ids + [tok.eot] if t else [] for ids, t in zip(encoded, texts)]


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


def _encode_document_batch(batch: dict[str, list], indices: list[int], tokenizer: dict,
                           val_fraction: float) -> dict[str, list]:
    tok = _tokenizer(tokenizer)
    is_val = val_document_mask(np.asarray(indices), val_fraction)  # (B,)
    encoded = [_ids(ids) for ids in encode_documents(tok, batch["text"])]
    empty = _ids([])
    return {"train": [empty if v else ids for ids, v in zip(encoded, is_val)],
            "val": [ids if v else empty for ids, v in zip(encoded, is_val)]}


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


def write_bins(corpus: Corpus, rows: Any, tokenizer_name: str, val_fraction: float, work_dir: Path,
               num_proc: int = 1, quiet: bool = False,
               fixed: AnyTokenizer | None = None) -> tuple[AnyTokenizer, BinCounts]:
    """Encode `rows` (a Dataset or IterableDataset with a "text" column) into work_dir/{train,val}.bin.
    fixed: encode with this tokenizer (a pretrained model's) instead of the one tokenizer_name names; a fixed
    char vocabulary is kept as it is (text outside it is refused), not rebuilt from the corpus."""
    if fixed is not None:
        bpe = None if isinstance(fixed, CharTokenizer) else fixed
    else:
        bpe = TiktokenTokenizer(tokenizer_name) if tokenizer_name != "char" else None
    chars = fixed if isinstance(fixed, CharTokenizer) else None
    with read_errors(corpus):
        if corpus.kind == "text":
            return _write_text(corpus, rows, bpe, val_fraction, work_dir, num_proc, quiet, chars)
        return _write_documents(corpus, rows, bpe, val_fraction, work_dir, num_proc, quiet, chars)


def _write_text(corpus: Corpus, rows: Any, bpe: TiktokenTokenizer | HFTokenizer | None, val_fraction: float,
                work_dir: Path, num_proc: int, quiet: bool,
                fixed_chars: CharTokenizer | None = None) -> tuple[AnyTokenizer, BinCounts]:
    streaming = _is_streaming(rows)
    # pass 1: length, character set and piece boundaries
    chars: set[str] = set()
    total = 0
    ranges: dict[str, list[int]] = {"start_row": [], "stop_row": [], "start_char": []}
    with tqdm(desc="scan text", unit="char", unit_scale=True, disable=quiet) as bar:
        for piece in group_rows(_iter_rows(rows)):
            if bpe is None:
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
    tok: AnyTokenizer = bpe if bpe is not None else fixed_chars or CharTokenizer("".join(chars))
    writer = _open_writer(work_dir, tok)
    try:
        # pass 2: encode each piece (train part / val part) and append
        if streaming:
            with tqdm(total=total, desc="encode text", unit="char", unit_scale=True, disable=quiet) as bar:
                for piece in group_rows(_iter_rows(rows)):
                    train_text, val_text = split_piece(piece.text, piece.start_char, split_at)
                    writer.write("train", encode_text(tok, train_text))
                    writer.write("val", encode_text(tok, val_text))
                    bar.update(len(piece.text))
        else:
            import datasets

            table = datasets.Dataset.from_dict(ranges)
            encoded = table.map(_encode_text_ranges, batched=True, batch_size=1, writer_batch_size=4,
                                fn_kwargs={"lines": rows, "tokenizer": tok.to_json(), "split_at": split_at},
                                **_map_kwargs(work_dir, writer.dtype, num_proc, table.column_names))
            _copy_encoded(encoded, writer, batch_size=4, quiet=quiet)
    finally:
        writer.close()
    writer.counts.characters = total
    writer.counts.documents = {}  # one continuous text: pieces are not documents
    return tok, writer.counts


def _write_documents(corpus: Corpus, rows: Any, bpe: TiktokenTokenizer | HFTokenizer | None, val_fraction: float,
                     work_dir: Path, num_proc: int, quiet: bool,
                     fixed_chars: CharTokenizer | None = None) -> tuple[AnyTokenizer, BinCounts]:
    streaming = _is_streaming(rows)
    if fixed_chars is not None:
        tok: AnyTokenizer = fixed_chars
    elif bpe is None:  # pass 1 (char only): the character set
        chars = {CHAR_DOC_SEPARATOR}
        with tqdm(desc="scan documents", unit="doc", unit_scale=True, disable=quiet) as bar:
            for batch in iter_text_batches(rows, DOC_BATCH):
                for text in batch:
                    chars.update(text)
                bar.update(len(batch))
        tok = CharTokenizer("".join(chars))
    else:
        tok = bpe
    writer = _open_writer(work_dir, tok)
    n_docs = 0
    try:
        if streaming:
            with tqdm(desc="encode documents", unit="doc", unit_scale=True, disable=quiet) as bar:
                for batch in iter_text_batches(rows, DOC_BATCH):
                    out = _encode_document_batch({"text": batch}, list(range(n_docs, n_docs + len(batch))),
                                                 tok.to_json(), val_fraction)
                    for split in ("train", "val"):
                        for ids in out[split]:
                            writer.counts.documents[split] += len(ids) > 0
                            writer.write(split, ids)
                    n_docs += len(batch)
                    bar.update(len(batch))
        else:
            n_docs = len(rows)
            encoded = rows.map(_encode_document_batch, batched=True, batch_size=DOC_BATCH, with_indices=True,
                               fn_kwargs={"tokenizer": tok.to_json(), "val_fraction": val_fraction},
                               **_map_kwargs(work_dir, writer.dtype, num_proc, rows.column_names))
            _copy_encoded(encoded, writer, batch_size=DOC_BATCH, quiet=quiet)
    finally:
        writer.close()
    counts = writer.counts
    if counts.documents["train"] + counts.documents["val"] == 0:
        raise UserError(f"the corpus {corpus.description} is empty: its {n_docs} document(s) hold no text")
    if counts.documents["val"] == 0:
        raise UserError(f"val split is empty: val_fraction {val_fraction} of {n_docs} document(s) puts none in val "
                        f"(it takes {val_document_count(n_docs, val_fraction)}); raise data.val_fraction to at least "
                        f"{1 / max(n_docs, 1):.3g}, or use more documents")
    if counts.documents["train"] == 0:
        raise UserError(f"train split is empty: lower data.val_fraction ({val_fraction}) or use more documents")
    return tok, counts


def _open_writer(work_dir: Path, tok: AnyTokenizer) -> BinWriter:
    return BinWriter({"train": work_dir / "train.bin", "val": work_dir / "val.bin"}, bin_dtype(tok.vocab_size))


def _map_kwargs(work_dir: Path, dtype: np.dtype, num_proc: int, input_columns: list[str]) -> dict[str, Any]:
    """Shared datasets.map settings: output to the work folder, typed token lists, never a stale cache."""
    import datasets

    ids = datasets.List(datasets.Value(dtype.name))
    return {"features": datasets.Features({"train": ids, "val": ids}), "remove_columns": input_columns,
            "num_proc": num_proc if num_proc > 1 else None, "cache_file_name": str(work_dir / "encoded.arrow"),
            "load_from_cache_file": False, "new_fingerprint": f"attngpt-{os.getpid()}-{id(work_dir)}",
            "desc": "encode"}


def _copy_encoded(encoded: Any, writer: BinWriter, batch_size: int, quiet: bool) -> None:
    """Append the map output's token lists, in row order, to the bin files (zero-copy from Arrow)."""
    import pyarrow.compute as pc

    with tqdm(total=len(encoded), desc="write bins", unit="row", unit_scale=True, disable=quiet) as bar:
        for table in encoded.with_format("arrow").iter(batch_size=batch_size):
            for split in ("train", "val"):
                column = table.column(split)
                writer.counts.documents[split] += int(pc.sum(pc.greater(pc.list_value_length(column), 0)).as_py() or 0)
                for chunk in pc.list_flatten(column).chunks:
                    writer.write(split, chunk.to_numpy(zero_copy_only=False))
            bar.update(table.num_rows)

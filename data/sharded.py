"""Document corpora at scale: encoded part by part in worker processes, resumable part by part.

Why: a hub corpus such as FineWeb-Edu's 10B-token sample is ~28 GB of text, and one process encodes
5-6 MB/s of it (hours); a prepare that dies at 90% should not start over. So:

- Parts. The corpus is cut along its own seams, never by num_proc: a streamed dataset (IterableDataset)
  into its `n_shards` (one per file, `rows.shard(n_shards, index)`), an in-memory one into runs of
  PART_DOCS documents. No process reads the whole corpus: each worker reads the parts it is given.
- Workers (data/workers.py). `num_proc` processes each encode whole parts into the work folder: the
  part's ids (every document followed by its separator) and each document's length in tokens, both
  written to temp names, fsynced and renamed, the lengths last: their presence marks the part encoded.
- Split into shards, in order. The train/val rule needs each document's index in the whole corpus
  (data/splitting.py); for part u that is known once parts 0..u-1 are encoded. The main process takes
  parts in order as they become ready and splits each into its shards train_<u>.bin and val_<u>.bin
  (temp name, fsync, rename), then records the part as done (.work/done_<u>.json, written atomically,
  last) and deletes the part's files. The tokens of each split, in order, are therefore the same
  whatever num_proc and whether the corpus was streamed (only the number of shards follows the parts).
- Resume. .work/plan.json pins the fingerprint, the number of parts and the tokenizer. A prepare that
  finds the same plan keeps each part recorded as done (its shards checked against the record) and each
  part encoded but not yet split, deletes every temp file (a partial file is never reused), and encodes
  the rest. Any other plan starts over.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from common.errors import UserError
from common.schema import is_int
from common.writes import write_file
from data.corpus import Corpus
from data.pipeline import CHAR_DOC_SEPARATOR, DOC_BATCH, AnyTokenizer, BinCounts, EncodeSettings, _is_streaming, \
    _tokenizer, bin_dtype, encode_documents, iter_text_batches
from data.shards import shard_name
from data.source_errors import corpus_errors
from data.splitting import val_document_count, val_document_mask
from data.tokenizer import CharTokenizer
from data.workers import run_parts

PART_DOCS = 100_000  # documents per part of an in-memory dataset (a streamed one is cut into its files)
SPLIT_BLOCK_TOKENS = 1 << 24  # a part is split into train/val this many tokens at a time (bounded memory)
WORK, PLAN = ".work", "plan.json"
TEST_KILL_ENV = "ATTNGPT_TEST_KILL_AFTER_PARTS"  # tests only: SIGKILL this process once that many parts are done


def plan_parts(rows: Any, corpus: Corpus, part_docs: int) -> list[Any]:
    """The corpus cut along its own seams: a list of datasets, one per part, in corpus order."""
    if _is_streaming(rows):
        if corpus.max_docs is not None or rows.n_shards <= 1:
            return [rows]  # `take(max_docs)` counts across files: it stays one part
        return [rows.shard(num_shards=rows.n_shards, index=i) for i in range(rows.n_shards)]
    n = len(rows)
    return [rows.select(range(lo, min(n, lo + part_docs))) for lo in range(0, max(n, 1), part_docs)]


def known_documents(rows: Any, corpus: Corpus) -> int | None:
    """How many documents the corpus holds, when that is known without reading it (for the ETA)."""
    if not _is_streaming(rows):
        return len(rows)
    total = None
    splits = getattr(rows.info, "splits", None) or {}
    split = corpus.load_kwargs.get("split")
    if split in splits and getattr(splits[split], "num_examples", 0):
        total = int(splits[split].num_examples)
    elif corpus.load_kwargs.get("path") == "parquet" and corpus.local_files:
        import pyarrow.parquet as pq

        total = sum(pq.ParquetFile(f).metadata.num_rows for f in corpus.local_files)
    return min(total, corpus.max_docs) if total is not None and corpus.max_docs is not None else total


# --- in the workers ---------------------------------------------------------------------------------------

def _part_paths(work: Path, index: int) -> tuple[Path, Path]:
    return work / f"part_{index:05d}.ids", work / f"part_{index:05d}.lens"


@dataclass(frozen=True)
class PartSource:
    """Where a worker finds its part: the corpus, the cache `load_rows` reads it through, and the run
    length the main process cut an in-memory corpus by. A worker loads the corpus again from the first two
    and must cut it exactly as the main process did, so the three travel as one (pickled to each worker)."""
    corpus: Corpus
    cache_dir: Path
    part_docs: int


_ROWS: dict[str, Any] = {}  # in a worker: the corpus, loaded once


def _find_part(rows: Any, index: int, source: PartSource) -> Any:
    """The part itself (in the main process), or, in a worker, part `index` of the corpus loaded here: the
    same `load_rows` call on the same files and cache gives the same parts."""
    if rows is not None:
        return rows
    from data.sources import load_rows

    key = str(source.cache_dir)
    if key not in _ROWS:
        _ROWS[key] = load_rows(source.corpus, source.cache_dir)
    return plan_parts(_ROWS[key], source.corpus, source.part_docs)[index]


def scan_part(rows: Any, index: int, report: Callable[[int, int], None], source: PartSource) -> str:
    """The distinct characters of a part's documents (for a char vocabulary), as one sorted string."""
    chars = {CHAR_DOC_SEPARATOR}
    rows = _find_part(rows, index, source)
    with corpus_errors(source.corpus, source.cache_dir, reading=True):
        for batch in iter_text_batches(rows, DOC_BATCH):
            for text in batch:
                chars.update(text)
            report(len(batch), 0)
    return "".join(sorted(chars))


def encode_part(rows: Any, index: int, report: Callable[[int, int], None], source: PartSource, tokenizer: dict,
                work: Path) -> dict[str, Any]:
    """Encode one part into work/part_<index>.ids (all its documents, each with its separator) and
    .lens (each document's token count, uint32; 0 for an empty document)."""
    rows = _find_part(rows, index, source)
    tok = _tokenizer(tokenizer)
    dtype = bin_dtype(tok.vocab_size)
    ids_path, lens_path = _part_paths(work, index)
    lens: list[int] = []

    def encode_into(f) -> None:
        for batch in iter_text_batches(rows, DOC_BATCH):
            encoded = encode_documents(tok, batch)
            lens.extend(len(ids) for ids in encoded)
            flat = np.concatenate([np.asarray(ids, dtype=dtype) for ids in encoded]) if encoded else np.zeros(0, dtype)
            flat.tofile(f)
            report(len(batch), int(flat.size))

    with corpus_errors(source.corpus, ids_path, reading=True):
        write_file(ids_path, encode_into)
    write_file(lens_path, np.asarray(lens, dtype=np.uint32).tofile)  # last: its presence says the part is encoded
    return {"docs": len(lens), "tokens": int(sum(lens)), "peak_rss_mb": peak_rss_mb(), "pid": os.getpid()}


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: a spawned process's ru_maxrss starts at
    its parent's RSS at the fork (Linux keeps the high-water mark across exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- in the main process ----------------------------------------------------------------------------------

def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that `path` is either the old file or the whole new one, even across a crash."""
    write_file(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def split_part(index: int, first_doc: int, work: Path, out_dir: Path, dtype: np.dtype,
               val_fraction: float) -> dict[str, Any]:
    """Split an encoded part into its train and val shards by each document's corpus index (the first is
    `first_doc`), record it as done, delete the part's files. Returns the done record."""
    ids_path, lens_path = _part_paths(work, index)
    lens = np.fromfile(lens_path, dtype=np.uint32).astype(np.int64)  # (n_docs,)
    ends = np.cumsum(lens)  # (n_docs,) where each document's ids end in the part
    starts = ends - lens
    is_val = val_document_mask(first_doc + np.arange(len(lens)), val_fraction)  # (n_docs,)
    ids = np.memmap(ids_path, dtype=dtype, mode="r") if ids_path.stat().st_size else np.zeros(0, dtype)
    record: dict[str, Any] = {"part": index, "docs": len(lens), "shards": {}, "documents": {}}
    for split, in_split in (("train", ~is_val), ("val", is_val)):
        name = shard_name(split, index)
        n_tokens, max_id = 0, -1

        def split_into(f) -> None:
            nonlocal n_tokens, max_id
            lo = 0
            while lo < len(lens):  # a block of documents holding about SPLIT_BLOCK_TOKENS ids
                hi = min(len(lens), max(lo + 1, int(np.searchsorted(ends, starts[lo] + SPLIT_BLOCK_TOKENS, "right"))))
                block = np.asarray(ids[starts[lo]:ends[hi - 1]])
                keep = np.repeat(in_split[lo:hi], lens[lo:hi])  # (block tokens,)
                chunk = block if keep.all() else block[keep]
                if chunk.size:
                    chunk.tofile(f)
                    n_tokens += int(chunk.size)
                    max_id = max(max_id, int(chunk.max()))
                lo = hi

        write_file(out_dir / name, split_into)
        if n_tokens:
            record["shards"][split] = {"file": name, "tokens": n_tokens, "max_id": max_id}
        else:  # no shard for a split without tokens
            (out_dir / name).unlink()
            record["shards"][split] = None
        record["documents"][split] = int(((lens > 0) & in_split).sum())
    ids = None  # the memmap closed before its file is deleted
    write_json_atomic(work / f"done_{index:05d}.json", record)
    ids_path.unlink()
    lens_path.unlink()
    return record


def _done_record(work: Path, out_dir: Path, index: int, dtype: np.dtype) -> dict[str, Any] | None:
    """The done record of a part if it is what split_part writes for this part (its own shard names, whole
    counts) and its shards are on disk with the recorded sizes; else None, and the part is encoded again."""
    def whole(value: Any, least: int = 0) -> bool:  # an int, not a bool, of at least `least`
        return is_int(value) and value >= least

    def shard_ok(split: str, entry: dict[str, Any] | None) -> bool:
        return entry is None or (entry["file"] == shard_name(split, index) and whole(entry["tokens"], 1)
                                 and whole(entry["max_id"])
                                 and (out_dir / entry["file"]).stat().st_size == entry["tokens"] * dtype.itemsize)
    try:
        record = json.loads((work / f"done_{index:05d}.json").read_text(encoding="utf-8"))
        ok = record["part"] == index and set(record["shards"]) == {"train", "val"} and whole(record["docs"]) \
            and all(whole(record["documents"][split]) and shard_ok(split, entry)
                    for split, entry in record["shards"].items())
        return record if ok else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def start_over(out_dir: Path, plan: dict[str, Any], keep: str | None = None) -> None:
    """Empty `out_dir` but for the plan (and the folder `keep` of .work, e.g. a datasets cache in use).
    meta.json goes first, so nothing here is trusted meanwhile."""
    (out_dir / "meta.json").unlink(missing_ok=True)
    if out_dir.exists():
        for path in out_dir.iterdir():
            if path.name == WORK:
                for inner in path.iterdir():
                    if inner.name != keep:
                        shutil.rmtree(inner) if inner.is_dir() else inner.unlink()
            else:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    (out_dir / WORK).mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / WORK / PLAN, plan)


def read_plan(out_dir: Path) -> dict[str, Any]:
    """The plan an earlier prepare of out_dir left ({} when none)."""
    try:
        plan = json.loads((out_dir / WORK / PLAN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


@dataclass
class ShardedResult:
    tokenizer: AnyTokenizer
    counts: BinCounts
    shards: dict[str, list[dict[str, Any]]]  # meta.json's entries per split, in stream order
    parts: int
    peak_worker_rss_mb: float = 0.0  # the largest peak RSS of a process that encoded parts this time


def encode_documents_sharded(corpus: Corpus, rows: Any, cache_dir: Path, fp: str, out_dir: Path,
                             settings: EncodeSettings) -> ShardedResult:
    """Encode a document corpus (`rows`, loaded by `load_rows(corpus, cache_dir)`) into out_dir's shards,
    resuming an interrupted prepare of the same plan (the caller has already emptied out_dir, but for
    .work/hf, when the fingerprint differs)."""
    val_fraction, num_proc, quiet = settings.val_fraction, settings.num_proc, settings.quiet
    source = PartSource(corpus, cache_dir, PART_DOCS)  # read at each call (a test lowers it); workers cut by it too
    parts = plan_parts(rows, corpus, source.part_docs)
    plan = {"fingerprint": fp, "parts": len(parts), "tokenizer": None}
    old = read_plan(out_dir)
    resuming = old.get("tokenizer") is not None and all(old.get(k) == plan[k] for k in ("fingerprint", "parts"))
    work = out_dir / WORK
    if resuming:
        tok: AnyTokenizer = _tokenizer(old["tokenizer"])
        for tmp in [*out_dir.glob(".*.tmp"), *work.glob(".*.tmp")]:  # a partial file is never reused
            tmp.unlink()
    else:
        start_over(out_dir, plan, keep="hf")
        tok = settings.given_tokenizer()
        if tok is None:  # a char vocabulary: the character set of every document, scanned in parallel over the parts
            chars: set[str] = set()
            with tqdm(desc="scan documents", unit="doc", unit_scale=True, disable=quiet) as bar:
                run_parts(scan_part, parts, range(len(parts)), {"source": source}, num_proc,
                          lambda docs, _: bar.update(docs), lambda _, found: chars.update(found))
            tok = CharTokenizer("".join(chars))
        write_json_atomic(work / PLAN, {**plan, "tokenizer": tok.to_json()})
    dtype = bin_dtype(tok.vocab_size)

    records: dict[int, dict[str, Any]] = {}
    encoded: dict[int, int] = {}  # index -> documents, for parts encoded but not yet split
    for index in range(len(parts)):
        record = _done_record(work, out_dir, index, dtype) if resuming else None
        if record is not None:
            records[index] = record
        elif _part_paths(work, index)[1].is_file():
            encoded[index] = len(np.fromfile(_part_paths(work, index)[1], dtype=np.uint32))
    todo = [i for i in range(len(parts)) if i not in records and i not in encoded]
    if resuming and not quiet:
        print(f"resuming the interrupted prepare of {out_dir}: {len(records)} of {len(parts)} parts done, "
              f"{len(encoded)} encoded, {len(todo)} to encode", file=sys.stderr)

    total = known_documents(rows, corpus)
    bar = tqdm(total=total, initial=sum(r["docs"] for r in records.values()) + sum(encoded.values()),
               desc=f"encode {len(parts)} part{'s' * (len(parts) != 1)}", unit="doc", unit_scale=True, disable=quiet)
    t0, tokens_now = time.perf_counter(), [0]

    def on_progress(docs: int, tokens: int) -> None:
        tokens_now[0] += tokens
        bar.update(docs)
        rate = tokens_now[0] / max(time.perf_counter() - t0, 1e-9)
        bar.set_postfix_str(f"parts {len(records)}/{len(parts)}, {rate:,.0f} tok/s", refresh=False)

    def split_ready() -> None:  # split every part whose predecessors are all encoded, in order
        first_doc = 0
        for index in range(len(parts)):
            if index not in records:
                if index not in encoded:
                    return
                records[index] = split_part(index, first_doc, work, out_dir, dtype, val_fraction)
                del encoded[index]
                if os.environ.get(TEST_KILL_ENV) == str(len(records)):  # die the way an out-of-memory kill would
                    os.kill(os.getpid(), signal.SIGKILL)
            first_doc += records[index]["docs"]

    peak_rss = [0.0]

    def on_done(index: int, result: dict[str, Any]) -> None:
        encoded[index] = result["docs"]
        peak_rss[0] = max(peak_rss[0], result["peak_rss_mb"])
        split_ready()

    try:
        split_ready()
        run_parts(encode_part, parts, todo, {"source": source, "tokenizer": tok.to_json(), "work": work}, num_proc,
                  on_progress, on_done)
    finally:
        bar.close()
    counts, shards = _totals(corpus, records, len(parts), val_fraction)
    return ShardedResult(tok, counts, shards, len(parts), peak_rss[0])


def _totals(corpus: Corpus, records: dict[int, dict[str, Any]], n_parts: int, val_fraction: float
            ) -> tuple[BinCounts, dict[str, list[dict[str, Any]]]]:
    counts = BinCounts()
    shards: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    n_docs = 0
    for index in range(n_parts):
        record = records[index]
        n_docs += record["docs"]
        for split in ("train", "val"):
            entry = record["shards"][split]
            counts.documents[split] += record["documents"][split]
            if entry is not None:
                shards[split].append(entry)
                counts.tokens[split] += entry["tokens"]
    if counts.documents["train"] + counts.documents["val"] == 0:
        raise UserError(f"the corpus {corpus.description} is empty: its {n_docs} document(s) hold no text")
    if counts.documents["val"] == 0:
        raise UserError(f"val split is empty: val_fraction {val_fraction} of {n_docs} document(s) puts none in val "
                        f"(it takes {val_document_count(n_docs, val_fraction)}); raise data.val_fraction to at least "
                        f"{1 / max(n_docs, 1):.3g}, or use more documents")
    if counts.documents["train"] == 0:
        raise UserError(f"train split is empty: lower data.val_fraction ({val_fraction}) or use more documents")
    return counts, shards

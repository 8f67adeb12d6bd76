"""A corpus's failures as one UserError line (`corpus_errors`): while `datasets` loads it and while its rows are
read (in this process or in an encoding worker).

What is the user's to fix: undecodable bytes (the file and byte offset, for local text), I/O and network
failures, and a local file that its format's reader refuses (named, with the reason: `unreadable_file`, below).
A worker's failure arrives as a traceback's text, whose reason is its last line (`root_reason`); `datasets`' own
"Failed to read ..." records are kept off stderr meanwhile, so the one line stays one. Anything else while
reading rows is a bug and keeps its traceback.

Text that is not UTF-8 is refused, never silently repaired: the error names the file and the byte offset,
and the fix is one `iconv` away. (Replacing bytes with U+FFFD would train the model on corruption.)

Which local file of a corpus is not what its format says, and why: `unreadable_file(corpus)`. Why a second
reader: when `datasets` fails to read a parquet, json, csv or arrow file, what comes back names the
reason (pyarrow's "Parquet magic bytes not found in footer", a JSON decoder's "Unexpected character") but not
the file, and from its worker processes (`data.num_proc > 1`) only as a traceback's text. So, once a read has
failed, each local file is opened here with the reader of its format, in order, and the first one that cannot
be read is named with the reason. Only then: it reads every file whole, which is what the failed read would
have done anyway, and nothing here decides what a valid corpus is (`datasets` does; a file this module reads
may still fail there, and then no file is named).
"""
from __future__ import annotations

import codecs
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from common.errors import UserError, out_of_room
from data.corpus import LOCAL_BUILDERS, Corpus

EXTENSIONS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text",
              ".arrow": "arrow"}
BATCH_ROWS = 65_536
JSON_DOCUMENT_LIMIT = 1 << 30  # a whole-file JSON document (not JSON Lines) larger than this is not parsed again


def _error_chain(e: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return chain


def _cut(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return _cut(f"{type(e).__name__}: {text}" if text else type(e).__name__)


def root_reason(e: BaseException) -> str:
    """The innermost reason in `e`'s chain, as one line "Type: message". A worker's failure arrives as a
    traceback's text (multiprocess's RemoteTraceback, data/workers.py's "a worker process failed"): its reason
    is that traceback's last line, not its first."""
    innermost = _error_chain(e)[-1]
    text = str(innermost).strip()
    if type(innermost).__name__ == "RemoteTraceback" or text.startswith("a worker process failed:"):
        lines = [line.strip() for line in text.strip('"').splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if not line.startswith(("File ", "^", "~"))), "")
        head, sep, message = last.partition(":")
        if sep and " " not in head:  # "pyarrow.lib.ArrowInvalid: ..." -> "ArrowInvalid: ..."
            last = f"{head.rsplit('.', 1)[-1]}:{message}"
        return _cut(last)
    return _first_line(innermost)


def _below_error(record: Any) -> bool:
    """A logging filter: `datasets` logs "Failed to read file ..." at ERROR level before it raises, a second line
    beside the one this module makes of the error."""
    return record.levelno < 40  # logging.ERROR


@contextmanager
def corpus_errors(corpus: Corpus, writing: Path, *, reading: bool) -> Iterator[None]:
    """Failures as one line (module doc): every one while loading, only the user's to fix while `reading` rows.
    `writing`: the folder written meanwhile (the `datasets` cache, or the one rows are encoded into), named when
    a write there finds the disk full. datasets' error records are dropped meanwhile (also in its forks)."""
    import datasets.utils.logging as ds_logging

    handlers = list(ds_logging.get_logger().handlers)
    for handler in handlers:
        handler.addFilter(_below_error)
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        if not reading or any(isinstance(x, (UnicodeDecodeError, OSError)) for x in _error_chain(e)):
            raise _as_user_error(e, corpus, writing) from None
        unreadable = _unreadable(corpus)
        if unreadable is None:
            raise
        raise unreadable from None
    finally:
        for handler in handlers:
            handler.removeFilter(_below_error)


def _unreadable(corpus: Corpus) -> UserError | None:
    """A UserError naming the first local file of a document corpus that its format's reader refuses, or None."""
    found = unreadable_file(corpus) if corpus.kind == "documents" else None
    if found is None:
        return None
    path, fmt, reason = found
    leave_out = "data.data_files" if corpus.load_kwargs.get("data_files") else "the dataset folder"
    return UserError(f"file '{path}' is not a readable {fmt} file ({reason.rstrip('.')}): fix or replace it, or "
                     f"leave it out of {leave_out}")


def _as_user_error(e: BaseException, corpus: Corpus, writing: Path) -> UserError:
    full = out_of_room(e, writing)  # a write that found no room is the disk's fault, not the corpus's
    if full is not None:
        return full
    chain = _error_chain(e)
    if any(isinstance(x, UnicodeDecodeError) for x in chain):
        bad = first_invalid_utf8(corpus.local_files) if corpus.kind == "text" else None
        if bad is not None:
            path, offset, byte = bad
            return UserError(f"file '{path}' is not UTF-8 text (byte 0x{byte:02x} at offset {offset}): convert it, "
                             f"e.g. iconv -f latin1 -t utf-8 '{path}' > fixed.txt")
        return _unreadable(corpus) or UserError(f"{corpus.description} holds text that is not UTF-8 "
                                                f"({root_reason(e)}): convert it to UTF-8")
    if corpus.remote and any(isinstance(x, (ConnectionError, OSError)) for x in chain):
        return UserError(f"cannot load {corpus.description}: {_first_line(e)}; check the dataset name, the network, "
                         f"and HF_DATASETS_OFFLINE/HF_HUB_OFFLINE (a dataset must be downloaded once while online)")
    return _unreadable(corpus) or UserError(f"cannot load {corpus.description}: {root_reason(e)}")


def first_invalid_utf8(files: list[Path], chunk_bytes: int = 1 << 20) -> tuple[Path, int, int] | None:
    """(file, byte offset, byte value) of the first byte that is not valid UTF-8, or None; reads in chunks."""
    for path in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0  # bytes of this file already passed to the decoder
        with open(path, "rb") as f:
            while True:
                chunk = f.read(chunk_bytes)
                pending = len(decoder.getstate()[0])
                try:
                    decoder.decode(chunk, final=not chunk)
                except UnicodeDecodeError as e:
                    return path, offset - pending + e.start, e.object[e.start]
                if not chunk:
                    break
                offset += len(chunk)
    return None


# --- which local file is not what its format says ---------------------------------------------------------


def file_format(corpus: Corpus, path: Path) -> str | None:
    """The format `datasets` reads `path` of `corpus` as, or None when it is none of the local builders'."""
    builder = corpus.load_kwargs.get("path")
    return builder if builder in LOCAL_BUILDERS else EXTENSIONS.get(path.suffix.lower())


def unreadable_file(corpus: Corpus) -> tuple[Path, str, str] | None:
    """(the first local file of `corpus` that its format's reader refuses, its format, the reason), or None."""
    for path in corpus.local_files:
        fmt = file_format(corpus, path)
        if fmt is None:
            continue
        try:
            reason = _check_text(path) if fmt == "text" else _check_json(path) if fmt == "json" else \
                _check_table(path, fmt)
        except OSError as e:
            reason = f"cannot read it ({e.strerror or e})"
        if reason is not None:
            return path, fmt, reason
    return None


def _reason(e: BaseException) -> str:
    return _cut(" ".join(str(e).split()) or type(e).__name__)


def _check_table(path: Path, fmt: str) -> str | None:
    """A parquet, arrow or csv file read through, a batch at a time: the reader's complaint, or None."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    # pandas' ParserError and EmptyDataError are ValueErrors; an OSError reading a csv is unreadable_file's
    errors = (ValueError,) if fmt == "csv" else (pa.ArrowException, ValueError, OSError)
    try:
        if fmt == "arrow":
            with pa.memory_map(str(path)) as source:
                for _ in pa.ipc.open_stream(source):
                    pass
        else:
            batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS) if fmt == "parquet" else \
                pd.read_csv(path, chunksize=BATCH_ROWS)
            for _ in batches:
                pass
    except errors as e:
        return _reason(e)
    return None


def _check_text(path: Path) -> str | None:
    bad = first_invalid_utf8([path])
    if bad is None:
        return None
    _, offset, byte = bad
    return f"not UTF-8 text (byte 0x{byte:02x} at offset {offset})"


def _check_json(path: Path) -> str | None:
    """JSON Lines (one object per line), or one JSON document holding the rows (a list, or an object)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    first_error: str | None = None
    line_no, pending = 0, ""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                text = pending + decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                return f"not UTF-8 text ({_reason(e)})"
            lines = text.split("\n")
            pending = lines.pop() if chunk else ""
            for line in lines:
                line_no += 1
                if first_error is None and line.strip():
                    first_error = _json_line_error(line, line_no)
            if not chunk:
                break
    if first_error is None:
        return None
    if path.stat().st_size <= JSON_DOCUMENT_LIMIT:  # one document (a list of rows, or {field: rows})?
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            return first_error
        if isinstance(document, (list, dict)):
            return None
    return first_error


def _json_line_error(line: str, line_no: int) -> str | None:
    try:
        row = json.loads(line)
    except ValueError as e:
        return f"line {line_no} is not JSON ({_reason(getattr(e, 'msg', e))}, column {getattr(e, 'colno', '?')})"
    if not isinstance(row, dict):
        return f"line {line_no} holds a JSON {type(row).__name__}, not an object of columns"
    return None

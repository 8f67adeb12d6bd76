"""Which local file of a corpus is not what its format says, and why: `unreadable_file(corpus)`.

Why a second reader: when `datasets` fails to read a parquet, json, csv or arrow file, what comes back names the
reason (pyarrow's "Parquet magic bytes not found in footer", a JSON decoder's "Unexpected character") but not
the file, and from its worker processes (`data.num_proc > 1`) only as a traceback's text. So, once a read has
failed, each local file is opened here with the reader of its format, in order, and the first one that cannot
be read is named with the reason. Only then: it reads every file whole, which is what the failed read would
have done anyway, and nothing here decides what a valid corpus is (`datasets` does; a file this module reads
may still fail there, and then no file is named).

The format of a file: the builder (`data.name: parquet`, json, csv, text, arrow), or, for a local dataset folder,
the file's extension as `datasets` maps it (.parquet, .json/.jsonl, .csv, .txt, .arrow).
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any, Callable

from data.source_errors import first_invalid_utf8
from data.sources import LOCAL_BUILDERS, Corpus

EXTENSIONS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text",
              ".arrow": "arrow"}
BATCH_ROWS = 65_536
JSON_DOCUMENT_LIMIT = 1 << 30  # a whole-file JSON document (not JSON Lines) larger than this is not parsed again


def file_format(corpus: Corpus, path: Path) -> str | None:
    """The format `datasets` reads `path` of `corpus` as, or None when it is none of the local builders'."""
    builder = corpus.load_kwargs.get("path")
    if builder in LOCAL_BUILDERS:
        return builder
    return EXTENSIONS.get(path.suffix.lower())


def unreadable_file(corpus: Corpus) -> tuple[Path, str, str] | None:
    """(the first local file of `corpus` that its format's reader refuses, its format, the reason), or None."""
    for path in corpus.local_files:
        fmt = file_format(corpus, path)
        check = CHECKS.get(fmt) if fmt is not None else None
        if check is None:
            continue
        try:
            reason = check(path)
        except OSError as e:
            reason = f"cannot read it ({e.strerror or e})"
        if reason is not None:
            return path, fmt, reason
    return None


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _check_parquet(path: Path) -> str | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for _ in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            pass
    except (pa.ArrowException, ValueError, OSError) as e:
        return _reason(e)
    return None


def _check_arrow(path: Path) -> str | None:
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_stream(source)
            for _ in reader:
                pass
    except (pa.ArrowException, ValueError, OSError) as e:
        return _reason(e)
    return None


def _check_csv(path: Path) -> str | None:
    import pandas as pd

    try:
        for _ in pd.read_csv(path, chunksize=BATCH_ROWS):
            pass
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
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


CHECKS: dict[str, Callable[[Path], Any]] = {"parquet": _check_parquet, "arrow": _check_arrow, "csv": _check_csv,
                                            "text": _check_text, "json": _check_json}

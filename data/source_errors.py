"""A corpus's failures as one UserError line: while `datasets` loads it (`load_errors`) and while its rows are
read (`read_errors`, in this process or in an encoding worker).

What is the user's to fix: undecodable bytes (the file and byte offset, for local text), I/O and network
failures, and a local file that its format's reader refuses (named, with the reason: data/file_formats.py). A
worker's failure arrives as a traceback's text, whose reason is its last line (`root_reason`); `datasets`' own
"Failed to read ..." records are kept off stderr meanwhile, so the one line stays one. Anything else while
reading rows is a bug and keeps its traceback.

Text that is not UTF-8 is refused, never silently repaired: the error names the file and the byte offset,
and the fix is one `iconv` away. (Replacing bytes with U+FFFD would train the model on corruption.)
"""
from __future__ import annotations

import codecs
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from common.errors import UserError

if TYPE_CHECKING:
    from data.sources import Corpus


def _error_chain(e: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return chain


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


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
        return last if len(last) <= 200 else last[:197] + "..."
    return _first_line(innermost)


class _DropErrorRecords:
    """A logging filter: `datasets` logs "Failed to read file ..." at ERROR level before it raises; the one line
    this module makes of the error says it, so the record would only be a second line."""

    @staticmethod
    def filter(record: Any) -> bool:
        return record.levelno < 40  # logging.ERROR


@contextmanager
def _datasets_errors_not_logged() -> Iterator[None]:
    """While loading or reading: datasets' error records dropped (also in the processes it forks meanwhile)."""
    import datasets.utils.logging as ds_logging

    handlers = list(ds_logging.get_logger().handlers)
    for handler in handlers:
        handler.addFilter(_DropErrorRecords)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_DropErrorRecords)


@contextmanager
def load_errors(corpus: Corpus) -> Iterator[None]:
    """Loading a dataset is all user input (names, files, network): every failure becomes one line."""
    try:
        with _datasets_errors_not_logged():
            yield
    except UserError:
        raise
    except Exception as e:
        raise _as_user_error(e, corpus) from None


@contextmanager
def read_errors(corpus: Corpus) -> Iterator[None]:
    """While reading rows: undecodable bytes, I/O or network failures, and a local file that its format's reader
    refuses (data/file_formats.py) are the user's to fix; anything else is a bug and keeps its traceback."""
    try:
        with _datasets_errors_not_logged():
            yield
    except UserError:
        raise
    except Exception as e:
        chain = _error_chain(e)
        if any(isinstance(x, (UnicodeDecodeError, OSError)) for x in chain):
            raise _as_user_error(e, corpus) from None
        unreadable = _unreadable(corpus)
        if unreadable is not None:
            raise unreadable from None
        raise


def _unreadable(corpus: Corpus) -> UserError | None:
    """A UserError naming the first local file of a document corpus that its format's reader refuses, or None."""
    if corpus.kind != "documents" or not corpus.local_files:
        return None
    from data.file_formats import unreadable_file

    found = unreadable_file(corpus)
    if found is None:
        return None
    path, fmt, reason = found
    leave_out = "data.data_files" if corpus.load_kwargs.get("data_files") else "the dataset folder"
    return UserError(f"file '{path}' is not a readable {fmt} file ({reason.rstrip('.')}): fix or replace it, or "
                     f"leave it out of {leave_out}")


def _as_user_error(e: BaseException, corpus: Corpus) -> UserError:
    chain = _error_chain(e)
    if any(isinstance(x, UnicodeDecodeError) for x in chain):
        bad = first_invalid_utf8(corpus.local_files) if corpus.kind == "text" else None
        if bad is not None:
            path, offset, byte = bad
            return UserError(f"file '{path}' is not UTF-8 text (byte 0x{byte:02x} at offset {offset}): convert it, "
                             f"e.g. iconv -f latin1 -t utf-8 '{path}' > fixed.txt")
        unreadable = _unreadable(corpus)
        if unreadable is not None:
            return unreadable
        return UserError(f"{corpus.description} holds text that is not UTF-8 ({root_reason(e)}): convert it to UTF-8")
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
                    where = offset - pending + e.start
                    return path, where, e.object[e.start]
                if not chunk:
                    break
                offset += len(chunk)
    return None

"""Reading a file someone else may have written (a checkpoint's config.json, a Hugging Face folder's config and
tokenizer files): its size is checked before a byte is read, and JSON is parsed strictly.

    read_bounded(path, limit, what)   the file's bytes, refused when it is larger than `limit`: the size comes from
                                      the file system first, so a 1 TB (sparse) file is refused at once; a pipe
                                      or device is read only up to the limit
    read_json(path, limit, what)      read_bounded, then JSON: NaN, Infinity and numbers too large for a float
                                      (1e400) are refused, so is nesting deeper than the parser's stack
    parse_json(data, what, path)      the same JSON rules for a file's bytes already read; a string no UTF-8 can
                                      hold (a lone surrogate, written as the escape \\ud800) is refused too, so
                                      text from such a file (a vocabulary) can always be printed and saved

Every failure is a FileContentError (a UserError) naming the file, whose `problem` says what is wrong without
the name (for callers that word their own message); what the file must hold is checked afterwards, as data
(common/schema.py). MissingFileError says the file vanished between being found and read: a reader that races
a writer swapping folders (pretrained/checkpoint.py) tells that apart from a damaged file.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from common.errors import UserError

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # the only way JSON text can hold a surrogate


class FileContentError(UserError):
    """A file that cannot be read as what it should be: "<what> '<path>' <problem>"."""

    def __init__(self, what: str, path: str | Path, problem: str) -> None:
        super().__init__(f"{what} '{path}' {problem}")
        self.problem = problem


class MissingFileError(FileContentError):
    """The file is not there (or vanished since it was found)."""


def human_size(n: float, units: tuple[str, ...] = ("bytes", "kB", "MB", "GB", "TB", "PB")) -> str:
    """'512 bytes', '1.5 MB': powers of 1000, `units` from the smallest to the largest."""
    for unit in units:
        if n < 1000 or unit == units[-1]:
            return f"{int(n)} {unit}" if unit == units[0] else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, at most `limit` of them (module doc); `what` names the file in messages ('config.json')."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
        if size > limit:  # regular files: refused from their size alone, before any reading
            raise _too_large(path, what, size, limit)
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # a pipe or device reports no size: read one byte past the limit at most
    except FileNotFoundError:
        raise MissingFileError(what, path, "does not exist") from None
    except IsADirectoryError:
        raise FileContentError(what, path, "is a directory, not a file") from None
    except OSError as e:
        raise FileContentError(what, path, f"cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise _too_large(path, what, None, limit)
    return data


def _too_large(path: Path, what: str, size: int | None, limit: int) -> FileContentError:
    held = f"is {human_size(size)}" if size is not None else "holds more"
    return FileContentError(what, path, f"{held}, more than the {human_size(limit)} such a file can be: it is "
                                        f"damaged or not a {what}")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a float")
    return value


def parse_json(data: str | bytes, what: str, path: str | Path) -> Any:
    """Strict JSON (module doc) of the file `path`, already read; `what` names its kind in messages."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise FileContentError(what, path, f"is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                                           f"{e.start})") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise FileContentError(what, path, f"is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except ValueError as e:  # NaN / Infinity / 1e400, or an integer of more digits than Python converts
        raise FileContentError(what, path, f"is not valid JSON: {' '.join(str(e).split())[:120]}") from None
    except RecursionError:
        raise FileContentError(what, path, "nests lists or objects too deeply to read") from None
    if SURROGATE_ESCAPE.search(text):  # a pair of escapes is one character: only a lone one cannot be encoded
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise FileContentError(what, path, f"holds a string that is not Unicode text (a lone surrogate, "
                                               f"U+{ord(e.object[e.start]):04X}): it is damaged") from None
    return value


def read_json(path: str | Path, limit: int, what: str) -> Any:
    return parse_json(read_bounded(path, limit, what), what, path)

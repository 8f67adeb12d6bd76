"""Deterministic train/val splits, and cutting one long text into pieces that tokenize independently.

Why: a corpus larger than RAM has to be tokenized in pieces (and in parallel), yet the result should be
exactly what encoding the whole text at once would give, and the split must never depend on a seed, the
number of worker processes, or whether the corpus was streamed.

Splits
- One continuous text (tinyshakespeare, local text files): nanoGPT's split — the first
  `int(n_chars * (1 - val_fraction))` characters are train, the rest val; each side is encoded separately.
- Documents (hub datasets, parquet/json): document i is val exactly when floor((i+1)·f) > floor(i·f) for
  f = val_fraction as an exact fraction; with f = 0.1 that is documents 9, 19, 29, ... — one in ten,
  spread evenly through the corpus (so a corpus sorted by topic or date is split fairly), decidable for
  each document alone (so it works while streaming), and the same on every machine.

Safe cuts
BPE encoders first split text with a regex ("pre-tokens"); a cut inside a pre-token, or next to a
whitespace run, can change the tokens. A cut right after a line break that sits between a non-space
character and a letter or digit ("...end.\\nNext") is safe for the GPT-2, cl100k and o200k patterns: no
pre-token spans it and the pre-tokens on both sides are the same whether or not the text continues.
`group_rows` cuts only there, unless a piece grows past `max_chars` without one (text with no ordinary
line breaks), where it cuts at the next line anyway — there, and only there, a token or two may differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Iterator

import numpy as np

PIECE_CHARS = 1 << 18  # target size of one independently tokenized piece (characters)


def text_split_point(total_chars: int, val_fraction: float) -> int:
    """Characters [0, point) are train, [point, total) are val (nanoGPT's `int(n * 0.9)`)."""
    return int(total_chars * (1.0 - val_fraction))


def val_document_mask(indices: np.ndarray, val_fraction: float) -> np.ndarray:
    """(N,) bool: which of these document indices belong to val (see module docstring)."""
    frac = Fraction(val_fraction).limit_denominator(1_000_000)
    i = np.asarray(indices, dtype=np.int64)
    return (i + 1) * frac.numerator // frac.denominator > i * frac.numerator // frac.denominator


def val_document_count(n_docs: int, val_fraction: float) -> int:
    """How many of documents 0..n_docs-1 go to val."""
    frac = Fraction(val_fraction).limit_denominator(1_000_000)
    return n_docs * frac.numerator // frac.denominator


def is_safe_cut(before: str, after: str) -> bool:
    """Can the text be cut between row `before` (ending in a line break) and row `after`?"""
    return (len(before) >= 2 and before[-1] == "\n" and not before[-2].isspace()
            and bool(after) and after[0].isalnum())


@dataclass
class Piece:
    """Rows [start_row, stop_row) of a text, which begin at character `start_char` of the whole text."""

    start_row: int
    stop_row: int
    start_char: int
    text: str


def group_rows(rows: Iterable[str], target_chars: int = PIECE_CHARS, max_chars: int | None = None) -> Iterator[Piece]:
    """Consecutive rows joined into pieces of about `target_chars` characters, cut only at safe cuts."""
    max_chars = max_chars if max_chars is not None else 8 * target_chars
    buffer: list[str] = []
    buffered_chars = 0
    start_row = start_char = row_index = 0
    for row in rows:
        if buffer and buffered_chars >= target_chars and (buffered_chars >= max_chars or is_safe_cut(buffer[-1], row)):
            text = "".join(buffer)
            yield Piece(start_row, row_index, start_char, text)
            start_row, start_char = row_index, start_char + len(text)
            buffer, buffered_chars = [], 0
        buffer.append(row)
        buffered_chars += len(row)
        row_index += 1
    if buffer:
        yield Piece(start_row, row_index, start_char, "".join(buffer))


def split_piece(text: str, start_char: int, split_at: int) -> tuple[str, str]:
    """(train part, val part) of a piece that starts at `start_char`, for a split at character `split_at`."""
    cut = min(max(split_at - start_char, 0), len(text))
    return text[:cut], text[cut:]

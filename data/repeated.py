"""The repeated source: seeded random sequences of characters, each followed by its copy.

It is the data on which a 2-layer model grows an induction head: the second copy of every sequence can only
be predicted by looking back to where the current character occurred before and copying what followed it.

Why characters: the sequences are written as text and prepared like any corpus (data/prepare.py), so the
fingerprint, the loader, exact resume and sample.py prompts all work unchanged. With `tokenizer: char` every
character is one token: `alphabet_size` ordinary tokens plus the line break.

The text, one line per sequence:   s s \\n   (no spaces: the sequence, its copy, a line break)
  - the sequences' lengths are drawn uniformly from `sequence_length` [min, max] (one number: all equal);
  - their characters uniformly from the first `alphabet_size` characters of `alphabet()`: a-z, A-Z, 0-9,
    ASCII punctuation, then printable letters and symbols of the Basic Multilingual Plane;
  - everything from one numpy PCG64 generator seeded with `seed`: the same settings give the same text.
Why lengths that vary: with one fixed length L a single layer can copy by position alone (attend L - 1
tokens back), and does so first; that head scores 0 on a repeat of any other length. Lengths that vary leave
only the content-based route, the previous-token head of layer 0 feeding the induction head of layer 1.
The line break marks where a pair ends, as a start token would; its next character is not predictable.
"""
from __future__ import annotations

import string
import unicodedata
from functools import lru_cache
from itertools import islice

import numpy as np

MAX_ALPHABET_SIZE = 20_000  # characters available (the BMP holds more printable ones; ids stay uint16)
MAX_REPEATED_CHARS = 100_000_000  # the whole text is built in memory: num_sequences * (2 * max + 1) at most
SEPARATOR = "\n"
REPEATED_VERSION = 1  # of the text built from the settings: in the corpus identity (so in the fingerprint)


@lru_cache(maxsize=1)
def _all_characters() -> str:
    """ASCII letters, digits and punctuation first (typeable in a prompt), then the BMP's printable
    letters, numbers, punctuation and symbols (no spaces, controls, combining marks or surrogates)."""
    ascii_part = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation
    more = (ch for ch in map(chr, range(0xA1, 0x10000))
            if ch.isprintable() and not ch.isspace() and unicodedata.category(ch)[0] in "LNPS")
    return ascii_part + "".join(islice(more, MAX_ALPHABET_SIZE - len(ascii_part)))


def alphabet(size: int) -> str:
    """The first `size` characters of the repeated source's alphabet (1 <= size <= MAX_ALPHABET_SIZE)."""
    if not 1 <= size <= MAX_ALPHABET_SIZE:
        raise ValueError(f"alphabet size {size} is outside 1..{MAX_ALPHABET_SIZE}")
    return _all_characters()[:size]


def repeated_lines(alphabet_size: int, min_length: int, max_length: int, num_sequences: int, seed: int) -> list[str]:
    """The corpus as lines `s + s + "\\n"`, one per sequence (see the module docstring)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    lengths = rng.integers(min_length, max_length + 1, size=num_sequences)  # (num_sequences,)
    ids = rng.integers(0, alphabet_size, size=int(lengths.sum()))  # every sequence's characters, one after another
    code_points = np.array([ord(c) for c in alphabet(alphabet_size)], dtype="<u4")  # (alphabet_size,)
    text = code_points[ids].tobytes().decode("utf-32-le")  # every sequence once, back to back
    ends = np.cumsum(lengths).tolist()
    return [text[start:end] * 2 + SEPARATOR for start, end in zip([0, *ends[:-1]], ends)]

"""Tokenizers: characters of the corpus, or a tiktoken BPE encoding such as GPT-2's, behind one interface.

Why one small interface: the prepare step, the batch loader's consumers, sampling and the attention
heatmaps all need the same five things (encode, decode, vocabulary size, the document separator, a label
per token), and a checkpoint must carry its tokenizer so sampling rebuilds it exactly. Both tokenizers
serialise to a small JSON dict (`to_json`) and come back through `tokenizer_from_json`; nothing is pickled.

- `CharTokenizer`: the sorted set of characters seen in the corpus (as in nanoGPT's shakespeare_char).
  It has no document separator (`eot is None`); text with a character outside the vocabulary is refused
  with a `UserError` naming the characters (`unknown_chars` lists them without raising).
- `TiktokenTokenizer`: any tiktoken encoding name (`tiktoken.list_encoding_names()`; default "gpt2").
  `encode` treats special-token text such as "<|endoftext|>" as ordinary text, so a corpus cannot inject
  separators; `eot` is the encoding's `<|endoftext|>` id, which prepare puts after every document.

Ids outside the vocabulary (a model whose embedding is padded past `vocab_size` can sample them) decode
to U+FFFD rather than crashing a sampling run.
"""
from __future__ import annotations

import difflib
from typing import Any, Protocol

import numpy as np

from common.errors import UserError

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """What every tokenizer offers (structural: CharTokenizer and TiktokenTokenizer both match)."""

    name: str

    @property
    def vocab_size(self) -> int: ...
    @property
    def eot(self) -> int | None: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's own text, as is (axis labels are made from it by insight.heatmap.token_label);
        an id outside the vocabulary is shown as '<id>'."""
    def prompt_ids(self, text: str) -> list[int]: ...
    def to_json(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One id per distinct character of the corpus, in code-point order."""

    name = "char"

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer characters must be distinct")
        self.chars = "".join(sorted(chars))
        self._stoi = {ch: i for i, ch in enumerate(self.chars)}
        # (V,) code points, sorted, for the vectorised encoder
        self._code_points = np.array([ord(c) for c in self.chars], dtype=np.uint32)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def eot(self) -> int | None:
        return None

    def unknown_chars(self, text: str) -> list[str]:
        """The distinct characters of `text` that are not in the vocabulary, in order of appearance."""
        return list(dict.fromkeys(ch for ch in text if ch not in self._stoi))

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """Vectorised encode for long texts: (len(text),) uint32 ids."""
        if not text:
            return np.zeros(0, dtype=np.uint32)
        code_points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # (N,)
        ids = np.searchsorted(self._code_points, code_points).astype(np.uint32)  # (N,)
        np.minimum(ids, max(self.vocab_size - 1, 0), out=ids)
        if self.vocab_size == 0 or not np.array_equal(self._code_points[ids], code_points):
            missing = self.unknown_chars(text)
            shown = ", ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise UserError(f"text has {len(missing)} character(s) the char tokenizer does not know: {shown}; "
                            f"use only characters of the training corpus ({self.vocab_size} known)")
        return ids

    def decode(self, ids: list[int]) -> str:
        n = len(self.chars)
        return "".join(self.chars[i] if 0 <= i < n else REPLACEMENT_CHAR for i in map(int, ids))

    def token_strings(self, ids: list[int]) -> list[str]:
        n = len(self.chars)
        return [self.chars[i] if 0 <= i < n else f"<{i}>" for i in map(int, ids)]

    def prompt_ids(self, text: str) -> list[int]:
        """`encode(text)`, but never empty: an empty prompt starts from a newline (else id 0)."""
        if text:
            return self.encode(text)
        return [self._stoi.get("\n", 0)]

    def to_json(self) -> dict[str, Any]:
        return {"kind": "char", "chars": self.chars}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class TiktokenTokenizer:
    """A tiktoken byte-pair encoding (GPT-2's "gpt2" by default)."""

    def __init__(self, encoding_name: str = "gpt2") -> None:
        self.name = encoding_name
        self._enc = load_tiktoken_encoding(encoding_name)

    @property
    def vocab_size(self) -> int:
        return int(self._enc.n_vocab)

    @property
    def eot(self) -> int | None:
        return int(self._enc.eot_token)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(texts, num_threads=1)

    def _known(self, ids: list[int]) -> list[int | None]:
        n = self.vocab_size
        return [i if 0 <= i < n else None for i in map(int, ids)]

    def decode(self, ids: list[int]) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in self._known(ids):
            if i is None:
                out.append(self._enc.decode(run))
                out.append(REPLACEMENT_CHAR)
                run = []
            else:
                run.append(i)
        out.append(self._enc.decode(run))
        return "".join(out)

    def token_strings(self, ids: list[int]) -> list[str]:
        labels = []
        for raw, i in zip(ids, self._known(ids)):
            if i is None:
                labels.append(f"<{int(raw)}>")
                continue
            piece = self._enc.decode_single_token_bytes(i)
            # a token may hold part of a multi-byte character: those bytes become the text \xNN
            labels.append(piece.decode("utf-8", errors="backslashreplace"))
        return labels

    def prompt_ids(self, text: str) -> list[int]:
        """`encode(text)`, but never empty: an empty prompt starts from <|endoftext|> (a fresh document)."""
        ids = self.encode(text)
        return ids if ids else [self._enc.eot_token]

    def to_json(self) -> dict[str, Any]:
        return {"kind": "tiktoken", "encoding": self.name, "vocab_size": self.vocab_size}

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def check_tokenizer_name(name: str) -> None:
    """Raise ValueError unless `name` is "char" or a tiktoken encoding name (no download needed)."""
    import tiktoken

    known = tiktoken.list_encoding_names()
    if name != "char" and name not in known:
        choices = ["char", *known]
        match = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
        hint = f" (did you mean '{match[0]}'?)" if match else ""
        raise ValueError(f"tokenizer '{name}' is unknown{hint}: use 'char' or a tiktoken encoding "
                         f"({', '.join(known)})")


def load_tiktoken_encoding(name: str) -> Any:
    """tiktoken.get_encoding with its two failures told apart: an unknown name vs a vocabulary it cannot fetch."""
    import tiktoken

    try:
        check_tokenizer_name(name)
    except ValueError as e:
        raise UserError(str(e)) from None
    if name == "char":
        raise UserError("'char' is not a tiktoken encoding: build a CharTokenizer from the corpus instead")
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # requests/urllib errors offline, ValueError on a corrupt cached file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if len(reason) > 160:
            reason = reason[:157] + "..."
        raise UserError(f"cannot load tiktoken encoding '{name}': its vocabulary file is not cached and could "
                        f"not be downloaded ({type(e).__name__}: {reason}); connect to the internet once, or set "
                        f"TIKTOKEN_CACHE_DIR to a folder that holds it") from None


PREPARE_AGAIN = "re-create it with `python -m data.prepare`"


def tokenizer_from_json(spec: Any, remedy: str = PREPARE_AGAIN) -> CharTokenizer | TiktokenTokenizer:
    """Rebuild exactly the tokenizer `to_json` described (from meta.json or a checkpoint's config).
    A broken description is a UserError ending in `remedy`: what fixes it depends on where it was read."""
    if not isinstance(spec, dict) or spec.get("kind") not in ("char", "tiktoken"):
        raise UserError(f"tokenizer description {str(spec)[:80]!r} is not valid: expected a mapping with "
                        f"kind 'char' or 'tiktoken'; {remedy}")
    if spec["kind"] == "char":
        chars = spec.get("chars")
        if not isinstance(chars, str) or len(set(chars)) != len(chars):
            raise UserError("char tokenizer description is corrupt ('chars' must be a string of distinct "
                            f"characters); {remedy}")
        return CharTokenizer(chars)
    name = spec.get("encoding")
    if not isinstance(name, str):
        raise UserError(f"tiktoken tokenizer description has no 'encoding' name; {remedy}")
    tok = TiktokenTokenizer(name)
    expected = spec.get("vocab_size")
    if expected is not None and expected != tok.vocab_size:
        raise UserError(f"tiktoken encoding '{name}' now has {tok.vocab_size} tokens but the data/checkpoint was "
                        f"made with {expected}; install the tiktoken version it was made with")
    return tok


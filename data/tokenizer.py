"""Tokenizers: characters of the corpus, or a tiktoken BPE encoding such as GPT-2's, behind one interface.

Why one small interface (`Tokenizer`): the prepare step, the batch loader's consumers, sampling and the
attention heatmaps all need the same things (encode, decode, vocabulary size, the document separator, a
label per token), and a checkpoint must carry its tokenizer so sampling rebuilds it exactly. All three
serialise to a small JSON dict (`to_json`) and come back through `tokenizer_from_json` (at the end of
this module); nothing is pickled.

- `CharTokenizer`: the sorted set of characters seen in the corpus (as in nanoGPT's shakespeare_char).
  It has no document separator (`eot is None`); text with a character outside the vocabulary is refused
  with a `UserError` naming the characters (`unknown_chars` lists them without raising).
- `TiktokenTokenizer`: any tiktoken encoding name (`tiktoken.list_encoding_names()`; default "gpt2").
  `encode` treats special-token text such as "<|endoftext|>" as ordinary text, so a corpus cannot inject
  separators; `eot` is the encoding's `<|endoftext|>` id, which prepare puts after every document.
- `HFTokenizer`: a Hugging Face `tokenizer.json` read by the `tokenizers` library (Llama-family checkpoints
  ship one). `encode` also treats special-token text as text; `eot` is the checkpoint's end-of-sequence id;
  `prompt_ids` applies the tokenizer's own template (Llama's adds the <s> it was trained with). A
  tokenizer.json is 2-9 MB, so it is not embedded in JSON: it is stored as a file beside the JSON that
  describes it (`tokenizer.json` next to a checkpoint's config.json or a prepared folder's meta.json),
  and the description records its sha256, checked when it is read (`stored_tokenizer`,
  `tokenizer_from_json(spec, base_dir=...)`).

Ids outside the vocabulary (a model whose embedding is padded past `vocab_size` can sample them) decode
to U+FFFD rather than crashing a sampling run.

Probing a model with random text (insight/roles.py) needs the ids text is made of (`ordinary_ids()`: never
a special token, an unassigned id or a padded embedding's extra id) and a start the way training data opens
a sequence (`start_id`: BOS first, as a Llama model is trained with <s> first; else end-of-text; else a char
prompt's newline).
"""
from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from common.errors import UserError
from common.json_file import FileContentError, read_bounded
from data.tokenizer_files import TOKENIZER_FILE_BYTES, check_tokenizer_json

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """What every tokenizer offers (structural: CharTokenizer, TiktokenTokenizer and HFTokenizer match)."""

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
    def ordinary_ids(self) -> np.ndarray: ...
    @property
    def start_id(self) -> int: ...
    def to_json(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One id per distinct character of the corpus, in code-point order."""

    name = "char"
    eot: int | None = None  # no document separator

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer characters must be distinct")
        self.chars = "".join(sorted(chars))
        self.vocab_size = len(self.chars)
        self._stoi = {ch: i for i, ch in enumerate(self.chars)}
        # (V,) code points, sorted, for the vectorised encoder
        self._code_points = np.array([ord(c) for c in self.chars], dtype=np.uint32)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(set(text)))

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
        return "".join(self.chars[i] if 0 <= i < self.vocab_size else REPLACEMENT_CHAR for i in map(int, ids))

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.chars[i] if 0 <= i < self.vocab_size else f"<{i}>" for i in map(int, ids)]

    def prompt_ids(self, text: str) -> list[int]:
        """`encode(text)`, but never empty: an empty prompt starts from a newline (else id 0)."""
        return self.encode(text) if text else [self.start_id]

    def ordinary_ids(self) -> np.ndarray:
        """Every id, (vocab_size,) int64: a char vocabulary has no special tokens."""
        return np.arange(self.vocab_size, dtype=np.int64)

    @property
    def start_id(self) -> int:
        """The newline, where a char prompt starts (module doc); id 0 for a corpus without one."""
        return self._stoi.get("\n", 0)

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

    def decode(self, ids: list[int]) -> str:
        return _decode_runs(ids, self.vocab_size, self._enc.decode)

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes token i stands for (decode's text is those of its ids, end to end, read as UTF-8); None for
        an id outside the vocabulary, which decode reads as U+FFFD."""
        if not 0 <= i < self.vocab_size:
            return None
        try:
            return self._enc.decode_single_token_bytes(i)
        except KeyError:  # an id inside the range that the encoding does not assign
            return None

    def token_strings(self, ids: list[int]) -> list[str]:
        # a token may hold part of a multi-byte character: those bytes become the text \xNN
        return [self._enc.decode_single_token_bytes(i).decode("utf-8", errors="backslashreplace")
                if 0 <= i < self.vocab_size else f"<{i}>" for i in map(int, ids)]

    def prompt_ids(self, text: str) -> list[int]:
        """`encode(text)`, but never empty: an empty prompt starts from <|endoftext|> (a fresh document)."""
        ids = self.encode(text)
        return ids if ids else [self._enc.eot_token]

    def ordinary_ids(self) -> np.ndarray:
        """Ids of the encoding's byte-pair tokens, int64 ascending: special tokens and unassigned ids
        (cl100k_base has gaps between its specials) left out; GPT-2's are 0..50255."""
        if getattr(self, "_ordinary", None) is None:
            special = {self._enc.encode_single_token(t) for t in self._enc.special_tokens_set}
            self._ordinary = np.array([i for i in range(self.vocab_size)
                                       if i not in special and _tiktoken_assigned(self._enc, i)], dtype=np.int64)
        return self._ordinary.copy()  # the cache stays as it is whatever the caller does with the array

    @property
    def start_id(self) -> int:
        """<|endoftext|>, which starts every document of prepared data."""
        return int(self._enc.eot_token)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "tiktoken", "encoding": self.name, "vocab_size": self.vocab_size}

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def _decode_runs(ids: list[int], vocab_size: int, decode: Any) -> str:
    """`decode` applied to each run of ids inside the vocabulary; every id outside it reads U+FFFD."""
    out: list[str] = []
    run: list[int] = []
    for i in map(int, ids):
        if 0 <= i < vocab_size:
            run.append(i)
            continue
        out += [decode(run), REPLACEMENT_CHAR]
        run = []
    return "".join(out) + decode(run)


def _tiktoken_assigned(enc: Any, i: int) -> bool:
    try:
        enc.decode_single_token_bytes(i)
        return True
    except KeyError:
        return False


def check_tokenizer_name(name: str) -> None:
    """Raise ValueError unless `name` is "char" or a tiktoken encoding name (no download needed)."""
    import tiktoken

    known = tiktoken.list_encoding_names()
    if name != "char" and name not in known:
        match = difflib.get_close_matches(name, ["char", *known], n=1, cutoff=0.5)
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
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise UserError(f"cannot load tiktoken encoding '{name}': its vocabulary file is not cached and could "
                        f"not be downloaded ({type(e).__name__}: {reason}); connect to the internet once, or set "
                        f"TIKTOKEN_CACHE_DIR to a folder that holds it") from None


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map: byte-level BPE vocabularies spell every byte as one of
    these (a space is 'Ġ'), so that tokens are valid JSON strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]  # spelt from U+0100 on, in byte order
    chars = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}
    return dict(sorted(chars.items()))


HF_EXTRA = "pip install -e '.[hf]'"
HF_FILE = "tokenizer.json"  # the sidecar file name of an HFTokenizer stored beside a JSON description


class HFTokenizer:
    """A Hugging Face tokenizer.json, through the `tokenizers` library (module doc)."""

    def __init__(self, data: bytes, eot: int | None = None, bos: int | None = None, name: str = "hf",
                 path: Path | None = None) -> None:
        try:
            import tokenizers
        except ImportError:
            raise UserError(f"this model's tokenizer is a Hugging Face tokenizer.json, which needs the tokenizers "
                            f"package: {HF_EXTRA}") from None
        payload = check_tokenizer_json(data, path)  # JSON of the structure read below, before the library sees it
        try:
            self._tk = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # unknown components, fields the library wants and the check leaves to it
            raise UserError(f"tokenizer.json{f' at {path}' if path else ''} cannot be read by the tokenizers "
                            f"library ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
        self._tk.encode_special_tokens = True  # "<s>" in a text is text, as tiktoken's encode_ordinary
        self.data, self.sha256 = data, hashlib.sha256(data).hexdigest()
        self.name, self.path = name, path
        self.vocab_size = max(self._tk.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        for which, value in (("eot", eot), ("bos", bos)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise UserError(f"{which} id {value} is outside the tokenizer's {self.vocab_size} tokens")
        self.eot, self.bos = eot, bos
        self._special = {t.content for t in self._tk.get_added_tokens_decoder().values() if t.special}
        byte_level = '"ByteLevel"' in json.dumps(payload.get("decoder"))
        self._bytes = {c: b for b, c in byte_level_alphabet().items()} if byte_level else None

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Text of ids, special tokens (<s>, </s>) left out; an id outside the vocabulary reads U+FFFD."""
        return _decode_runs(ids, self.vocab_size, self._tk.decode)

    def token_strings(self, ids: list[int]) -> list[str]:
        pieces = [(i, self._tk.id_to_token(i) if 0 <= i < self.vocab_size else None) for i in map(int, ids)]
        return [f"<{i}>" if piece is None else self._piece_text(piece) for i, piece in pieces]

    def _piece_text(self, piece: str) -> str:
        """A vocabulary entry as the text it stands for: byte-level 'Ġit' -> ' it', metaspace '▁it' -> ' it',
        byte fallback '<0x0A>' -> '\n'; special tokens ('<s>') as they are."""
        if piece in self._special:
            return piece
        if self._bytes is not None and all(c in self._bytes for c in piece):
            return bytes(self._bytes[c] for c in piece).decode("utf-8", errors="backslashreplace")
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)]).decode("utf-8", errors="backslashreplace")
        return piece.replace("\u2581", " ")

    def prompt_ids(self, text: str) -> list[int]:
        """The tokenizer's own template applied (Llama: <s> first); never empty."""
        ids = self._tk.encode(text, add_special_tokens=True).ids
        if ids:
            return ids
        fallback = self.bos if self.bos is not None else self.eot
        return [fallback if fallback is not None else 0]

    def ordinary_ids(self) -> np.ndarray:
        """Ids of the vocabulary's tokens but the special ones (<s>, </s>, <unk>, ...), int64 ascending."""
        special = {i for i, t in self._tk.get_added_tokens_decoder().items() if t.special}
        return np.array([i for i in range(self.vocab_size)
                         if i not in special and self._tk.id_to_token(i) is not None], dtype=np.int64)

    @property
    def start_id(self) -> int:
        """The beginning-of-sequence id, else the end-of-sequence id, else the first ordinary id."""
        for candidate in (self.bos, self.eot):
            if candidate is not None:
                return candidate
        return int(self.ordinary_ids()[0])

    def to_json(self) -> dict[str, Any]:
        """In memory: names the file it was read from (stored_tokenizer gives the description to write)."""
        return {"kind": "hf", "name": self.name, "file": str(self.path.resolve()) if self.path else HF_FILE,
                "sha256": self.sha256, "vocab_size": self.vocab_size, "eot": self.eot, "bos": self.bos}

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size})"


# --- a tokenizer as JSON and back: the description in meta.json or config.json, and the files beside it ----

PREPARE_AGAIN = "re-create it with `python -m data.prepare`"


def tokenizer_from_json(spec: Any, remedy: str = PREPARE_AGAIN,
                        base_dir: str | Path | None = None) -> CharTokenizer | TiktokenTokenizer | HFTokenizer:
    """Rebuild exactly the tokenizer `to_json` described (from meta.json or a checkpoint's config); an "hf"
    description's file is read from `base_dir` (the folder of that JSON) unless it is an absolute path.
    A broken description is a UserError ending in `remedy`: what fixes it depends on where it was read."""
    if not isinstance(spec, dict) or spec.get("kind") not in ("char", "tiktoken", "hf"):
        raise UserError(f"tokenizer description {str(spec)[:80]!r} is not valid: expected a mapping with "
                        f"kind 'char', 'tiktoken' or 'hf'; {remedy}")
    if spec["kind"] == "hf":
        return _hf_from_json(spec, remedy, base_dir)
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


def _hf_from_json(spec: dict[str, Any], remedy: str, base_dir: str | Path | None) -> HFTokenizer:
    file, digest = spec.get("file"), spec.get("sha256")
    if not isinstance(file, str) or not isinstance(digest, str):
        raise UserError(f"hf tokenizer description has no 'file' and 'sha256'; {remedy}")
    path = Path(base_dir) / file if base_dir is not None else Path(file)
    try:
        data = read_bounded(path, TOKENIZER_FILE_BYTES, "tokenizer.json")
    except FileContentError as e:
        raise UserError(f"cannot read the tokenizer file '{path}' (it {e.problem}); {remedy}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise UserError(f"the tokenizer file '{path}' is not the one its description records (sha256 differs); "
                        f"{remedy}")
    ids = [spec.get("eot"), spec.get("bos")]
    if any(i is not None and (not isinstance(i, int) or isinstance(i, bool) or i < 0) for i in ids):
        raise UserError(f"hf tokenizer description has invalid eot/bos ids {ids}; {remedy}")
    return HFTokenizer(data, eot=ids[0], bos=ids[1], name=str(spec.get("name") or "hf"), path=path)


def stored_tokenizer(tok: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(JSON description, files to store beside it) for writing `tok` into a folder: an HFTokenizer's
    tokenizer.json becomes a sidecar file named in its description; the others are JSON only."""
    if isinstance(tok, HFTokenizer):
        return {**tok.to_json(), "file": HF_FILE}, {HF_FILE: tok.data}
    return tok.to_json(), {}

"""Hugging Face tokenizer files read as untrusted input: each bounded in size before it is read
(common/json_file.py), parsed strictly, and checked for the structure attngpt relies on (common/schema.py)
before anything uses it. A damaged file is one line naming it and the key, never a traceback:

    tokenizer.json           an object; `model` an object whose `vocab` maps token -> id (BPE, WordPiece,
                             WordLevel) or lists [piece, score] pairs (Unigram), `merges` "a b" strings or
                             [a, b] pairs; `added_tokens` objects with an id and a content
    vocab.json               an object of token -> id
    merges.txt               UTF-8 lines "a b" (after an optional "#version" line)
    tokenizer_config.json    an object; eos_token / bos_token a string, {"content": string, ...} or null
    generation_config.json   an object; eos_token_id / bos_token_id an id, a list of ids, or null
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from common.json_file import FileContentError, parse_json, read_bounded, read_json
from common.schema import AnyOf, Bool, DictOf, Fields, Float, Int, ListOf, Nullable, Str, check

# tokenizer.json is 1.4 MB (GPT-2) to 9 MB (Llama 3) and 17 MB (Gemma); vocab.json 1 MB, merges.txt 0.5 MB
TOKENIZER_FILE_BYTES = 64_000_000
SMALL_FILE_BYTES = 4_000_000  # tokenizer_config.json and generation_config.json: a few kB (a chat template more)

DAMAGED = "the file is damaged: fetch the model's tokenizer files again"
TOKEN_ID = Int(0, 2**32 - 1)  # the tokenizers library keeps ids as u32
TOKEN_IDS = Nullable(AnyOf(Int(0), ListOf(Int(0))))
COMPONENT = Nullable(Fields({}))  # normalizer, pre_tokenizer, post_processor, decoder: objects the library reads
TOKENIZER_JSON = Fields({
    "model": Fields({
        "type": Nullable(Str()),
        "vocab": AnyOf(DictOf(TOKEN_ID), ListOf(ListOf(AnyOf(Str(), Float()), length=2))),
        "merges": Nullable(ListOf(AnyOf(Str(), ListOf(Str(), length=2)))),
    }, required=("vocab",)),
    "added_tokens": Nullable(ListOf(Fields({"id": TOKEN_ID, "content": Str(), "special": Bool()},
                                           required=("id", "content")))),
    "normalizer": COMPONENT, "pre_tokenizer": COMPONENT, "post_processor": COMPONENT, "decoder": COMPONENT,
}, required=("model",))
VOCAB_JSON = DictOf(TOKEN_ID)
SPECIAL_TOKEN = Nullable(AnyOf(Str(), Fields({"content": Str()}, required=("content",))))
TOKENIZER_CONFIG = Fields({"eos_token": SPECIAL_TOKEN, "bos_token": SPECIAL_TOKEN})
GENERATION_CONFIG = Fields({"eos_token_id": TOKEN_IDS, "bos_token_id": TOKEN_IDS})
CHECKED_FILES = {"vocab.json": (TOKENIZER_FILE_BYTES, VOCAB_JSON),
                 "tokenizer_config.json": (SMALL_FILE_BYTES, TOKENIZER_CONFIG),
                 "generation_config.json": (SMALL_FILE_BYTES, GENERATION_CONFIG)}  # read_checked's limit, schema


def check_tokenizer_json(data: bytes, path: Path | None) -> dict[str, Any]:
    """tokenizer.json's bytes (already read, bounded) parsed and checked; `path` names it in messages."""
    where = path or "(in memory)"
    payload = parse_json(data, "tokenizer.json", where)
    check(payload, TOKENIZER_JSON, f"tokenizer.json '{where}'", DAMAGED)
    return payload


def read_tokenizer_json(path: Path) -> dict[str, Any]:
    """The file's checked payload."""
    return check_tokenizer_json(read_bounded(path, TOKENIZER_FILE_BYTES, "tokenizer.json"), path)


def read_checked(path: Path) -> dict[str, Any]:
    """vocab.json, tokenizer_config.json or generation_config.json (known by its name) read and checked; {} when
    there is no such file."""
    if not path.is_file():
        return {}
    limit, schema = CHECKED_FILES[path.name]
    payload = read_json(path, limit, path.name)
    check(payload, schema, f"{path.name} '{path}'", DAMAGED)
    return payload


def read_merges_txt(path: Path) -> tuple[str, ...]:
    """The merges of merges.txt, in priority order, each "a b"."""
    data = read_bounded(path, TOKENIZER_FILE_BYTES, "merges.txt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileContentError("merges.txt", path, f"is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                                                   f"{e.start})") from None
    merges = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            shown = line if len(line) <= 40 else line[:37] + "..."
            raise FileContentError("merges.txt", path, f"line {number} is {shown!r}, expected two tokens joined by "
                                                       f"one space")
        merges.append(line)
    return tuple(merges)


def merges_of(payload: dict[str, Any]) -> tuple[str, ...] | None:
    """A checked tokenizer.json's merges as "a b" strings (None when its model has none)."""
    merges = payload["model"].get("merges")
    return None if merges is None else tuple(m if isinstance(m, str) else " ".join(m) for m in merges)

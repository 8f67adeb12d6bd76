"""A tokenizer as JSON and back: the description a prepared folder's meta.json or a checkpoint's config.json
holds (each tokenizer's `to_json`), and the files stored beside it (data/tokenizer.py's module doc).

    stored_tokenizer(tok)                    -> (description, {file name: bytes}) to write into a folder
    tokenizer_from_json(spec, remedy, base_dir) -> the tokenizer, rebuilt exactly, or one UserError line
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.json_file import FileContentError, read_bounded
from data.tokenizer import HF_FILE, CharTokenizer, HFTokenizer, TiktokenTokenizer
from data.tokenizer_files import TOKENIZER_FILE_BYTES

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

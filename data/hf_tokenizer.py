"""Tokenizers across the Hugging Face boundary.

Reading (`tokenizer_for_hf_folder`): a folder attngpt exported with its own tokenizer file (a char vocabulary
or a non-GPT-2 tiktoken encoding, below) reads that file back (before, and whatever, its tokenizer.json). A GPT-2 checkpoint whose vocabulary and merges
are GPT-2's (checked entry by entry against tiktoken's, whichever of tokenizer.json / vocab.json + merges.txt
it ships) uses attngpt's tiktoken "gpt2" encoding: the same ids and the fast encoder. Any other checkpoint
uses its own tokenizer.json through the `tokenizers` library (HFTokenizer), with its end-of-sequence and
beginning-of-sequence ids taken from tokenizer_config.json, else config.json / generation_config.json (every
file bounded in size and checked for its structure before it is used: data/tokenizer_files.py).

Writing (`hf_tokenizer_files`), beside an exported model:
    tiktoken gpt2       vocab.json + merges.txt (rebuilt from tiktoken's ranks: identical to GPT-2's own
                        files) + tokenizer_config.json: transformers' AutoTokenizer loads them
    HFTokenizer         its tokenizer.json + tokenizer_config.json
    char vocabulary     attngpt_char_vocab.json (what attngpt reads back) + tokenizer.json (a WordLevel model,
                        one token per character, `char_tokenizer_json`) + tokenizer_config.json: AutoTokenizer
                        loads them as a PreTrainedTokenizerFast with attngpt's ids
    other tiktoken      attngpt_tokenizer.json naming the encoding (its pre-tokenizer differs from GPT-2's)
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.json_file import read_bounded, read_json
from common.schema import Fields, Int, Str, check, is_int
from data.tokenizer import CharTokenizer, HFTokenizer, TiktokenTokenizer, byte_level_alphabet, tokenizer_from_json
from data.tokenizer_files import (SMALL_FILE_BYTES, TOKENIZER_FILE_BYTES, merges_of, read_checked, read_merges_txt,
                                  read_tokenizer_json)

GPT2_ENCODINGS = ("gpt2", "r50k_base")  # the same ranks and pre-tokenizer
EOT_TEXT = "<|endoftext|>"
CHAR_VOCAB_FILE = "attngpt_char_vocab.json"
TIKTOKEN_FILE = "attngpt_tokenizer.json"
EXPORT_AGAIN = "export the model again with convert.py to-hf"
CHAR_VOCAB_JSON = Fields({"kind": Str(("char",)), "chars": Str()}, required=("kind", "chars"))
TIKTOKEN_JSON = Fields({"kind": Str(("tiktoken",)), "encoding": Str(), "vocab_size": Int(1)},
                       required=("kind", "encoding"))


@functools.lru_cache(maxsize=1)
def gpt2_vocab() -> dict[str, int]:
    """tiktoken's GPT-2 ranks as a byte-level vocab.json: {'Ġthe': 262, ..., '<|endoftext|>': 50256}."""
    enc = TiktokenTokenizer("gpt2")._enc
    alphabet = byte_level_alphabet()
    vocab = {"".join(alphabet[b] for b in enc.decode_single_token_bytes(i)): i
             for i in range(enc.n_vocab) if i != enc.eot_token}
    vocab[EOT_TEXT] = enc.eot_token
    return vocab


@functools.lru_cache(maxsize=1)
def gpt2_merges() -> tuple[str, ...]:
    """GPT-2's merges, in priority order, recovered from the ranks: each multi-byte token is the merge of the
    two parts that byte-pair encoding with only the lower-ranked merges leaves it in."""
    ranks = {token: rank for token, rank in gpt2_vocab().items() if token != EOT_TEXT}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        splits = [k for k in range(1, len(token)) if ranks.get(token[:k], rank) < rank > ranks.get(token[k:], rank)]
        if len(splits) != 1:  # several candidates: replay the encoding to see which one it reaches
            parts = _bpe(token, ranks, rank)
            splits = [len(parts[0])] if len(parts) == 2 else []
        if not splits:
            raise RuntimeError(f"GPT-2 token {token!r} is not one merge of lower-ranked tokens")
        merges.append(f"{token[:splits[0]]} {token[splits[0]:]}")
    return tuple(merges)


def _bpe(token: str, ranks: dict[str, int], below: int) -> list[str]:
    """Byte-pair encode `token` with only the merges ranked below `below` (lowest rank first, as GPT-2)."""
    parts = list(token)
    while len(parts) > 1:
        best, i = min((ranks.get(a + b, below), i) for i, (a, b) in enumerate(zip(parts, parts[1:])))
        if best >= below:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


# --- reading --------------------------------------------------------------------------------------------------

def _folder_bpe(folder: Path) -> tuple[dict[str, int], tuple[str, ...] | None] | None:
    """The folder's (token -> id map, merges) if it ships a tokenizer: tokenizer.json's model vocab + added
    tokens and its merges, else vocab.json and merges.txt (None where absent); None without either file."""
    if (folder / "tokenizer.json").is_file():
        spec = read_tokenizer_json(folder / "tokenizer.json")
        vocab = dict(spec["model"]["vocab"]) if isinstance(spec["model"]["vocab"], dict) else {}
        for added in spec.get("added_tokens") or []:
            vocab[added["content"]] = added["id"]
        return vocab, merges_of(spec)
    if (folder / "vocab.json").is_file():
        merges = read_merges_txt(folder / "merges.txt") if (folder / "merges.txt").is_file() else None
        return read_checked(folder / "vocab.json"), merges
    return None


def _token_id(entry: Any, tok: HFTokenizer) -> int | None:
    content = entry.get("content") if isinstance(entry, dict) else entry
    return tok._tk.token_to_id(content) if isinstance(content, str) else None


def _config_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if is_int(value) else None


def special_ids(folder: Path, hf_config: dict[str, Any], tok: HFTokenizer) -> tuple[int | None, int | None]:
    """(eos, bos) ids of the checkpoint in `folder`."""
    tcfg = read_checked(folder / "tokenizer_config.json")
    eos, bos = _token_id(tcfg.get("eos_token"), tok), _token_id(tcfg.get("bos_token"), tok)
    for source in (hf_config, read_checked(folder / "generation_config.json")):
        eos = eos if eos is not None else _config_id(source.get("eos_token_id"))
        bos = bos if bos is not None else _config_id(source.get("bos_token_id"))
    valid = range(tok.vocab_size)
    return (eos if eos in valid else None), (bos if bos in valid else None)


def tokenizer_for_hf_folder(folder: Path, hf_config: dict[str, Any], kind: str, name: str):
    """The attngpt tokenizer of the Hugging Face checkpoint in `folder` (module doc). kind: 'gpt2' | 'llama' |
    'mistral' (the architecture); name: how to call it (the hub id or folder)."""
    own = attngpt_tokenizer(folder, hf_config)
    if own is not None:
        return own
    not_gpt2 = ""
    if kind == "gpt2":
        bpe = _folder_bpe(folder)
        if bpe is None:
            if hf_config.get("vocab_size", 0) >= len(gpt2_vocab()):
                return TiktokenTokenizer("gpt2")  # no tokenizer files: GPT-2's own, as the architecture implies
            raise UserError(f"'{folder}' has no tokenizer files (tokenizer.json or vocab.json) and a vocabulary "
                            f"of {hf_config.get('vocab_size')} tokens, not GPT-2's: add its tokenizer.json")
        vocab, merges = bpe
        if vocab == gpt2_vocab() and merges in (None, gpt2_merges()):
            return TiktokenTokenizer("gpt2")
        not_gpt2 = " (its vocab.json / merges.txt are not GPT-2's, the only ones attngpt reads without it)"
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"no tokenizer.json in '{folder}'{not_gpt2}: attngpt reads this model's tokenizer from "
                        f"tokenizer.json (save it with transformers' tokenizer.save_pretrained)")
    tok = HFTokenizer(read_bounded(path, TOKENIZER_FILE_BYTES, "tokenizer.json"), name=name, path=path)  # checks it
    eos, bos = special_ids(folder, hf_config, tok)
    return HFTokenizer(tok.data, eot=eos, bos=bos, name=name, path=path)


def attngpt_tokenizer(folder: Path, hf_config: dict[str, Any]) -> CharTokenizer | TiktokenTokenizer | None:
    """The tokenizer an attngpt export wrote where Hugging Face has no equivalent (CHAR_VOCAB_FILE,
    TIKTOKEN_FILE: hf_tokenizer_files), or None when the folder holds neither. Bounded, checked for its
    structure, and refused when it names more tokens than the model's embedding has rows."""
    for name, schema in ((CHAR_VOCAB_FILE, CHAR_VOCAB_JSON), (TIKTOKEN_FILE, TIKTOKEN_JSON)):
        path = folder / name
        if not path.is_file():
            continue
        payload = read_json(path, SMALL_FILE_BYTES, name)
        check(payload, schema, f"{name} '{path}'", EXPORT_AGAIN)
        tok = tokenizer_from_json(payload, remedy=f"'{path}' is damaged: {EXPORT_AGAIN}")
        rows = hf_config.get("vocab_size")
        if isinstance(rows, int) and tok.vocab_size > rows:
            raise UserError(f"{name} '{path}' has {tok.vocab_size} tokens but the model's vocab_size is {rows}: "
                            f"the two files are not from one export; {EXPORT_AGAIN}")
        return tok
    return None


# --- writing --------------------------------------------------------------------------------------------------

def hf_tokenizer_files(tok: Any, block_size: int) -> tuple[dict[str, Any], dict[str, bytes], int | None, int | None]:
    """(JSON files, raw files, bos id, eos id) that represent `tok` beside an exported model (module doc)."""
    if isinstance(tok, TiktokenTokenizer) and tok.name in GPT2_ENCODINGS:
        special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "model_max_length": block_size,
                  **special}
        merges = "#version: 0.2\n" + "\n".join(gpt2_merges()) + "\n"
        files = {"vocab.json": gpt2_vocab(), "tokenizer_config.json": config, "special_tokens_map.json": special}
        return files, {"merges.txt": merges.encode("utf-8")}, tok.eot, tok.eot
    if isinstance(tok, HFTokenizer):
        config: dict[str, Any] = {"model_max_length": block_size}
        for key, token_id in (("bos_token", tok.bos), ("eos_token", tok.eot)):
            if token_id is not None:
                config[key] = tok._tk.id_to_token(token_id)
        return {"tokenizer_config.json": config}, {"tokenizer.json": tok.data}, tok.bos, tok.eot
    if isinstance(tok, CharTokenizer):
        doc = {"kind": "char", "chars": tok.chars,
               "about": "attngpt character vocabulary: token id i is the character chars[i] (characters in "
                        "code-point order; no special tokens): encode with [chars.index(c) for c in text], "
                        "decode with ''.join(chars[i] for i in ids). tokenizer.json is the same vocabulary "
                        "for Hugging Face's tokenizers (AutoTokenizer)."}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
                  "clean_up_tokenization_spaces": False}  # decode gives back the text, spaces before "." kept
        return ({CHAR_VOCAB_FILE: doc, "tokenizer.json": char_tokenizer_json(tok), "tokenizer_config.json": config},
                {}, None, None)
    doc = {**tok.to_json(), "about": f"attngpt tiktoken tokenizer: tiktoken.get_encoding({tok.name!r}), ids as it "
                                     f"gives them (encode_ordinary; <|endoftext|> = {tok.eot} ends documents). "
                                     f"Not written as Hugging Face files: its pre-tokenizer is not GPT-2's."}
    return {TIKTOKEN_FILE: doc}, {}, tok.eot, tok.eot


def char_tokenizer_json(tok: CharTokenizer) -> dict[str, Any]:
    """tokenizer.json (the `tokenizers` library's documented serialization) giving `tok`'s ids: no normalizer,
    a pre-tokenizer that isolates every character ([\\s\\S]: any character, newlines included, where "."
    would skip them), a WordLevel model over the characters, no special tokens or post-processor, and a Fuse
    decoder (tokens joined with no separator; without a decoder they would be joined with spaces). A character
    outside the vocabulary maps to "[UNK]", which is not in it: encoding such text fails, as CharTokenizer's does.
    Written as plain JSON, not with the tokenizers package, so that exporting needs nothing beyond transformers'
    model classes (tests/pretrained/hf/test_export_char_tokenizer.py loads it with tokenizers and transformers)."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated",
                              "invert": False},
            "post_processor": None, "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": {ch: i for i, ch in enumerate(tok.chars)}, "unk_token": "[UNK]"}}

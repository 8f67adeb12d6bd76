"""data/tokenizer_files.py, a Hugging Face folder's tokenizer files read as untrusted input (hypothesis): one of
tokenizer.json (its model, vocab, merges, added tokens or decoder), vocab.json or merges.txt (a GPT-2 folder without
tokenizer.json), tokenizer_config.json or generation_config.json damaged, in a tiny GPT-2 or Llama folder read as
sample.py reads it, ends in a model that runs or in one UserError line naming the folder, never another exception.
The folders and the damage: tests/pretrained/test_load_fuzz_folders.py."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from tests.pretrained.test_load_fuzz_folders import (FUZZ, TOKENIZER, TOKENIZER_CONFIG, WORDS,  # noqa: E402
                                                     damaged_json, dumps, hf_folder, json_values,
                                                     runs_or_is_refused_in_one_line)


@st.composite
def damaged_tokenizer_files(draw) -> dict[str, str | bytes | int | None]:
    """One tokenizer file damaged (tokenizer.json, or vocab.json / merges.txt with tokenizer.json gone, or
    tokenizer_config.json / generation_config.json)."""
    name = draw(st.sampled_from(["tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                                 "generation_config.json"]))
    if name == "tokenizer.json":
        inner = draw(st.sampled_from(["model", "model.vocab", "model.merges", "added_tokens", "decoder", "all"]))
        if inner == "all":
            return {name: draw(damaged_json(TOKENIZER, list(TOKENIZER)))}
        spec = json.loads(json.dumps(TOKENIZER))
        node, key = (spec["model"], inner.split(".")[1]) if "." in inner else (spec, inner)
        node[key] = draw(json_values)
        return {name: dumps(spec)}
    if name == "vocab.json":  # read when there is no tokenizer.json (a GPT-2 folder)
        vocab = {w: i for i, w in enumerate(WORDS)}
        return {"tokenizer.json": None, name: draw(damaged_json(vocab, [*WORDS, "x"]))}
    if name == "merges.txt":
        lines = draw(st.lists(st.text(max_size=12), max_size=6))
        return {"tokenizer.json": None, "vocab.json": json.dumps({w: i for i, w in enumerate(WORDS)}),
                name: draw(st.sampled_from(["#version: 0.2\n", ""])) + "\n".join(lines)}
    base = TOKENIZER_CONFIG if name == "tokenizer_config.json" else {"bos_token_id": 1, "eos_token_id": 2}
    return {name: draw(damaged_json(base, ["bos_token", "eos_token", "bos_token_id", "eos_token_id"]))}


@FUZZ
@given(kind=st.sampled_from(["gpt2", "llama"]), files=damaged_tokenizer_files())
def test_damaged_tokenizer_files_run_or_are_refused_in_one_line(kind, files):
    with tempfile.TemporaryDirectory() as tmp:
        runs_or_is_refused_in_one_line(hf_folder(Path(tmp) / "hf", kind, **files))

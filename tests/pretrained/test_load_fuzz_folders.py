"""pretrained/load.py, model folders as untrusted input (hypothesis): random damage to an attngpt checkpoint's
config.json, read the way sample.py, convert.py and train.init_from read a folder (`open_pretrained(...).build()`,
in this process), ends in a model that runs, or in one UserError / CheckpointError line naming the folder -- what
the command lines print with exit status 2 -- never another exception (a traceback). Folders are tiny and written
by hand; the folders and the damage defined here serve the same test of a Hugging Face folder's config.json
(tests/pretrained/hf/test_config_schema.py), its tokenizer files (tests/data/test_tokenizer_files.py) and a
safetensors header (tests/pretrained/test_safetensors_file.py)."""
from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from common.errors import UserError  # noqa: E402
from pretrained.checkpoint import CheckpointError  # noqa: E402
from pretrained.load import open_pretrained  # noqa: E402
from tests.bad_input_hf import _GPT2, _LLAMA  # noqa: E402

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = ["<unk>", "<s>", "</s>", *[f"w{i}" for i in range(13)]]  # 16 tokens: the folders' vocab_size
TOKENIZER = {"version": "1.0", "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(WORDS)},
                                         "unk_token": "<unk>"},
             "pre_tokenizer": {"type": "Whitespace"},
             "added_tokens": [{"id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                               "normalized": False, "special": True} for i, w in enumerate(WORDS[:3])]}
TOKENIZER_CONFIG = {"bos_token": "<s>", "eos_token": "</s>"}
GPT2_SHAPES = {"wte.weight": [16, 8], "wpe.weight": [8, 8], "ln_f.weight": [8], "ln_f.bias": [8],
               **{f"h.0.{n}": s for n, s in [("ln_1.weight", [8]), ("ln_1.bias", [8]), ("attn.c_attn.weight", [8, 24]),
                                             ("attn.c_attn.bias", [24]), ("attn.c_proj.weight", [8, 8]),
                                             ("attn.c_proj.bias", [8]), ("ln_2.weight", [8]), ("ln_2.bias", [8]),
                                             ("mlp.c_fc.weight", [8, 32]), ("mlp.c_fc.bias", [32]),
                                             ("mlp.c_proj.weight", [32, 8]), ("mlp.c_proj.bias", [8])]}}
LLAMA_SHAPES = {"model.embed_tokens.weight": [16, 8], "model.norm.weight": [8], "lm_head.weight": [16, 8],
                **{f"model.layers.0.{n}.weight": [8, 8] for n in (
                    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                    "mlp.up_proj", "mlp.down_proj")},
                "model.layers.0.input_layernorm.weight": [8], "model.layers.0.post_attention_layernorm.weight": [8]}
ATTNGPT_MODEL = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 2, "d_model": 8}
ATTNGPT_SHAPES = {"tok_emb.weight": [16, 8], "pos_emb.weight": [8, 8], "final_norm.weight": [8],
                  "blocks.0.attn_norm.weight": [8], "blocks.0.mlp_norm.weight": [8],
                  "blocks.0.attn.qkv_proj.weight": [24, 8], "blocks.0.attn.out_proj.weight": [8, 8],
                  "blocks.0.mlp.fc_in.weight": [32, 8], "blocks.0.mlp.fc_out.weight": [8, 32]}
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1, "F8_E4M3": 1}


def safetensors_bytes(header: dict[str, Any], data_size: int | None = None) -> bytes:
    """A safetensors file of `header` (name -> dtype/shape/data_offsets), padded as the format wants, with
    `data_size` bytes of small float data after it (default: what the offsets cover)."""
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    if data_size is None:
        data_size = max((e["data_offsets"][-1] for e in header.values() if isinstance(e, dict)
                         and isinstance(e.get("data_offsets"), list) and e["data_offsets"]
                         and isinstance(e["data_offsets"][-1], int)), default=0)
        data_size = min(max(data_size, 0), 2**16)
    return struct.pack("<Q", len(blob)) + blob + bytes(data_size)


def header_of(shapes: dict[str, list[int]], dtype: str = "F32") -> dict[str, Any]:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = DTYPE_BYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return header


def write_folder(folder: Path, files: dict[str, str | bytes | int]) -> Path:
    """Write `files` (an int: a sparse file of that many bytes) into a fresh `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = folder / name
        if isinstance(content, int):
            path.write_bytes(b"")
            os.truncate(path, content)
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return folder


def hf_folder(folder: Path, kind: str, **replace: str | bytes | int | None) -> Path:
    """A tiny Hugging Face folder of `kind` (gpt2 | llama) that loads, with files replaced (None: removed)."""
    files: dict[str, Any] = {
        "config.json": json.dumps({**(_GPT2 if kind == "gpt2" else _LLAMA), "bos_token_id": 1, "eos_token_id": 2}),
        "model.safetensors": safetensors_bytes(header_of(GPT2_SHAPES if kind == "gpt2" else LLAMA_SHAPES)),
        "tokenizer.json": json.dumps(TOKENIZER), "tokenizer_config.json": json.dumps(TOKENIZER_CONFIG)}
    files.update(replace)
    return write_folder(folder, {k: v for k, v in files.items() if v is not None})


def attngpt_folder(folder: Path, **replace: str | bytes | int) -> Path:
    files: dict[str, Any] = {
        "config.json": json.dumps({"model": ATTNGPT_MODEL, "tokenizer": {"kind": "char", "chars": "abcdefghijklmnop"}}),
        "model.safetensors": safetensors_bytes(header_of(ATTNGPT_SHAPES))}
    files.update(replace)
    return write_folder(folder, files)


def runs_or_is_refused_in_one_line(folder: Path) -> str:
    """'ok' when the folder gives a model that runs a prompt, else the one-line message; any other exception
    escapes and fails the test."""
    try:
        source = open_pretrained(str(folder))
        model = source.build()
    except (UserError, CheckpointError) as e:
        message = str(e)
        assert "\n" not in message and str(folder) in message, message
        return message
    ids = source.tokenizer.prompt_ids("") or [0]  # what sample.py starts from without a prompt
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    assert logits.shape[-1] == model.config.vocab_size
    return "ok"


# --- values, raw JSON text and bytes ------------------------------------------------------------------------------

RAW = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" * 5000, "[" * 3000 + "]" * 3000, "16.0", "1.5e3"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.integers(0, 64)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.sampled_from([f"\0RAW{i}\0" for i in range(len(RAW))]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def dumps(value: Any) -> str:
    """JSON text in which the placeholder strings "\\0RAWi\\0" become raw tokens that JSON itself cannot
    produce from Python values (1e400, NaN, 5000 digits, 3000 brackets)."""
    text = json.dumps(value)
    for i, raw in enumerate(RAW):
        text = text.replace(json.dumps(f"\0RAW{i}\0"), raw)
    return text


@st.composite
def damaged_json(draw, base: dict[str, Any], keys: list[str]) -> str | bytes | int:
    """`base` with a few keys set to random values or removed, or its text cut or a byte changed, or other
    bytes entirely, or a sparse file of 1 TB."""
    how = draw(st.sampled_from(["edit", "edit", "edit", "cut", "byte", "bytes", "value", "huge"]))
    if how == "huge":
        return 2**40
    if how == "bytes":
        return draw(st.binary(max_size=200))
    if how == "value":
        return dumps(draw(json_values))
    text = json.dumps(base)
    if how == "cut":
        return text[:draw(st.integers(0, len(text) - 1))]
    if how == "byte":
        data = bytearray(text.encode())
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    edited = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()) and key in edited:
            del edited[key]
        else:
            edited[key] = draw(json_values)
    return dumps(edited)


ATTNGPT_KEYS = [*ATTNGPT_MODEL, "n_kv_head", "mlp", "norm", "pos", "rope_theta", "norm_eps", "dropout", "bias",
                "tie_embeddings", "mlp_hidden", "attn_impl", "x"]


@FUZZ
@given(data=st.data())
def test_a_damaged_attngpt_config_runs_or_is_refused_in_one_line(data):
    """The whole config.json damaged, or only its model or tokenizer section (the rest intact)."""
    where = data.draw(st.sampled_from(["model", "model", "tokenizer", "file"]))
    payload = {"model": ATTNGPT_MODEL, "tokenizer": {"kind": "char", "chars": "abcdefghijklmnop"}}
    if where == "file":
        config = data.draw(damaged_json(payload, ["model", "tokenizer", "source"]))
    else:
        keys = ATTNGPT_KEYS if where == "model" else ["kind", "chars", "encoding", "file", "sha256"]
        section = data.draw(damaged_json(payload[where], keys))
        rest = json.dumps({k: v for k, v in payload.items() if k != where})
        if isinstance(section, int):  # a sparse file: the section does not matter
            config = section
        else:
            section = section if isinstance(section, bytes) else section.encode()
            config = b'{"' + where.encode() + b'": ' + section + b", " + rest[1:].encode()
    with tempfile.TemporaryDirectory() as tmp:
        runs_or_is_refused_in_one_line(attngpt_folder(Path(tmp) / "ckpt", **{"config.json": config}))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "attngpt"])
def test_the_undamaged_folders_run(tmp_path, kind):
    """The base every damage starts from loads and runs: a test that only ever saw refusals would prove little."""
    folder = attngpt_folder(tmp_path / "a") if kind == "attngpt" else hf_folder(tmp_path / "h", kind)
    assert runs_or_is_refused_in_one_line(folder) == "ok"

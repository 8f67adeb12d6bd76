"""pretrained/safetensors_file.py, a weights file's header read before any tensor is (hypothesis): a safetensors file
of a tiny GPT-2, Llama or attngpt folder with one to three tensors changed -- another dtype (an integer where a
float weight belongs), shape or offsets, a tensor removed or added, a value that is no tensor entry -- or data of
another length, ends in a model that runs or in one UserError / CheckpointError line naming the folder, never
another exception; an integer tensor is never accepted as a weight. The folders: test_load_fuzz_folders.py."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from tests.pretrained.test_load_fuzz_folders import (ATTNGPT_SHAPES, DTYPE_BYTES, FUZZ, GPT2_SHAPES,  # noqa: E402
                                                     LLAMA_SHAPES, attngpt_folder, header_of, hf_folder, json_values,
                                                     runs_or_is_refused_in_one_line, safetensors_bytes)


@st.composite
def damaged_header(draw, shapes: dict[str, list[int]]) -> bytes:
    """A safetensors file of the right tensors with one to three of them changed: another dtype (an integer
    where a float weight belongs), shape or offsets, a tensor removed or added; or data of another length."""
    header: dict[str, Any] = header_of(shapes)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(header)))
        what = draw(st.sampled_from(["dtype", "shape", "offsets", "drop", "add", "value"]))
        if not isinstance(header[name], dict):
            what = "value"
        if what == "dtype":
            header[name]["dtype"] = draw(st.sampled_from([*DTYPE_BYTES, "X"]))
        elif what == "shape":
            header[name]["shape"] = draw(st.lists(st.integers(0, 40) | st.integers(-2, 2**64), max_size=3))
        elif what == "offsets":
            header[name]["data_offsets"] = draw(st.lists(st.integers(0, 2**20) | st.integers(-1, 2**64), max_size=3))
        elif what == "drop" and len(header) > 1:
            del header[name]
        elif what == "add" and isinstance(header[name], dict):
            header[f"{name}.extra"] = dict(header[name])
        else:
            header[name] = draw(json_values)
    size = draw(st.none() | st.integers(0, 4096))
    return safetensors_bytes(header, size)


@FUZZ
@given(kind=st.sampled_from(["gpt2", "llama", "attngpt"]), data=st.data())
def test_a_damaged_weights_header_runs_or_is_refused_in_one_line(kind, data):
    shapes = {"gpt2": GPT2_SHAPES, "llama": LLAMA_SHAPES, "attngpt": ATTNGPT_SHAPES}[kind]
    weights = data.draw(damaged_header(shapes))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        if kind == "attngpt":
            attngpt_folder(folder, **{"model.safetensors": weights})
        else:
            hf_folder(folder, kind, **{"model.safetensors": weights})
        outcome = runs_or_is_refused_in_one_line(folder)
    if any(f'"dtype": "{d}"' in weights[8:].decode("utf-8", "replace") for d in ("I32", "I64", "U8", "BOOL")):
        assert outcome != "ok", "an integer tensor where a float weight belongs was accepted"

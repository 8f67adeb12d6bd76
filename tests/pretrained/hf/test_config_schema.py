"""pretrained/hf/config_schema.py, what attngpt reads of a Hugging Face config.json as types and ranges (hypothesis):
random damage to a tiny GPT-2 or Llama folder's config.json -- keys set to random JSON values or removed, the text
cut, a byte changed, other bytes, a sparse terabyte -- ends in a model that runs or in one UserError line naming
the folder, never another exception. The folders and the damage: tests/pretrained/test_load_fuzz_folders.py."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from tests.bad_input_hf import _GPT2, _LLAMA  # noqa: E402
from tests.pretrained.test_load_fuzz_folders import (FUZZ, damaged_json, hf_folder,  # noqa: E402
                                                     runs_or_is_refused_in_one_line)


HF_KEYS = sorted({*_GPT2, *_LLAMA, "n_inner", "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
                  "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps",
                  "sliding_window", "use_sliding_window", "attention_bias", "mlp_bias", "hidden_act",
                  "bos_token_id", "eos_token_id", "scale_attn_weights", "model"})


@FUZZ
@given(kind=st.sampled_from(["gpt2", "llama"]), data=st.data())
def test_a_damaged_hf_config_runs_or_is_refused_in_one_line(kind, data):
    config = data.draw(damaged_json({**(_GPT2 if kind == "gpt2" else _LLAMA), "bos_token_id": 1, "eos_token_id": 2},
                                    HF_KEYS))
    with tempfile.TemporaryDirectory() as tmp:
        runs_or_is_refused_in_one_line(hf_folder(Path(tmp) / "hf", kind, **{"config.json": config}))

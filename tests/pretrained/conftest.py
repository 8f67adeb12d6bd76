"""Fixtures shared by the pretrained tests: tiny random Hugging Face folders (tests/hf_models.py) as
transformers' save_pretrained writes them, once per module: GPT-2, Llama with GQA, tied Llama, and Llama with
biases, one kv head and rope_theta / rms_norm_eps away from their defaults."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf_models import make_gpt2, make_llama


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"gpt2": make_gpt2(root / "gpt2"), "llama": make_llama(root / "llama", seed=1),
            "llama_tied": make_llama(root / "llama_tied", seed=2, tied=True),
            "llama_bias": make_llama(root / "llama_bias", seed=3, attention_bias=True, mlp_bias=True,
                                     num_key_value_heads=1, rope_theta=500.0, rms_norm_eps=1e-3)}

"""pretrained/hf/transformers_model.py, the transformers model equal to an attngpt GPT, built in memory: the
attention implementation asked for reaches transformers (whole models against transformers:
tests/pretrained/test_convert.py)."""
from __future__ import annotations

import pytest

from model import GPT, ModelConfig
from tests.hf_models import transformers_or_skip


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_the_attention_implementation_reaches_transformers(attn_implementation):
    transformers_or_skip()
    from pretrained.hf.transformers_model import to_transformers
    model = GPT(ModelConfig(vocab_size=70, block_size=16, n_layer=1, n_head=2, d_model=16, pos="learned",
                            norm="layernorm", mlp="gelu", bias=True))
    hf_model = to_transformers(model, attn_implementation=attn_implementation)
    assert hf_model.config._attn_implementation == attn_implementation

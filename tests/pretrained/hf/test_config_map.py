"""pretrained/hf/config_map.py, the rules of the Hugging Face boundary one at a time, in process and small: which
config.json settings map to attngpt and which are refused (each message naming the file and the setting), and what
an exported config.json holds (only keys and class names transformers knows). How a weights mismatch is described:
test_load.py; the settings passed on to transformers: test_transformers_model.py; whole models against
transformers: tests/pretrained/test_convert.py.
"""
from __future__ import annotations

import pytest

from common.errors import UserError
from model import ModelConfig
from pretrained.hf.config_map import hf_config_from_model, model_config_from_hf
from tests.hf_models import transformers_or_skip

WHERE = "some/folder/config.json"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": 32,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
         "max_position_embeddings": 64}
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 100, "n_positions": 64,
        "n_embd": 32, "n_layer": 2, "n_head": 4}


def refused(hf: dict) -> str:
    with pytest.raises(UserError) as e:
        model_config_from_hf(hf, WHERE)
    message = str(e.value)
    assert message.startswith(f"{WHERE}: "), message
    return message


def test_a_llama_config_without_hidden_act_is_silu_and_another_activation_is_refused():
    """transformers' LlamaConfig defaults hidden_act to silu: a config.json that leaves it out is SwiGLU."""
    config = model_config_from_hf(LLAMA, WHERE)
    assert (config.mlp, config.norm, config.pos, config.n_head, config.n_kv_head, config.mlp_hidden) == \
        ("swiglu", "rmsnorm", "rope", 4, 2, 48)
    assert model_config_from_hf({**LLAMA, "hidden_act": "silu"}, WHERE) == config
    assert "hidden_act 'gelu' has no attngpt equivalent (SwiGLU gates with SiLU)" in refused({**LLAMA, "hidden_act": "gelu"})


@pytest.mark.parametrize("window, use, ok", [(None, True, True), (64, True, True), (100, True, True),
                                             (16, True, False), (63, True, False), (16, False, True)])
def test_a_sliding_window_shorter_than_the_context_is_refused(window, use, ok):
    hf = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": window,
          "use_sliding_window": use}
    if ok:
        assert model_config_from_hf(hf, WHERE).block_size == 64
    else:
        message = refused(hf)
        assert f"sliding_window={window} has no attngpt equivalent (attention sees the whole context)" in message


def test_a_head_dim_other_than_hidden_size_over_heads_is_refused():
    assert model_config_from_hf({**LLAMA, "head_dim": 8}, WHERE).head_dim == 8
    message = refused({**LLAMA, "head_dim": 16})
    assert ("head_dim=16 (with hidden_size 32 and 4 heads) has no attngpt equivalent (attngpt's head_dim is "
            "hidden_size / num_attention_heads)") in message


@pytest.mark.parametrize("setting, value, ok", [("scale_attn_weights", True, True), ("scale_attn_weights", False, False),
                                                ("scale_attn_by_inverse_layer_idx", False, True),
                                                ("scale_attn_by_inverse_layer_idx", True, False),
                                                ("add_cross_attention", True, False)])
def test_gpt2_attention_variants_are_refused_naming_them(setting, value, ok):
    hf = {**GPT2, setting: value}
    if ok:
        assert model_config_from_hf(hf, WHERE) == model_config_from_hf(GPT2, WHERE)
    else:
        assert f"{setting}={str(value).lower()} has no attngpt equivalent" in refused(hf)


@pytest.mark.parametrize("shape", [dict(pos="learned", norm="layernorm", mlp="gelu", bias=True),
                                   dict(pos="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2)])
def test_an_exported_config_holds_only_what_transformers_knows(shape):
    """Every key of the exported config.json is one of the transformers config class's own (or a classic
    name it still reads), with a value its class (named in architectures) reads back unchanged."""
    transformers = transformers_or_skip()
    config = ModelConfig(vocab_size=70, block_size=16, n_layer=2, n_head=4, d_model=32, **shape)
    exported = hf_config_from_model(config, bos_id=1, eos_id=2)
    (arch,) = exported["architectures"]
    assert hasattr(transformers, arch)
    hf_class = transformers.AutoConfig.for_model(exported["model_type"]).__class__
    classic = {"n_ctx", "rope_theta", "rope_scaling"}  # transformers 4's names, which 5 still reads (module doc)
    known = set(hf_class().to_dict()) | {"architectures", "torch_dtype", "dtype"} | classic
    assert set(exported) <= known, sorted(set(exported) - known)
    back = hf_class(**{k: v for k, v in exported.items() if k != "model_type"}).to_dict()
    for key, value in exported.items():
        if key in back and key not in ("torch_dtype", "dtype"):
            assert back[key] == value, key
    read = model_config_from_hf(exported, WHERE)  # and attngpt reads back the same network
    fields = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model", "hidden_dim", "norm_epsilon",
              "pos", "norm", "mlp", "bias", "tie_embeddings", "rope_theta")
    assert [getattr(read, f) for f in fields] == [getattr(config, f) for f in fields]

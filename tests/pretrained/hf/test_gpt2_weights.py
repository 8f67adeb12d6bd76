"""pretrained/hf/gpt2_weights.py, GPT2LMHeadModel names <-> attngpt names: an HF Conv1D weight is (in, out), so the
layer it holds computes x @ W + b -- checked here against attngpt's own nn.Linear layers on the same input; c_attn
is q | k | v in attngpt's order; absent biases become zeros; the names and shapes are transformers' own; the round
trip is bit-equal; hub checkpoints' names without the `transformer.` prefix, and their saved mask buffers."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from model import GPT, ModelConfig
from pretrained.hf.gpt2_weights import from_hf, is_buffer, normalize_name, to_hf
from tests.hf_models import transformers_or_skip

CONFIG = ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, d_model=32, pos="learned", norm="layernorm",
                     mlp="gelu", bias=True, tie_embeddings=False)


def lively(config: ModelConfig) -> GPT:
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # biases and norms away from 0 and 1 too
    return model


def test_each_conv1d_computes_what_the_attngpt_linear_layer_does():
    model = lively(CONFIG)
    hf = to_hf(model.state_dict(), CONFIG)
    x = torch.randn(5, CONFIG.d_model)
    for i, block in enumerate(model.blocks):
        h = f"transformer.h.{i}."
        pairs = [("attn.c_attn", block.attn.qkv_proj, x), ("attn.c_proj", block.attn.out_proj, x),
                 ("mlp.c_fc", block.mlp.fc_in, x), ("mlp.c_proj", block.mlp.fc_out, torch.randn(5, CONFIG.hidden_dim))]
        for name, linear, inp in pairs:
            with torch.no_grad():
                torch.testing.assert_close(inp @ hf[f"{h}{name}.weight"] + hf[f"{h}{name}.bias"], linear(inp),
                                           msg=name)
    assert torch.equal(hf["transformer.wte.weight"], model.tok_emb.weight)
    assert torch.equal(hf["transformer.wpe.weight"], model.pos_emb.weight)
    assert torch.equal(hf["lm_head.weight"], model.lm_head.weight)


def test_the_names_and_shapes_are_those_of_transformers_gpt2():
    transformers = transformers_or_skip()
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=CONFIG.hidden_dim))
    theirs = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
    ours = {name: tuple(t.shape) for name, t in to_hf(lively(CONFIG).state_dict(), CONFIG).items()}
    masks = {f"transformer.h.{i}.attn.{b}" for i in range(2) for b in ("bias", "masked_bias")}  # older versions save
    assert ours.items() <= theirs.items() and set(theirs) - set(ours) <= masks


@pytest.mark.parametrize("tied", [False, True])
def test_the_round_trip_is_bit_equal(tied):
    config = dataclasses.replace(CONFIG, tie_embeddings=tied)
    state = lively(config).state_dict()
    hf = to_hf(state, config)
    assert ("lm_head.weight" in hf) is not tied  # a tied head is the embedding: transformers leaves it out
    back = from_hf(hf, config)
    expected = {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}
    assert back.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


def test_the_biases_of_a_model_without_them_are_written_as_zeros():
    config = dataclasses.replace(CONFIG, bias=False)
    model = lively(config)
    hf = to_hf(model.state_dict(), config)
    d, hidden = config.d_model, config.hidden_dim
    for name, size in [("attn.c_attn", 3 * d), ("attn.c_proj", d), ("mlp.c_fc", hidden), ("mlp.c_proj", d),
                       ("ln_1", d), ("ln_2", d)]:
        assert torch.equal(hf[f"transformer.h.1.{name}.bias"], torch.zeros(size)), name
    assert torch.equal(hf["transformer.ln_f.bias"], torch.zeros(d))
    assert torch.equal(hf["transformer.h.1.attn.c_attn.weight"], model.blocks[1].attn.qkv_proj.weight.t())


def test_hub_names_get_the_transformer_prefix_and_saved_masks_are_buffers():
    assert normalize_name("h.0.ln_1.weight") == "transformer.h.0.ln_1.weight"
    assert normalize_name("wte.weight") == "transformer.wte.weight"
    assert normalize_name("transformer.h.0.ln_1.weight") == "transformer.h.0.ln_1.weight"
    assert normalize_name("lm_head.weight") == "lm_head.weight"
    assert is_buffer("h.3.attn.bias") and is_buffer("transformer.h.3.attn.masked_bias")
    assert not is_buffer("h.3.attn.c_attn.bias") and not is_buffer("h.3.attn.c_proj.bias")

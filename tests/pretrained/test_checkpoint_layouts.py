"""A config.json saved before a model field existed loads with that field's default, and the model computes
what a model of the default computes; a config.json holding the field loads its value, and the model
computes otherwise."""
from __future__ import annotations

import json

import pytest
import torch

from model import GPT, ModelConfig
from pretrained.checkpoint import load_model, save_model

BASE = dict(vocab_size=17, block_size=16, n_layer=1, n_head=2, d_model=16, pos="rope", norm="rmsnorm")
NEWER = {"rope_theta": (10000.0, 500.0), "norm_eps": (None, 0.1), "attn_impl": ("manual", "sdpa")}


def saved(tmp_path, **fields) -> tuple[GPT, dict]:
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BASE, **fields)).eval()
    save_model(model, tmp_path)
    return model, json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(NEWER))
def test_a_config_without_a_newer_field_loads_its_default(tmp_path, name):
    default, _ = NEWER[name]
    original, payload = saved(tmp_path)
    assert payload["model"][name] == default
    del payload["model"][name]
    (tmp_path / "config.json").write_text(json.dumps(payload))
    model, _ = load_model(tmp_path)
    assert getattr(model.config, name) == default
    idx = torch.arange(12)[None] % 17
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], original(idx)[0], atol=1e-6, rtol=0)
        assert torch.allclose(model.attention_maps(idx)[0], original.attention_maps(idx)[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(NEWER))
def test_a_config_with_the_field_loads_its_value(tmp_path, name):
    default, value = NEWER[name]
    _, payload = saved(tmp_path / "default")
    torch.manual_seed(0)
    _, set_payload = saved(tmp_path / "set", **{name: value})
    assert set_payload["model"][name] == value
    model, _ = load_model(tmp_path / "set")
    assert getattr(model.config, name) == value
    if name != "attn_impl":  # the fused path computes the same numbers: only its setting differs
        other, _ = load_model(tmp_path / "default")
        idx = torch.arange(12)[None] % 17
        with torch.no_grad():
            # the attention maps: at init a model's logits hardly depend on how its attention is spread
            assert not torch.allclose(model.attention_maps(idx)[0], other.attention_maps(idx)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_loading_draws_no_random_weights_and_holds_exactly_the_saved_ones(tmp_path, monkeypatch, tie, pos):
    """The model is built on the meta device and given the stored tensors: no weight is initialised at random
    first (GPT-2 small's two initialisations took 1.6 s of a 7.7 s sample.py start), every saved tensor comes
    back bit for bit, a tied head is the embedding again, and RoPE's derived table is rebuilt on the CPU."""
    torch.manual_seed(0)
    original = GPT(ModelConfig(**{**BASE, "pos": pos}, tie_embeddings=tie)).eval()
    save_model(original, tmp_path)
    real_normal = torch.nn.init.normal_

    def meta_only(tensor, *args, **kwargs):
        assert tensor.device.type == "meta", "a weight was initialised at random before being loaded"
        return real_normal(tensor, *args, **kwargs)
    monkeypatch.setattr(torch.nn.init, "normal_", meta_only)
    model, _ = load_model(tmp_path)
    saved_state, loaded = original.state_dict(), model.state_dict()
    assert list(loaded) == list(saved_state)
    assert all(torch.equal(loaded[name], saved_state[name]) and loaded[name].device.type == "cpu"
               for name in saved_state)
    assert (model.lm_head.weight is model.tok_emb.weight) == tie
    assert not any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    if pos == "rope":
        assert torch.equal(model.rope_freqs, original.rope_freqs)
    idx = torch.arange(12)[None] % 17
    with torch.no_grad():
        assert torch.equal(model(idx)[0], original(idx)[0])

"""Every model setting changes the model: each test fails when its setting is ignored or off by one. And the
memory bound every loader checks first (pretrained/memory.py) counts exactly the parameters GPT allocates."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from common.errors import UserError
from model import GPT, ModelConfig
from model.gpt import CausalSelfAttention
from model.generate import generate
from pretrained.memory import MODULE_BYTES_PER_LAYER, check_fits_in_memory, kv_cache_bytes, param_count
from model.gpt import rope_frequencies


def config(**overrides) -> ModelConfig:
    base = dict(vocab_size=37, block_size=24, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pos="rope",
                norm="rmsnorm", mlp="swiglu")
    return ModelConfig(**{**base, **overrides})


def test_residual_projections_start_smaller_by_sqrt_of_twice_the_depth():
    torch.manual_seed(0)
    model = GPT(config(n_layer=8, d_model=256, n_head=4, n_kv_head=4, vocab_size=300, mlp="gelu"))
    residual_std = 0.02 / math.sqrt(2 * 8)
    for name, p in model.named_parameters():
        if name.endswith(("out_proj.weight", "fc_out.weight")):
            assert p.std().item() == pytest.approx(residual_std, rel=0.03), name
        elif p.dim() == 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.03), name
        else:
            assert torch.equal(p, torch.ones_like(p)), name  # norm gains


@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])
def test_attention_dropout_is_on_in_training_and_off_in_eval(attn_impl):
    torch.manual_seed(1)
    attn = CausalSelfAttention(config(dropout=0.5, attn_impl=attn_impl))
    plain = CausalSelfAttention(config(dropout=0.0, attn_impl=attn_impl))
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 10, 32)
    attn.eval()
    assert torch.equal(attn(x)[0], plain(x)[0])  # eval: exactly the dropout-free layer
    attn.train()
    a, b = attn(x)[0], attn(x)[0]
    assert not torch.allclose(a, b) and not torch.allclose(a, plain(x)[0])  # training: random masks


def test_dropout_setting_reaches_every_dropout_layer():
    model = GPT(config(dropout=0.25))
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(rates) == 1 + 2 * 2 and set(rates) == {0.25}  # embeddings, and per block attention + MLP
    assert {block.attn.dropout_p for block in model.blocks} == {0.25}


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_the_residual_and_embedding_dropouts_zero_outputs_in_training_only(mlp):
    """The dropout on what each sublayer writes into the residual stream, and on the embeddings: in training about
    half the entries of each output are exactly 0 at p=0.5, the rest the eval output scaled by 2; in eval none."""
    torch.manual_seed(2)
    model = GPT(config(dropout=0.5, mlp=mlp, pos="learned"))
    block = model.blocks[0]
    x = torch.randn(4, 10, 32)
    idx = torch.randint(0, 37, (4, 10))
    outputs = {"attention": lambda: block.attn(x)[0], "mlp": lambda: block.mlp(x),
               "embedding": lambda: model._embed(idx, torch.arange(10))}
    for name, output in outputs.items():
        model.eval()
        clean = output()
        assert (clean == 0).float().mean() < 0.01, name
        model.train()
        torch.manual_seed(3)
        dropped = output()
        zeros = dropped == 0
        assert 0.4 < zeros.float().mean() < 0.6, name
        if name != "attention":  # attention's weights are dropped too: its kept entries differ from 2x clean
            torch.testing.assert_close(dropped[~zeros], 2 * clean[~zeros], msg=name)


def test_generate_and_attention_maps_restore_the_training_mode():
    model = GPT(config())
    idx = torch.zeros(1, 3, dtype=torch.long)
    for mode in (True, False):
        model.train(mode)
        generate(model, idx, 2, temperature=0)
        assert model.training is mode
        model.attention_maps(idx)
        assert model.training is mode


def test_rope_theta_sets_the_rotation_speed():
    freqs = rope_frequencies(8, 5, theta=500.0)
    for pos, pair in itertools.product(range(5), range(4)):
        angle = pos * 500.0 ** (-2 * pair / 8)
        cos, sin = freqs[pos, pair].tolist()
        assert (cos, sin) == pytest.approx((math.cos(angle), math.sin(angle)), abs=1e-6)
    torch.manual_seed(2)
    slow, fast = GPT(config(rope_theta=1e6)), GPT(config(rope_theta=10.0))
    fast.load_state_dict(slow.state_dict())
    assert torch.equal(slow.rope_freqs, rope_frequencies(8, 24, theta=1e6))
    idx = torch.randint(0, 37, (1, 12))
    assert not torch.allclose(slow(idx)[0], fast(idx)[0])


def test_shape_settings_shape_the_model():
    c = config(n_layer=3, n_head=6, n_kv_head=3, d_model=48, mlp="swiglu", mlp_hidden=40, vocab_size=41,
               block_size=20, pos="learned", norm="layernorm", bias=True, tie_embeddings=False)
    model = GPT(c)
    assert len(model.blocks) == 3 and model.tok_emb.weight.shape == (41, 48)
    assert model.pos_emb.weight.shape == (20, 48) and not hasattr(model, "rope_freqs")
    attn = model.blocks[0].attn
    assert attn.qkv_proj.weight.shape == ((6 + 2 * 3) * 8, 48) and attn.qkv_proj.bias is not None
    assert model.blocks[0].mlp.fc_in.weight.shape == (2 * 40, 48)  # SwiGLU: gate and up, 40 wide each
    assert type(model.blocks[0].attn_norm).__name__ == "LayerNorm" and model.blocks[0].attn_norm.bias is not None
    assert model.lm_head.weight is not model.tok_emb.weight
    tied = GPT(config(tie_embeddings=True))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert type(GPT(config(norm="rmsnorm")).final_norm).__name__ == "RMSNorm"


def test_attn_impl_sdpa_uses_the_fused_kernel_and_manual_does_not(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    idx = torch.randint(0, 37, (1, 8))
    GPT(config(attn_impl="manual"))(idx)
    assert calls == []
    GPT(config(attn_impl="sdpa"))(idx)
    assert len(calls) == 2  # one per layer


# --- the memory bound ------------------------------------------------------------------------------------------

def test_param_count_is_what_gpt_allocates():
    for mlp, norm, pos, bias, tie, n_kv in itertools.product(("gelu", "swiglu"), ("layernorm", "rmsnorm"),
                                                              ("rope", "learned"), (False, True), (False, True), (1, 4)):
        c = config(mlp=mlp, norm=norm, pos=pos, bias=bias, tie_embeddings=tie, n_kv_head=n_kv, mlp_hidden=None)
        assert param_count(c) == GPT(c).num_params(), c
    assert param_count(config(mlp_hidden=50)) == GPT(config(mlp_hidden=50)).num_params()


def test_kv_cache_bytes_is_what_generation_allocates():
    model = GPT(config())
    cache = model.setup_kv_cache(3)
    assert kv_cache_bytes(model.config, 3) == cache + model.causal_table.numel()  # bool table: 1 byte each


@pytest.mark.parametrize("overrides", [dict(vocab_size=10**12), dict(block_size=10**12), dict(n_layer=10**7),
                                       dict(block_size=10**12, pos="learned")])
def test_a_model_beyond_memory_is_refused_before_allocating(overrides):
    c = config(**overrides)
    with pytest.raises(UserError) as e:
        check_fits_in_memory(c, "cpu", source="the test")
    message = str(e.value)
    assert f"has {param_count(c):,} parameters" in message and "would need" in message and "\n" not in message
    # weights + RoPE table + the two blocks' module objects
    assert check_fits_in_memory(config(), "cpu") == 4 * param_count(config()) + 24 * 4 * 8 + 2 * MODULE_BYTES_PER_LAYER


def test_the_bound_counts_what_building_a_layer_allocates_beside_its_numbers():
    """A deep model of tiny width has few parameters, but every block is a dozen Python objects: the bound per
    layer holds what building one takes (Python allocations, traced; after a first build that warms caches)."""
    import tracemalloc
    tiny = config(d_model=8, n_head=2, n_kv_head=2, vocab_size=16, block_size=8)
    with torch.device("meta"):
        GPT(tiny)
        tracemalloc.start()
        model = GPT(dataclasses.replace(tiny, n_layer=200))
        allocated, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert 200 * 4_000 < allocated < 200 * MODULE_BYTES_PER_LAYER, allocated
    del model


def test_memory_is_stated_in_decimal_units():
    from pretrained.memory import human_bytes
    assert [human_bytes(n) for n in (0, 999, 1000, 1_500_000, 24e9, 3.2e13, 4e15, 7e21)] == [
        "0 B", "999 B", "1.0 kB", "1.5 MB", "24.0 GB", "32.0 TB", "4.0 PB", "7000.0 EB"]

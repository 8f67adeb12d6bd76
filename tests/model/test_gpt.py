"""The GPT around the attention block: config validation, causality, GQA, gradients, sizes, learning."""
from __future__ import annotations

import pytest
import torch

from model import GPT, ModelConfig
from model.gpt import CausalSelfAttention, KVCache


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=37, block_size=24, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                pos="rope", norm="rmsnorm", mlp="swiglu")
    base.update(overrides)
    return ModelConfig(**base)


ARCHS = [
    dict(),  # GQA + RoPE + RMSNorm + SwiGLU
    dict(n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=False),  # GPT-2 style
    dict(n_kv_head=1),  # MQA
]


@pytest.mark.parametrize("bad,field", [
    (dict(n_head=4, n_kv_head=3), "n_kv_head"),
    (dict(d_model=30, n_head=4), "d_model"),
    (dict(d_model=28, n_head=4, n_kv_head=4), "head_dim"),  # head_dim 7 is odd: RoPE rotates pairs
    (dict(block_size=0), "block_size"),
    (dict(mlp="relu"), "mlp"),
    (dict(norm="batchnorm"), "norm"),
    (dict(pos="alibi"), "pos"),
    (dict(attn_impl="flash"), "attn_impl"),
    (dict(dropout=1.5), "dropout"),
    (dict(vocab_size=-3), "vocab_size"),
])
def test_invalid_config_names_field_and_rule(bad, field):
    with pytest.raises(ValueError) as e:
        tiny(**bad)
    message = str(e.value)
    assert field in message and ("must" in message or "needs" in message)


def test_n_kv_head_defaults_to_n_head():
    assert ModelConfig(n_head=6, d_model=48).n_kv_head == 6


@pytest.mark.parametrize("arch", ARCHS)
def test_future_tokens_never_change_earlier_logits(arch):
    torch.manual_seed(0)
    model = GPT(tiny(**arch)).eval()
    idx = torch.randint(0, 37, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 37, (2, 8))
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


@pytest.mark.parametrize("arch", ARCHS)
def test_sdpa_path_equals_manual_path(arch):
    torch.manual_seed(1)
    manual = GPT(tiny(**arch, attn_impl="manual"))
    fused = GPT(tiny(**arch, attn_impl="sdpa"))
    fused.load_state_dict(manual.state_dict())
    idx = torch.randint(0, 37, (3, 24))
    assert torch.allclose(manual(idx)[0], fused(idx)[0], atol=1e-5)


def per_head_reference(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Multi-head attention by an explicit loop over heads, each with its own k/v head index."""
    B, T, _ = x.shape
    hd, n_head, n_kv = attn.head_dim, attn.n_head, attn.n_kv_head
    q, k, v = attn.qkv_proj(x).split([n_head * hd, n_kv * hd, n_kv * hd], dim=-1)
    outs = []
    for h in range(n_head):
        g = h // (n_head // n_kv)  # the kv head this query head shares
        qh, kh, vh = q[..., h * hd:(h + 1) * hd], k[..., g * hd:(g + 1) * hd], v[..., g * hd:(g + 1) * hd]
        scores = qh @ kh.transpose(-1, -2) / hd ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.softmax(scores, -1) @ vh)
    return attn.out_proj(torch.cat(outs, dim=-1))


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_attention_block_equals_per_head_loop(n_kv_head):
    torch.manual_seed(2)
    attn = CausalSelfAttention(tiny(n_kv_head=n_kv_head, pos="learned"))
    x = torch.randn(2, 9, 32)
    y, _ = attn(x)
    assert torch.allclose(y, per_head_reference(attn, x), atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_projections():
    torch.manual_seed(3)
    gqa = CausalSelfAttention(tiny(n_kv_head=2))
    mha = CausalSelfAttention(tiny(n_kv_head=4))
    hd = 8
    wq, wk, wv = gqa.qkv_proj.weight.split([4 * hd, 2 * hd, 2 * hd])
    # kv head g serves query heads 2g and 2g+1: repeat each head's rows twice
    rep = lambda w: w.view(2, 1, hd, 32).expand(2, 2, hd, 32).reshape(4 * hd, 32)
    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.out_proj.weight.copy_(gqa.out_proj.weight)
    x = torch.randn(2, 11, 32)
    freqs = GPT(tiny()).rope_freqs[:11]
    y_gqa, w_gqa = gqa(x, rope=freqs, need_weights=True)
    y_mha, w_mha = mha(x, rope=freqs, need_weights=True)
    assert torch.allclose(y_gqa, y_mha, atol=1e-6)
    assert torch.allclose(w_gqa, w_mha, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_gets_a_gradient(arch):
    torch.manual_seed(4)
    model = GPT(tiny(**arch))
    idx = torch.randint(0, 37, (2, 16))
    _, loss = model(idx, torch.roll(idx, -1, dims=1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_num_params_matches_hand_formula():
    c = tiny()  # V=37, d=32, L=2, n_head=4, n_kv=2, hd=8, swiglu hidden 96 (8/3*32 = 85 -> 96), rmsnorm, tied
    assert c.hidden_dim == 96
    V, d, L, hd, hidden = 37, 32, 2, 8, 96
    per_layer = d * (4 + 2 * 2) * hd + 4 * hd * d + d * 2 * hidden + hidden * d + 2 * d
    expected = V * d + L * per_layer + d
    assert GPT(c).num_params() == expected
    assert GPT(c).num_params(exclude_embeddings=True) == expected - V * d
    g = tiny(n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=False)
    hidden = 128
    per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d) + 2 * 2 * d
    expected = V * d + 24 * d + L * per_layer + 2 * d + d * V
    assert GPT(g).num_params() == expected


def test_flops_per_token_counts_matmuls_and_attention():
    c = tiny()
    model = GPT(c)
    matmul_params = 2 * (32 * 64 + 32 * 32 + 32 * 192 + 96 * 32) + 32 * 37
    assert model.flops_per_token(24) == 6 * matmul_params + 12 * 2 * 4 * 8 * 24


def test_initial_loss_is_near_uniform():
    torch.manual_seed(5)
    model = GPT(tiny())
    idx = torch.randint(0, 37, (8, 24))
    _, loss = model(idx, torch.randint(0, 37, (8, 24)))
    assert abs(loss.item() - torch.log(torch.tensor(37.0)).item()) < 0.3


@pytest.mark.parametrize("arch", ARCHS[:2])
def test_two_layer_model_overfits_one_batch(arch):
    torch.manual_seed(6)
    model = GPT(tiny(**arch))
    idx = torch.randint(0, 37, (4, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_attention_maps_rows_and_causality():
    torch.manual_seed(7)
    model = GPT(tiny(attn_impl="sdpa"))
    idx = torch.randint(0, 37, (2, 15))
    maps = model.attention_maps(idx, layers=[0, 1])
    assert set(maps) == {0, 1}
    for w in maps.values():
        assert w.shape == (2, 4, 15, 15)
        assert torch.allclose(w.sum(-1), torch.ones(2, 4, 15), atol=1e-6)
        assert (w[..., torch.ones(15, 15, dtype=torch.bool).triu(1)] == 0).all()
    with pytest.raises(ValueError, match="layer 5 out of range"):
        model.attention_maps(idx, layers=[5])


def test_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        GPT(tiny())(torch.zeros(1, 25, dtype=torch.long))


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_logits_equal_full_forward(arch):
    torch.manual_seed(8)
    model = GPT(tiny(**arch)).eval()
    idx = torch.randint(0, 37, (2, 20))
    full, _ = model(idx)
    model.setup_kv_cache(batch_size=2, max_len=24)
    steps = [model(idx[:, :7], input_pos=torch.arange(7))[0]]
    for t in range(7, 20):
        steps.append(model(idx[:, t:t + 1], input_pos=torch.tensor([t]))[0])
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_cache_write_of_one_position_equals_the_indexed_write_of_several(cache_dtype):
    """KVCache.update writes one decoded position by a converting copy and several by index_copy_: the same
    slots, the same numbers in the cache's dtype (bfloat16 keys widened exactly into a float32 cache), nothing
    else touched; a position outside the cache is refused by both."""
    k, v = torch.randn(2, 3, 5, 8).bfloat16(), torch.randn(2, 3, 5, 8).bfloat16()
    one_by_one, at_once = KVCache(2, 3, 9, 8, dtype=cache_dtype), KVCache(2, 3, 9, 8, dtype=cache_dtype)
    positions = torch.tensor([1, 2, 4, 6, 7])
    for i, pos in enumerate(positions.tolist()):
        one_by_one.update(torch.tensor([pos]), k[:, :, i:i + 1], v[:, :, i:i + 1])
    at_once.update(positions, k, v)
    for got, expected, source in ((one_by_one.k_cache, at_once.k_cache, k), (one_by_one.v_cache, at_once.v_cache, v)):
        assert torch.equal(got, expected) and got.dtype == cache_dtype
        assert torch.equal(got[:, :, positions], source.to(cache_dtype))
        assert not got[:, :, [0, 3, 5, 8]].any()
    with pytest.raises(RuntimeError):  # one position of another batch size: refused, not broadcast into every row
        one_by_one.update(torch.tensor([0]), k[:1, :, :1], v[:1, :, :1])
    assert not one_by_one.k_cache[:, :, 0].any()
    for outside in (9, -1):
        with pytest.raises(IndexError):
            one_by_one.update(torch.tensor([outside]), k[:, :, :1], v[:, :, :1])
        with pytest.raises(IndexError):
            at_once.update(torch.tensor([outside, 0]), k[:, :, :2], v[:, :, :2])

"""The eager one-token decode step (CausalSelfAttention.decode_one): the numbers of the general path, built here
from its public pieces (project_qkv, KVCache.update, fused_attention over the written prefix), for generated
shapes (heads, kv heads, RoPE or learned positions, batch, position), cache dtypes and head patches; and the step
generate runs, once per layer per decoded token."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model import GPT, ModelConfig
from model.generate import generate
from model.gpt import CausalSelfAttention, HeadPatch, KVCache, fused_attention


def attention(n_head: int, n_kv_head: int, head_dim: int, dtype: torch.dtype, seed: int) -> CausalSelfAttention:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=16, block_size=32, n_layer=1, n_head=n_head, n_kv_head=n_kv_head,
                         d_model=n_head * head_dim, attn_impl="sdpa", bias=True)
    attn = CausalSelfAttention(config).to(dtype).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, 0.3)
    return attn


def reference_step(attn: CausalSelfAttention, x: torch.Tensor, rope: torch.Tensor | None, pos: int,
                   cache: KVCache) -> torch.Tensor:
    """The general path's arithmetic written out: project, write through update, attend over the prefix 0..pos
    in float32 where the cache is float32 under a narrower x, heads side by side, out_proj."""
    q, k, v = attn.project_qkv(x, rope)
    k_all, v_all = cache.update(torch.tensor([pos]), k, v)
    k_all, v_all = k_all[:, :, :pos + 1], v_all[:, :, :pos + 1]
    wide = k_all.dtype == torch.float32 and q.dtype != torch.float32
    if not wide:
        k_all, v_all = k_all.to(q.dtype), v_all.to(q.dtype)
    out = fused_attention(q, k_all, v_all, None, causal=False, float32=wide)
    if attn.head_patch is not None:
        out = attn.head_patch.apply(out)
    return attn.out_proj(out.transpose(1, 2).reshape(x.shape[0], 1, -1))


@settings(max_examples=40, deadline=None)
@given(heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 1)]), head_dim=st.sampled_from([4, 8]),
       batch=st.integers(1, 3), pos=st.integers(0, 11), rope=st.booleans(), patch=st.booleans(),
       dtypes=st.sampled_from([(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                               (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]),
       seed=st.integers(0, 2**16))
def test_decode_one_gives_the_general_paths_numbers(heads, head_dim, batch, pos, rope, patch, dtypes, seed):
    (n_head, n_kv_head), (dtype, cache_dtype) = heads, dtypes
    attn = attention(n_head, n_kv_head, head_dim, dtype, seed)
    generator = torch.Generator().manual_seed(seed)
    history = torch.randn(batch, n_kv_head, 12, head_dim, generator=generator)  # what earlier steps wrote
    x = torch.randn(batch, 1, n_head * head_dim, generator=generator).to(dtype)
    rotation = None
    if rope:
        angle = torch.rand(1, head_dim // 2, generator=generator) * 6.28
        rotation = torch.stack([angle.cos(), angle.sin()], dim=-1)  # (1, head_dim/2, 2), as GPT._rope gives
    if patch:
        attn.head_patch = HeadPatch(torch.rand(1, n_head, generator=generator) > 0.5)
    caches = []
    for _ in range(2):
        cache = KVCache(batch, n_kv_head, 12, head_dim, dtype=cache_dtype)
        cache.k_cache.copy_(history)
        cache.v_cache.copy_(history.flip(2))
        caches.append(cache)
    with torch.no_grad():
        expected = reference_step(attn, x, rotation, pos, caches[0])
        attn.kv_cache = caches[1]
        got = attn.decode_one(x, rotation, torch.tensor([pos]), pos + 1)
    assert got.shape == (batch, 1, n_head * head_dim) and got.dtype == dtype
    assert torch.equal(got, expected)
    assert torch.equal(caches[1].k_cache, caches[0].k_cache) and torch.equal(caches[1].v_cache, caches[0].v_cache)


def test_kv_cache_write_refuses_a_slot_outside_the_buffer_and_leaves_it_unchanged():
    cache = KVCache(1, 2, 4, 3)
    row = torch.ones(1, 2, 3)
    for outside in (4, -1):
        with pytest.raises(IndexError):
            cache.write(torch.tensor([outside]), row, row)
    assert not cache.k_cache.any() and not cache.v_cache.any()
    cache.write(torch.tensor([3]), row, 2 * row)
    assert torch.equal(cache.k_cache[:, :, 3], row) and torch.equal(cache.v_cache[:, :, 3], 2 * row)
    assert not cache.k_cache[:, :, :3].any()


def test_kv_cache_write_on_an_accelerator_goes_through_update_without_reading_the_position(monkeypatch):
    """Off a CPU, write hands the rows to update as one position (B, n_kv_head, 1, head_dim) with the position
    still a tensor: int() of a device tensor would wait for the device at every layer of every token."""
    cache = KVCache(2, 2, 4, 3)
    seen = []
    monkeypatch.setattr(KVCache, "update", lambda self, pos, k, v: seen.append((pos, k.shape, v.shape)) or "updated")
    k = torch.ones(2, 2, 3, device="meta")  # a tensor off the CPU; int() of it would raise
    assert cache.write(torch.tensor([1], device="meta"), k, k) == "updated"
    assert len(seen) == 1 and seen[0][0].device.type == "meta" and seen[0][1] == seen[0][2] == (2, 2, 1, 3)


@pytest.mark.parametrize("attn_impl, expected_per_token", [("sdpa", 1), ("manual", 0)])
def test_generate_takes_decode_one_once_per_layer_and_token_on_the_fused_path(monkeypatch, attn_impl,
                                                                            expected_per_token):
    """Every eager decode step of a cached generation goes through decode_one in every layer (the prefill does
    not); the from-scratch path (attn_impl manual) keeps its own arithmetic."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=16, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=16,
                            attn_impl=attn_impl)).eval()
    calls = []
    original = CausalSelfAttention.decode_one

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(CausalSelfAttention, "decode_one", counted)
    generate(model, torch.zeros(1, 5, dtype=torch.long), 7, temperature=0.0)
    assert len(calls) == 6 * 2 * expected_per_token  # 7 tokens: the first from the prefill, 6 decode steps
    if expected_per_token:
        assert calls[:2] == [model.blocks[0].attn, model.blocks[1].attn]

"""The from-scratch attention formula: seed-text vectors, an independent float64 reference,
agreement with PyTorch's fused kernel and with the chunked batched matmuls (matmul_attention), and the
invariants every attention map must satisfy."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from model.gpt import causal_mask, matmul_attention, repeat_kv, scaled_dot_product_attention, stable_softmax


# --- seed vectors (../shared/seeds/) -----------------------------------------------------------------

def test_cat_eats_fish_example():
    # "attention math step by step": X rows are cat, eats, fish; W_Q = W_K = I, W_V swaps the dims
    X = torch.tensor([[1.0, 2.0], [3.0, 1.0], [2.0, 4.0]], dtype=torch.float64)
    W_V = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    Q, K, V = X, X, X @ W_V
    out, weights = scaled_dot_product_attention(Q, K, V)
    fish_weights = weights[2]
    assert torch.allclose(fish_weights, torch.tensor([0.000848, 0.000848, 0.998304], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(out[2], torch.tensor([3.99576, 2.00000], dtype=torch.float64), atol=1e-5)


def test_chapter_hand_example_exact_output():
    # the book chapter: q = [1, 0] against three keys; the text rounds alpha before mixing (6.015, 3.985),
    # the exact value is 6.017, 3.983
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    K = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    V = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]], dtype=torch.float64)
    out, alpha = scaled_dot_product_attention(q, K, V)
    assert torch.allclose(alpha[0], torch.tensor([0.401, 0.198, 0.401], dtype=torch.float64), atol=5e-4)
    e = math.exp(1 / math.sqrt(2))
    exact = torch.tensor([(10 * e + 5 * e) / (2 * e + 1), (10 + 5 * e) / (2 * e + 1)], dtype=torch.float64)
    assert torch.allclose(out[0], exact, atol=1e-12)
    assert torch.allclose(out[0], torch.tensor([6.017, 3.983], dtype=torch.float64), atol=5e-4)


def test_softmax_percentages_from_the_seed():
    scores = torch.tensor([3.2, 4.0, 1.0, 6.2, 8.0], dtype=torch.float64)
    percent = 100 * stable_softmax(scores)
    expected = torch.tensor([0.690, 1.536, 0.076, 13.859, 83.839], dtype=torch.float64)
    assert torch.allclose(percent, expected, atol=1e-3)


def test_softmax_is_stable_for_huge_scores():
    # exp(800) overflows even float64; shifted by the row max it does not
    scores = torch.tensor([[800.0, 799.0, 790.0]], dtype=torch.float64)
    weights = stable_softmax(scores)
    assert torch.isfinite(weights).all()
    assert torch.allclose(weights, torch.softmax(scores - 800.0, dim=-1))
    q = torch.full((1, 4), 40.0)  # q.k / sqrt(4) = 40*40*4/2 = 3200 in float32
    out, w = scaled_dot_product_attention(q, q.expand(3, 4), torch.eye(3, 4))
    assert torch.isfinite(out).all() and torch.isfinite(w).all()


def test_fully_masked_row_gives_zero_weights_not_nan():
    q, k, v = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3, 5)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(w[1], torch.zeros(3)) and torch.equal(out[1], torch.zeros(5))
    assert w[0, 1] == 0 and torch.isclose(w[0].sum(), torch.tensor(1.0))


# --- an independent reference ----------------------------------------------------------------------

def reference_attention(q, k, v, causal):
    """float64 einsum + torch.softmax: shares no code with model.gpt."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("...id,...jd->...ij", q, k) / q.shape[-1] ** 0.5
    if causal:
        t_q, t_k = scores.shape[-2:]
        i = torch.arange(t_q)[:, None] + (t_k - t_q)
        j = torch.arange(t_k)[None, :]
        scores = scores.masked_fill(j > i, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("...ij,...jd->...id", weights, v), weights


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t_q,t_k", [(7, 7), (3, 9), (1, 6)])
def test_matches_float64_reference(causal, t_q, t_k):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, t_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, t_k, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, t_k, 5, generator=g, dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v, causal=causal)
    ref_out, ref_weights = reference_attention(q, k, v, causal)
    assert torch.allclose(out, ref_out, atol=1e-12)
    assert torch.allclose(weights, ref_weights, atol=1e-12)


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa_with_gqa(n_kv_head, causal):
    g = torch.Generator().manual_seed(1)
    B, n_head, T, hd = 2, 4, 10, 16
    q = torch.randn(B, n_head, T, hd, generator=g)
    k = torch.randn(B, n_kv_head, T, hd, generator=g)
    v = torch.randn(B, n_kv_head, T, hd, generator=g)
    n_rep = n_head // n_kv_head
    # grouped form (as CausalSelfAttention computes it) vs SDPA on repeated heads
    out, _ = scaled_dot_product_attention(q.view(B, n_kv_head, n_rep, T, hd), k.unsqueeze(2), v.unsqueeze(2),
                                          causal=causal)
    expected = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=causal)
    assert torch.allclose(out.view(B, n_head, T, hd), expected, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(n_kv_head=st.sampled_from([1, 2, 3]), n_rep=st.sampled_from([1, 2, 4]), T=st.integers(1, 40),
       head_dim=st.sampled_from([1, 4, 8]), chunk=st.integers(1, 48), seed=st.integers(0, 2**16))
def test_matmul_attention_is_the_formula_for_any_heads_length_and_chunk(n_kv_head, n_rep, T, head_dim, chunk, seed):
    """Chunked batched matmuls with the query heads of a group stacked (model.gpt.matmul_attention) against the
    float64 einsum reference on kv heads repeated per query head: output and the gradients of q, k and v, for
    MHA, GQA and MQA, any length, and chunks that divide T, do not, or exceed it."""
    g = torch.Generator().manual_seed(seed)
    B, n_head = 2, n_kv_head * n_rep
    q = torch.randn(B, n_head, T, head_dim, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, n_kv_head, T, head_dim, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    grad_out = torch.randn(B, n_head, T, head_dim, generator=g, dtype=torch.float64)
    out = matmul_attention(q, k, v, chunk=chunk)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected, _ = reference_attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), causal=True)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)


def test_matmul_attention_under_bfloat16_autocast_stays_within_its_rounding():
    """What training runs: bfloat16 matmuls under autocast, against the float64 formula on the same inputs. The
    scores and weights are rounded to bfloat16 on the way (the fused kernel keeps them in float32): ~0.012 off
    at most here, against the fused bfloat16 kernel's ~0.006, at outputs of magnitude ~1."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 200, 32, generator=g).bfloat16() for h in (4, 2, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = matmul_attention(q, k, v)
    expected, _ = reference_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal=True)
    assert out.dtype == torch.bfloat16
    assert (out.double() - expected).abs().max().item() < 0.03


def test_matmul_attention_drops_weights_as_the_formula_does():
    """dropout_p drops attention weights (and scales the kept ones): at 1.0 every weight is dropped and the
    output is exactly zero; at 0.5 it differs from no dropout but agrees on average over many draws (within
    five standard errors of the mean)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    plain = matmul_attention(q, k, v, chunk=4)
    assert torch.equal(matmul_attention(q, k, v, dropout_p=1.0, chunk=4), torch.zeros_like(plain))
    torch.manual_seed(0)
    draws = torch.stack([matmul_attention(q, k, v, dropout_p=0.5, chunk=4) for _ in range(4000)])
    assert not torch.allclose(draws[0], plain, atol=1e-3)
    standard_error = draws.std(0) / len(draws) ** 0.5
    assert ((draws.mean(0) - plain).abs() <= 5 * standard_error + 1e-6).all()


def test_bottom_right_causal_when_queries_are_the_last_positions():
    # decoding against a cache: 3 new queries at positions 5, 6, 7 of 8 keys
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (3, 8, 8))
    out, weights = scaled_dot_product_attention(q, k, v, causal=True)
    explicit = torch.ones(3, 8, dtype=torch.bool).tril(diagonal=5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=explicit)
    assert torch.allclose(out, expected, atol=1e-5)
    # the last query sees everything; the first sees keys 0..5
    assert (weights[..., 2, :] > 0).all()
    assert (weights[..., 0, 6:] == 0).all() and (weights[..., 0, :6] > 0).all()
    # PyTorch's is_causal aligns top-left here, which is not what decoding needs (pytorch issue 108108)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(out, top_left, atol=1e-3)


def test_causal_mask_shape_and_alignment():
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    assert torch.equal(causal_mask(1, 4), torch.ones(1, 4, dtype=torch.bool))
    assert torch.equal(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool))


# --- invariants -------------------------------------------------------------------------------------

def test_rows_sum_to_one_and_future_is_exactly_zero():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 4, 12, 8, generator=g) for _ in range(3))
    _, weights = scaled_dot_product_attention(q, k, v, causal=True)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 12), atol=1e-6)
    future = ~causal_mask(12, 12)
    assert (weights[..., future] == 0).all()  # exactly zero, not merely small
    assert (weights[..., ~future] > 0).all()


def test_scaling_keeps_scores_unit_variance():
    """The chapter's Figure 5.1, through the project's formula: q.k has std sqrt(d_k), and the scores the
    attention uses (recovered from its weights) have std ~1 at every d_k. Each query sees its key and a zero
    key (score 0), so log(w_key / w_zero) is exactly the scaled score the softmax was given."""
    g = torch.Generator().manual_seed(4)
    for d_k in (4, 64, 1024):
        q = torch.randn(20000, 1, d_k, generator=g, dtype=torch.float64)
        k = torch.cat([torch.randn(20000, 1, d_k, generator=g, dtype=torch.float64),
                       torch.zeros(20000, 1, d_k, dtype=torch.float64)], dim=1)  # (N, 2, d_k)
        _, weights = scaled_dot_product_attention(q, k, torch.zeros(20000, 2, 1, dtype=torch.float64))
        scores = torch.log(weights[:, 0, 0] / weights[:, 0, 1])  # (N,)
        raw = (q[:, 0] * k[:, 0]).sum(-1)
        assert abs(raw.std().item() / math.sqrt(d_k) - 1) < 0.05  # unscaled: grows like sqrt(d_k)
        assert abs(scores.std().item() - 1) < 0.05  # scaled: stays ~1
        torch.testing.assert_close(scores, raw / math.sqrt(d_k))


def test_bf16_inputs_give_float32_weights():
    q, k, v = (torch.randn(2, 6, 8, dtype=torch.bfloat16) for _ in range(3))
    out, weights = scaled_dot_product_attention(q, k, v, causal=True)
    assert weights.dtype == torch.float32 and out.dtype == torch.bfloat16
    assert torch.allclose(weights.sum(-1), torch.ones(2, 6))

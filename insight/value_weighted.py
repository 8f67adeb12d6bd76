"""Value-weighted attention: how much each attended token actually moves the output.

A head's output for query i is sum_j alpha_ij v_j, written into the residual stream through the head's
slice of the output projection, W_O^h. Token j's contribution is therefore the vector alpha_ij v_j W_O^h,
and its length ||alpha_ij v_j W_O^h|| = alpha_ij ||v_j W_O^h|| (alpha >= 0) is what the weight alone
hides: a token can take most of the budget of 1 and still add little when its transformed value vector
is short (Kobayashi et al., EMNLP 2020, "Attention is Not Only a Weight: Analyzing Transformers with
Vector Norms"). The output bias is added once per query, not per key, so it takes no part.

In code, with h's kv head g = h // (n_head // n_kv_head) and head_dim columns of out_weight per head:
  value_norms(v, out_weight, n_head)[b, h, j]             = ||W_O^h v_j||
  value_weighted(weights, v, out_weight)[b, h, i, j] = weights[b, h, i, j] * ||W_O^h v_j||
"""
from __future__ import annotations

import torch

from model.gpt import AttentionInternals


def value_norms(v: torch.Tensor, out_weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """||v_j W_O^h|| for every head and key: v (B, n_kv_head, T, head_dim), out_weight (d_model,
    n_head * head_dim) -> (B, n_head, T) float32 (computed in float32 whatever the inputs' dtype)."""
    B, n_kv_head, T, head_dim = v.shape
    d_model = out_weight.shape[0]
    if out_weight.shape[1] != n_head * head_dim or n_head % n_kv_head:
        raise ValueError(f"out_weight {tuple(out_weight.shape)} and v {tuple(v.shape)} do not fit {n_head} heads")
    n_rep = n_head // n_kv_head
    w_o = out_weight.float().view(d_model, n_head, head_dim).permute(1, 2, 0)  # (n_head, head_dim, d_model): W_O^h
    v_per_head = v.float().repeat_interleave(n_rep, dim=1)  # (B, n_head, T, head_dim): head h reads kv head h // n_rep
    return torch.linalg.vector_norm(v_per_head @ w_o, dim=-1)  # (B, n_head, T, d_model) -> (B, n_head, T)


def value_weighted(weights: torch.Tensor, v: torch.Tensor, out_weight: torch.Tensor) -> torch.Tensor:
    """alpha_ij ||v_j W_O^h||: weights (B, n_head, T, T) -> (B, n_head, T, T) float32, zero where alpha is."""
    norms = value_norms(v, out_weight, weights.shape[1])  # (B, n_head, T)
    return weights.float() * norms[:, :, None, :]


def internals_value_norms(internals: AttentionInternals) -> torch.Tensor:
    """value_norms of one layer's GPT.attention_internals: (B, n_head, T)."""
    return value_norms(internals.v, internals.out_weight, internals.q.shape[1])

"""Circuits: which head feeds which, whether that edge matters, and what a head writes into the logits.

For any GPT of model/gpt.py (MHA or GQA, LayerNorm or RMSNorm, RoPE or learned positions). docs/circuits.md
states each formula with its limits; in short:

  composition_scores   Q-, K- and V-composition of every head A of an earlier layer into every head B of a
                       later one, from the weights alone (Elhage et al. 2021):
                           ‖W_OV^A · W^B‖_F / (‖W_OV^A‖_F · ‖W^B‖_F),
                       W^B = W_QK^B (Q), (W_QK^B)ᵀ (K) or W_OV^B (V), with the norms' gains folded in; under RoPE
                       W_QK^B at every query-key distance side by side.
  composition_zscores  each score against what the same two matrices would score with the residual stream between
                       them rotated at random: a z that reads "far above chance for matrices of these ranks".
  path_ablation        the causal check of an edge: head A's output removed from head B's query, key or value
                       input only (not from the residual stream), and what B's role scores and the loss lose.
  direct_logit_attribution
                       each head's direct contribution to the correct next token's logit, through the final norm
                       with its scale frozen at the intact pass; the heads plus the other direct paths sum to the
                       logit.
  ov_promoted_tokens   the tokens a head's writes promote directly, for each token it attends to.

Conventions. Row vectors, as in TransformerLens and the formula above: a head reads x (1 × d_model) as x W_Q,
x W_K, x W_V (d_model × head_dim each), and writes (its weighted values) W_O (head_dim × d_model). For query head
h of a layer, reading kv head g = h // (n_head / n_kv_head), in the layout of CausalSelfAttention (qkv_proj's
output rows are q heads, then k heads, then v heads, head_dim rows each):

    W_Q^h = qkv_proj.weight[h·hd : (h+1)·hd]ᵀ                   W_K^g = qkv_proj.weight[(H+g)·hd : (H+g+1)·hd]ᵀ
    W_V^g = qkv_proj.weight[(H+K+g)·hd : (H+K+g+1)·hd]ᵀ         W_O^h = out_proj.weight[:, h·hd : (h+1)·hd]ᵀ
    W_QK^h = W_Q^h W_K^gᵀ (d_model × d_model: the score's bilinear form)   W_OV^h = W_V^g W_O^h

(H = n_head, K = n_kv_head, hd = head_dim.) Every product is computed in head_dim-sized factors, never d_model ×
d_model, in float64 on the CPU.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from insight.ablation import _stream_and_head_outputs, _summed_loss, _targets, eval_mode
from insight.roles import ROLE_NAMES, duplicate_token_score, induction_score, prev_token_score
from model.gpt import scaled_dot_product_attention

COMPOSITION_KINDS = ("q", "k", "v")
PATH_ABLATION_MODES = ("zero", "mean")
Edge = tuple[str, tuple[int, int], tuple[int, int], float]  # (kind, source head, target head, z)
PATH_ROWS_BUDGET = 1 << 28  # bytes of float32 activations one batch of side-by-side path ablations may hold


# --------------------------------------------------------------------------------------------------------------------
# The weights of one layer's heads, with the input norm folded in
# --------------------------------------------------------------------------------------------------------------------

def _centring(d_model: int) -> torch.Tensor:
    """P = I - 11ᵀ/d_model (d_model × d_model, float64): what LayerNorm's mean subtraction does to its input."""
    return torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model


def head_weights(model, layer: int) -> dict[str, torch.Tensor]:
    """The per-head matrices of `layer` (module doc), float64 on the CPU, with the layer's input norm folded in:

        W_Q^h, W_K^g, W_V^g  <-  P diag(γ) W          (γ = attn_norm.weight; P = I - 11ᵀ/d for LayerNorm, I for RMSNorm)
        W_O^h                <-  W_O^h P

    so x_normed W = (x / scale) (P diag(γ) W) for the residual stream x: what a head reads of x, up to the norm's
    per-position scale, which multiplies whole scores and values and leaves composition's ratios alone. LayerNorm's
    centring is folded into the writing side as well (a LayerNorm reader never sees the mean of a write); the
    product W_OV^A W^B is the same with it on either side, the norms ‖W_OV^A‖, ‖W^B‖ lose the part no reader sees.
    Biases (qkv_proj's, out_proj's, LayerNorm's) are constants, not part of these linear maps: left out. RoPE is
    not applied here (rope_rotations).

    Returns {"q": (n_head, d_model, hd), "k": (n_kv_head, d_model, hd), "v": (n_kv_head, d_model, hd),
             "o": (n_head, hd, d_model)}."""
    config = model.config
    H, K, hd, d = config.n_head, config.n_kv_head, config.head_dim, config.d_model
    block = model.blocks[layer]
    qkv = block.attn.qkv_proj.weight.detach().double().cpu()  # ((H + 2K) hd, d): rows q | k | v
    w = qkv.view(H + 2 * K, hd, d).transpose(1, 2)  # (H + 2K, d, hd): head i's W = its rows, transposed
    read = torch.diag(block.attn_norm.weight.detach().double().cpu())  # (d, d)
    w_o = block.attn.out_proj.weight.detach().double().cpu().view(d, H, hd).permute(1, 2, 0)  # (H, hd, d)
    if config.norm == "layernorm":
        read = _centring(d) @ read
        w_o = w_o @ _centring(d)
    w = read @ w  # (H + 2K, d, hd)
    return {"q": w[:H], "k": w[H:H + K], "v": w[H + K:], "o": w_o}


def rope_rotations(model, offsets: Sequence[int]) -> torch.Tensor:
    """R(Δ) for each offset Δ, (n_offsets, hd, hd) float64: q R(Δ) is the row vector q (1 × hd) rotated as RoPE
    rotates a query or key at position Δ (channel pairs (2i, 2i+1) turned by Δ·θ_i, model/gpt.py section 3), so
    that a query at position m and a key at n score q R(m) · k R(n) = q R(m - n) kᵀ: the bilinear form between a
    query and the key Δ = m - n before it is W_Q R(Δ) W_Kᵀ. The identity for every offset without RoPE."""
    config = model.config
    hd = config.head_dim
    if config.pos != "rope":
        return torch.eye(hd, dtype=torch.float64).expand(len(offsets), hd, hd).clone()
    cos_sin = model.rope_freqs[list(offsets)].detach().double().cpu()  # (n, hd/2, 2)
    cos, sin = cos_sin[..., 0], cos_sin[..., 1]  # (n, hd/2)
    # a pair (a, b) becomes (a cos - b sin, a sin + b cos): [a b] @ [[cos, sin], [-sin, cos]]
    blocks = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # (n, hd/2, 2, 2)
    rotations = torch.zeros(len(offsets), hd, hd, dtype=torch.float64)
    for i in range(hd // 2):
        rotations[:, 2 * i:2 * i + 2, 2 * i:2 * i + 2] = blocks[:, i]
    return rotations


# --------------------------------------------------------------------------------------------------------------------
# Composition scores and their chance level
# --------------------------------------------------------------------------------------------------------------------

def _reading_factors(weights: dict[str, torch.Tensor], kind: str, n_rep: int, group_kv: bool,
                     rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reading matrix W^B of every target of one layer as X [Y_1 | ... | Y_n]ᵀ: returns X (n_t, d, hd) and
    S = Σ_i Y_iᵀ Y_i (n_t, hd, hd), all that ‖W_OV^A W^B‖ and ‖W^B‖ need. The blocks i run over the RoPE offsets Δ
    (rotations (n_off, hd, hd)) and, for k and v with group_kv, the group's query heads:

        q: W^B(Δ) = W_Q R(Δ) W_Kᵀ         X = W_Q,  Y = W_K R(Δ)ᵀ    (query head h; kv head g its)
        k: W^B(Δ) = W_K R(Δ)ᵀ W_Qᵀ        X = W_K,  Y = W_Q R(Δ)     (= W_QK(Δ)ᵀ)
        v: W^B    = W_V W_O               X = W_V,  Y = W_Oᵀ         (RoPE does not touch values)

    Targets: query heads (n_t = n_head); for k and v with group_kv the kv heads (n_t = n_kv_head), a kv head's key
    or value input being one for its whole group."""
    q, k, v, o = weights["q"], weights["k"], weights["v"], weights["o"]
    k_per_q, v_per_q = k.repeat_interleave(n_rep, 0), v.repeat_interleave(n_rep, 0)  # (H, d, hd)
    if kind == "q":
        gram = k_per_q.transpose(1, 2) @ k_per_q  # (H, hd, hd): W_KᵀW_K
        return q, torch.einsum("nab,hbc,ndc->had", rotations, gram, rotations)  # Σ_Δ R W_KᵀW_K Rᵀ
    if kind == "k":
        gram = q.transpose(1, 2) @ q  # W_QᵀW_Q
        x, s = k_per_q, torch.einsum("nba,hbc,ncd->had", rotations, gram, rotations)  # Σ_Δ Rᵀ W_QᵀW_Q R
    else:
        x, s = v_per_q, o @ o.transpose(1, 2)  # W_O W_Oᵀ
    if group_kv:
        x = x[::n_rep]  # (K, d, hd): one per group
        s = s.view(-1, n_rep, *s.shape[1:]).sum(dim=1)  # (K, hd, hd)
    return x, s


def _trace_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """tr(a b) over the last two axes, (...,)."""
    return (a * b.transpose(-2, -1)).sum(dim=(-2, -1))


def _composition_terms(model, group_kv: bool, rope_offsets: Sequence[int] | None
                       ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """({kind: squared score s² (4D, composition_scores' layout)}, {kind: Var(s²) under a random rotation of the
    residual stream (composition_zscores)}, n: the dimension of the residual space the norms read: d_model, or
    d_model - 1 under LayerNorm, whose readers never see the mean).

    For A = W_OV^A = U W (U = W_V, W = W_O) and B = X Yᵀ (_reading_factors, S = YᵀY), with M = W X (hd × hd):

        ‖A B‖² = tr(Mᵀ UᵀU M S),   ‖A‖² = tr(UᵀU W Wᵀ),   ‖B‖² = tr(XᵀX S),
        ‖A‖⁴ / r_A = tr((UᵀU W Wᵀ)²),   ‖B‖⁴ / r_B = tr((XᵀX S)²),

    r the effective rank (Σσ²)² / Σσ⁴ of a matrix's singular values σ."""
    config = model.config
    L, H, K = config.n_layer, config.n_head, config.n_kv_head
    n_rep = H // K
    n = config.d_model - (config.norm == "layernorm")
    offsets = [0] if config.pos != "rope" else (range(config.block_size) if rope_offsets is None else rope_offsets)
    if config.pos != "rope" and rope_offsets is not None and list(rope_offsets) != [0]:
        raise ValueError(f"rope_offsets={list(rope_offsets)}: the model has no RoPE ({config.pos} positions)")
    offsets = [int(o) for o in offsets]
    if not offsets or not all(0 <= o < config.block_size for o in offsets):
        raise ValueError(f"rope_offsets: one or more of 0..block_size-1={config.block_size - 1}, got {offsets}")
    rotations = rope_rotations(model, offsets)
    layers = [head_weights(model, layer) for layer in range(L)]
    width = {"q": H, "k": K if group_kv else H, "v": K if group_kv else H}
    squared = {kind: np.full((L, H, L, width[kind]), np.nan) for kind in COMPOSITION_KINDS}
    variance = {kind: np.full((L, H, L, width[kind]), np.nan) for kind in COMPOSITION_KINDS}
    for la in range(L - 1):
        u = layers[la]["v"].repeat_interleave(n_rep, 0)  # (H, d, hd): W_V of each query head's kv head
        w = layers[la]["o"]  # (H, hd, d)
        u_gram = u.transpose(1, 2) @ u  # (H, hd, hd): UᵀU
        a_gram = u_gram @ (w @ w.transpose(1, 2))  # (H, hd, hd): UᵀU W Wᵀ
        a_sq, a_fourth = a_gram.diagonal(dim1=-2, dim2=-1).sum(-1), _trace_product(a_gram, a_gram)  # (H,) each
        for lb in range(la + 1, L):
            for kind in COMPOSITION_KINDS:
                x, s = _reading_factors(layers[lb], kind, n_rep, group_kv, rotations)  # (n_t, d, hd), (n_t, hd, hd)
                m = torch.einsum("ahd,tde->athe", w, x)  # (H, n_t, hd, hd): W_O^A X
                product_sq = _trace_product(u_gram[:, None] @ m, s[None] @ m.transpose(-2, -1))  # (H, n_t)
                b_gram = x.transpose(1, 2) @ x @ s  # (n_t, hd, hd): XᵀX S
                b_sq, b_fourth = b_gram.diagonal(dim1=-2, dim2=-1).sum(-1), _trace_product(b_gram, b_gram)
                squared[kind][la, :, lb] = (product_sq / (a_sq[:, None] * b_sq[None])).numpy()
                excess_a = (a_fourth / a_sq ** 2 - 1.0 / n)[:, None]  # 1/r_A - 1/n
                excess_b = (b_fourth / b_sq ** 2 - 1.0 / n)[None]
                variance[kind][la, :, lb] = (2.0 * excess_a * excess_b / ((n - 1) * (n + 2))).numpy()
    return squared, variance, n


@torch.no_grad()
def composition_scores(model, group_kv: bool = True, rope_offsets: Sequence[int] | None = None
                       ) -> dict[str, np.ndarray]:
    """Q-, K- and V-composition of every head A into every head B of a later layer, from the weights alone:

        composition[kind][la, a, lb, b] = ‖W_OV^A W^B‖_F / (‖W_OV^A‖_F ‖W^B‖_F)       for la < lb, NaN otherwise

    W_OV^A = W_V^A W_O^A of source head a in layer la; W^B of target b in layer lb: W_QK^B (q: A's write read by
    B's queries), (W_QK^B)ᵀ (k: by its keys), W_OV^B (v: by its values); each with its own layer's input norm
    folded in (head_weights). 1 = A writes only into directions B reads, with matched spectra. If either matrix
    is an isotropic random one, the expected squared score is 1 / n (n = d_model, d_model - 1 under LayerNorm):
    chance is about 1 / sqrt(d_model), 0.088 at d_model 128 (composition_zscores for its spread).

    RoPE: a query at m and a key at n score x_m W_Q R(m - n) W_Kᵀ x_nᵀ (rope_rotations), a different bilinear form
    at every distance. W_QK^B is taken at the distances `rope_offsets` side by side, [W_QK(Δ1) | W_QK(Δ2) | ...]
    (the formula unchanged on that wider matrix: numerator and norm summed over Δ in squares); default every
    distance 0..block_size-1. (0,): the unrotated weights alone, as TransformerLens scores a RoPE model. Without RoPE
    there is one form and rope_offsets must be None or (0,). V composition does not depend on it.

    Targets: query heads for q. For k and v with group_kv (default) the kv heads, whose W^B is the group's query
    heads' matrices side by side in the same way (_reading_factors); without group_kv, query heads (the kv head's
    matrices repeated), as TransformerLens lays GQA out. MHA: the same.

    Returns {"q": (n_layer, n_head, n_layer, n_head), "k", "v": (n_layer, n_head, n_layer, n_kv_head or n_head)}
    float64, indexed [source layer, source head, target layer, target head]."""
    squared, _, _ = _composition_terms(model, group_kv, rope_offsets)
    return {kind: np.sqrt(value) for kind, value in squared.items()}


@torch.no_grad()
def composition_zscores(model, group_kv: bool = True, rope_offsets: Sequence[int] | None = None
                        ) -> dict[str, np.ndarray]:
    """Each composition score against chance for matrices of the same ranks: the squared score s² of
    composition_scores (same arguments, same layout) standardised over a uniformly random rotation Q of the
    residual stream between writer and reader, s²(Q) = ‖A Q B‖² / (‖A‖² ‖B‖²), whose mean and variance are exact:

        E[s²(Q)] = 1 / n,     Var[s²(Q)] = 2 (1/r_A - 1/n) (1/r_B - 1/n) / ((n - 1)(n + 2)),
        z = (s² - 1/n) / sqrt(Var[s²(Q)]),

    n the residual dimension the norms read (d_model; d_model - 1 under LayerNorm, the rotations then fixing the
    mean direction), r_A and r_B the effective ranks (Σσ²)² / Σσ⁴ of W_OV^A and W^B (_composition_terms).

    Why: two matrices that share one strong direction score high by the luck of that one direction, while a score
    carried by many directions is hard to reach by chance. The chance spread grows as the effective ranks fall: a
    baseline from random or freshly initialised matrices (high ranks) is too narrow for trained heads and favours
    the pairs of lowest rank. Here each pair is measured against its own ranks. +inf where a matrix is isotropic
    (r = n, no spread)."""
    squared, variance, n = _composition_terms(model, group_kv, rope_offsets)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {kind: (squared[kind] - 1.0 / n) / np.sqrt(variance[kind]) for kind in COMPOSITION_KINDS}


def head_name(layer: int, head: int) -> str:
    """'L1.H2': how a head is named in stats.csv, summaries and pictures."""
    return f"L{layer}.H{head}"


def ranked_sources(z: np.ndarray, target: tuple[int, int], k: int) -> list[tuple[int, int]]:
    """The k (source layer, source head) of largest z into `target` (lb, b), largest first, from z (L, H, L, W) of
    one kind (W = n_head, or n_kv_head for K and V per kv head, b then a kv head); NaN never chosen (+inf first);
    ties in (layer, head) order. Fewer when fewer earlier heads have a z."""
    lb, b = target
    column = z[:lb, :, lb, b].reshape(-1)  # (lb * H,): sources in (layer, head) order
    finite = np.flatnonzero(~np.isnan(column))
    order = finite[np.argsort(-column[finite], kind="stable")][:k]
    n_head = z.shape[1]
    return [(int(i) // n_head, int(i) % n_head) for i in order]


def strongest_edges(zscores: dict[str, np.ndarray], n_head: int) -> list[Edge]:
    """For every query head B of layer 1 and above and every kind of `zscores` (composition_zscores' layout): the
    edge from the head A of an earlier layer with the largest z (ranked_sources), as (kind, A (layer, head),
    B (layer, head), z). K and V arrays per kv head give a query head its kv head's edge. A kind whose sources
    are all NaN gives no edge. Ordered by target, then kind."""
    edges = []
    n_layer = next(iter(zscores.values())).shape[0] if zscores else 0
    for layer in range(1, n_layer):
        for head in range(n_head):
            for kind in (k for k in COMPOSITION_KINDS if k in zscores):
                z = zscores[kind]
                column = head if z.shape[3] == n_head else head // (n_head // z.shape[3])
                for la, a in ranked_sources(z, (layer, column), 1):
                    edges.append((kind, (la, a), (layer, head), float(z[la, a, layer, column])))
    return edges


# --------------------------------------------------------------------------------------------------------------------
# Path ablation
# --------------------------------------------------------------------------------------------------------------------

def _head_writes(model, layer: int, outputs: list[torch.Tensor]) -> torch.Tensor:
    """What each head of `layer` added to the residual stream: out_h W_O^h, (n_head, B, T, d_model) (out_proj's
    bias, shared by the heads, left out)."""
    config = model.config
    w_o = model.blocks[layer].attn.out_proj.weight.view(config.d_model, config.n_head, config.head_dim)  # (d, H, hd)
    return torch.einsum("bhtc,dhc->hbtd", outputs[layer], w_o)


def _layer_with_one_input_replaced(model, layer: int, x: torch.Tensor, x_other: torch.Tensor, kind: str,
                                   head: int, rope: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block `layer` on the residual stream x (N, T, d_model), except that one head's query (kind "q": query head
    `head`) or key or value (kind "k", "v": the kv head query head `head` reads) is computed from x_other (N, T,
    d_model) instead. Returns (the block's output (N, T, d_model), the attention weights (N, n_head, T, T)): the
    arithmetic of Block and CausalSelfAttention (model/gpt.py), from-scratch path, eval mode."""
    block = model.blocks[layer]
    attn = block.attn
    N, T, _ = x.shape
    n_kv, n_rep, hd = attn.n_kv_head, attn.n_head // attn.n_kv_head, attn.head_dim
    q, k, v = attn.project_qkv(block.attn_norm(x), rope)  # (N, H, T, hd), (N, K, T, hd) twice
    q_other, k_other, v_other = attn.project_qkv(block.attn_norm(x_other), rope)
    if kind == "q":
        q = torch.cat([q[:, :head], q_other[:, head:head + 1], q[:, head + 1:]], dim=1)
    else:
        g = head // n_rep
        mixed = {"k": (k, k_other), "v": (v, v_other)}[kind]
        spliced = torch.cat([mixed[0][:, :g], mixed[1][:, g:g + 1], mixed[0][:, g + 1:]], dim=1)
        k, v = (spliced, v) if kind == "k" else (k, spliced)
    out, weights = scaled_dot_product_attention(q.view(N, n_kv, n_rep, T, hd), k.unsqueeze(2), v.unsqueeze(2),
                                                causal=True)  # (N, K, n_rep, T, hd), (N, K, n_rep, T, T)
    y = out.reshape(N, attn.n_head, T, hd).transpose(1, 2).reshape(N, T, attn.n_head * hd)
    x = x + attn.out_proj(y)
    x = x + block.mlp(block.mlp_norm(x))
    return x, weights.reshape(N, attn.n_head, T, T)


def _final_hidden(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Final hidden states from x, the residual stream leaving block `layer`."""
    if layer + 1 < model.config.n_layer:
        return model.hidden_from(layer + 1, x)
    return model.final_norm(x)


def _path_rows(model, idx: torch.Tensor) -> int:
    """How many (B, T) copies one batch of path ablations runs side by side (PATH_ROWS_BUDGET)."""
    c = model.config
    per_copy = 4 * idx.numel() * (3 * c.n_head * idx.shape[1] + c.hidden_dim + 8 * c.d_model)
    return max(1, PATH_ROWS_BUDGET // per_copy)


@torch.no_grad()
def _path_ablated_runs(model, idx: torch.Tensor, kind: str, target: tuple[int, int], sources: list[tuple[int, int]],
                       mode: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each source head (la, a), la < target layer: (final hidden states (B, T, d_model), target layer's
    attention weights (B, n_head, T, T)) with that head's write removed from the target's `kind` input."""
    lb, hb = target
    stream, outputs = _stream_and_head_outputs(model, idx, heads=True)
    rope = model.rope_freqs[:idx.shape[1]] if model.config.pos == "rope" else None  # (T, hd/2, 2), as GPT passes it
    writes = {la: _head_writes(model, la, outputs) for la in {la for la, _ in sources}}  # (H, B, T, d) each
    removed = []
    for la, a in sources:
        write = writes[la][a]  # (B, T, d_model)
        removed.append(write if mode == "zero" else write - write.mean(dim=(0, 1), keepdim=True))
    results = []
    chunk = _path_rows(model, idx)
    for first in range(0, len(sources), chunk):
        part = torch.stack(removed[first:first + chunk])  # (n, B, T, d)
        n, B, T, d = part.shape
        x = stream[lb].expand(n, B, T, d).reshape(n * B, T, d)
        out, weights = _layer_with_one_input_replaced(model, lb, x, x - part.reshape(n * B, T, d), kind, hb, rope)
        hidden = _final_hidden(model, lb, out).view(n, B, T, -1)
        weights = weights.view(n, B, *weights.shape[1:])
        results.extend((hidden[i], weights[i]) for i in range(n))
    return results


@torch.no_grad()
def path_ablation(model, text_idx: torch.Tensor, probe_idx: torch.Tensor | None, kind: str, target: tuple[int, int],
                  sources: Sequence[tuple[int, int]] | None = None, mode: str = "zero") -> dict[str, np.ndarray]:
    """Remove source head A's write from target head B's `kind` input only, and measure what changes:

        x_B = x_b - c_A          for B's query (kind "q"), key or value ("k", "v") input alone,

    x_b the residual stream entering B's layer lb, c_A = out_A W_O^A what head A of an earlier layer la wrote into
    it (mode "zero"; "mean": c_A - its mean over the batch and positions, i.e. A's write replaced by its mean). B's
    layer's other heads and B's other inputs read the intact x_b, and so do all later layers: only the direct path
    A -> B's kind input is cut (paths through layers between la and lb stay). B's input norm is recomputed on x_B.
    Under GQA the key and value inputs belong to B's kv head, so the whole group's heads see the change.

    target (lb, b): query head b of layer lb >= 1. sources: the (la, a) heads to remove, each with la < lb; default
    every head of every earlier layer. text_idx (B, T): the loss (of each next token of text_idx, as ablation_dloss)
    and prev_token; probe_idx (B, 1 + 2R), a role probe (insight.roles.role_probe), or None: duplicate_token
    and induction, measured on B's own attention weights.

    Returns {"dloss": (n,), "prev_token": (n,), "duplicate_token": (n,), "induction": (n,)} float64 for the n
    sources in order: path-ablated minus intact (nats; B's role score; NaN for the probe's roles without a probe).
    Eval mode (restored afterwards), no gradients."""
    if kind not in COMPOSITION_KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(COMPOSITION_KINDS)}")
    if mode not in PATH_ABLATION_MODES:
        raise ValueError(f"path ablation mode {mode!r}: one of {', '.join(PATH_ABLATION_MODES)}")
    config = model.config
    lb, hb = target
    if not (1 <= lb < config.n_layer and 0 <= hb < config.n_head):
        raise ValueError(f"target {target}: a (layer, head) with layer in 1..{config.n_layer - 1} and head in "
                         f"0..{config.n_head - 1}")
    sources = [(la, a) for la in range(lb) for a in range(config.n_head)] if sources is None else list(sources)
    for la, a in sources:
        if not (0 <= la < lb and 0 <= a < config.n_head):
            raise ValueError(f"source {(la, a)}: a head of a layer before the target's layer {lb}")
    if text_idx.dim() != 2 or text_idx.shape[1] < 2:
        raise ValueError(f"text_idx must be (B, T) token ids with T >= 2, got {tuple(text_idx.shape)}")
    text_targets = _targets(text_idx, None)
    count = int((text_targets >= 0).sum())
    result = {name: np.full(len(sources), np.nan) for name in ("dloss", *ROLE_NAMES)}
    with eval_mode(model):
        stream = model.residual_stream(text_idx)
        intact_loss = float(_summed_loss(model, model.final_norm(stream[-1]), text_targets)) / count
        intact_text = model.attention_maps(text_idx, [lb])[lb][:, hb:hb + 1]  # (B, 1, T, T)
        intact_prev = float(prev_token_score(intact_text)[0])
        for i, (hidden, weights) in enumerate(_path_ablated_runs(model, text_idx, kind, target, sources, mode)):
            result["dloss"][i] = float(_summed_loss(model, hidden, text_targets)) / count - intact_loss
            result["prev_token"][i] = float(prev_token_score(weights[:, hb:hb + 1])[0]) - intact_prev
        if probe_idx is not None:
            R = (probe_idx.shape[1] - 1) // 2
            intact_probe = model.attention_maps(probe_idx, [lb])[lb][:, hb:hb + 1]
            intact_roles = {"duplicate_token": float(duplicate_token_score(intact_probe, R)[0]),
                            "induction": float(induction_score(intact_probe, R)[0])}
            for i, (_, weights) in enumerate(_path_ablated_runs(model, probe_idx, kind, target, sources, mode)):
                w = weights[:, hb:hb + 1]  # (B, 1, T, T)
                result["duplicate_token"][i] = float(duplicate_token_score(w, R)[0]) - intact_roles["duplicate_token"]
                result["induction"][i] = float(induction_score(w, R)[0]) - intact_roles["induction"]
    return result


# --------------------------------------------------------------------------------------------------------------------
# Direct logit attribution
# --------------------------------------------------------------------------------------------------------------------

def _final_norm_parts(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The final norm at x (N, T, d_model), the last block's output, as final_norm(x) = _norm_linear(x) / scale
    + bias: returns (scale (N, T, 1), bias (d_model,) or None). RMSNorm: scale = sqrt(mean(x²) + eps);
    LayerNorm: sqrt(var(x) + eps). Frozen at x, the norm is linear in the components of x."""
    norm = model.final_norm
    if model.config.norm == "rmsnorm":
        return torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm.eps), None
    return torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps), norm.bias


def _norm_linear(model, c: torch.Tensor) -> torch.Tensor:
    """γ ⊙ P c for c (..., d_model): the final norm's gain γ, P = I (RMSNorm) or the mean's removal (LayerNorm)."""
    if model.config.norm == "layernorm":
        c = c - c.mean(dim=-1, keepdim=True)
    return model.final_norm.weight * c


@torch.no_grad()
def direct_logit_attribution(model, idx: torch.Tensor, targets: torch.Tensor | None = None,
                             relative_to_mean: bool = False) -> dict[str, np.ndarray]:
    """Each direct path's contribution to the correct next token's logit, at every counted position:

        logit[t] = Σ_components  N(c) · u_t  (+ the final norm's bias · u_t),

    the residual stream entering the final norm being the sum of its components c: the token embedding, the learned
    position embedding, every head's write out_h W_O^h, every layer's out_proj bias, every MLP's output. N is the
    final norm with its per-position scale frozen at the intact pass (_final_norm_parts), which makes it linear,
    and u_t the LM head's row of the target token t (relative_to_mean: u_t - the mean row, so contributions are to
    logit[t] - mean logit, what the softmax sees; the sum then equals that). As TransformerLens's logit_attrs.

    idx (B, T) token ids; targets (B, T) next tokens (-1 = not counted), by default idx shifted by one.
    Returns float64 arrays over the n counted positions (row-major in (B, T)):
      "heads": (n, n_layer, n_head), "mlp": (n, n_layer), "attn_bias": (n, n_layer), "embedding": (n,),
      "position": (n,), "norm_bias": (n,) (zeros where the model has no such path), "logit": (n,) the logit
      itself, from the LM head; the components sum to it to float tolerance.
    Mean over the first axis for the average over a text. Eval mode (restored afterwards), no gradients."""
    config = model.config
    targets = _targets(idx, targets)
    counted = targets >= 0  # (B, T)
    if not bool(counted.any()):
        raise ValueError("no position to score: every target is ignored (-1)")
    mlp_outputs: list[torch.Tensor] = []
    handles = [block.mlp.register_forward_hook(lambda module, args, out: mlp_outputs.append(out))
               for block in model.blocks]
    try:
        with eval_mode(model):
            stream, outputs = _stream_and_head_outputs(model, idx, heads=True)
    finally:
        for handle in handles:
            handle.remove()
    unembed = model.lm_head.weight  # (vocab, d_model)
    wanted = targets.clamp_min(0)
    u = unembed[wanted]  # (B, T, d_model): the target token's row at each position
    if relative_to_mean:
        u = u - unembed.mean(dim=0)
    scale, bias = _final_norm_parts(model, stream[-1])  # (B, T, 1)

    def attributed(c: torch.Tensor) -> np.ndarray:
        """(..., B, T, d_model) -> (n, ...) float64: N(c) · u_t at the counted positions."""
        per_position = (_norm_linear(model, c) / scale * u).sum(dim=-1)  # (..., B, T)
        return per_position[..., counted].movedim(-1, 0).double().cpu().numpy()

    T = idx.shape[1]
    zero = torch.zeros_like(stream[0])
    position = zero
    if model.pos_emb is not None:
        position = model.pos_emb(torch.arange(T, device=idx.device)).expand_as(stream[0])
    heads = torch.stack([_head_writes(model, layer, outputs) for layer in range(config.n_layer)])  # (L, H, B, T, d)
    biases = torch.stack([(block.attn.out_proj.bias if block.attn.out_proj.bias is not None
                           else torch.zeros(config.d_model, device=idx.device)).expand_as(stream[0])
                          for block in model.blocks])  # (L, B, T, d)
    logits = model.lm_head(model.final_norm(stream[-1]))  # (B, T, vocab)
    logit = logits.gather(-1, wanted[..., None])[..., 0]
    if relative_to_mean:
        logit = logit - logits.mean(dim=-1)
    norm_bias = (bias * u).sum(dim=-1) if bias is not None else torch.zeros_like(logit)
    return {
        "heads": attributed(heads),
        "mlp": attributed(torch.stack(mlp_outputs)),
        "attn_bias": attributed(biases),
        "embedding": attributed(model.tok_emb(idx)),
        "position": attributed(position),
        "norm_bias": norm_bias[counted].double().cpu().numpy(),
        "logit": logit[counted].double().cpu().numpy(),
    }


@torch.no_grad()
def ov_promoted_tokens(model, idx: torch.Tensor, layer: int, head: int, top: int = 5, attended: int = 5
                       ) -> list[dict]:
    """What head (layer, head) writes, in tokens: for each token id s it attends to over idx (B, T), the direct
    logits its write promotes per unit of attention on s,

        promoted_s[v] = Σ_{i, j: idx_j = s} w_ij · N_i(v_j W_O^h) · u_v  /  Σ_{i, j: idx_j = s} w_ij,

    w_ij the head's attention weight from query i to key j, v_j its value at j, N_i the final norm frozen at
    position i (direct_logit_attribution), u_v the LM head's row of token v, taken relative to the mean row (the
    softmax sees differences). Through the final norm directly: the write's effect through later layers is not
    counted.

    Returns, for the `attended` token ids with the most attention mass, most first: {"token": s, "attention":
    its share of the head's total attention, "promoted": [(v, promoted_s[v]), ...] the `top` largest, largest
    first}. Eval mode (restored afterwards), no gradients."""
    config = model.config
    n_rep = config.n_head // config.n_kv_head
    with eval_mode(model):
        stream = model.residual_stream(idx)
        found = model.attention_internals(idx, [layer])[layer]
    weights = found.weights[:, head]  # (B, T, T)
    values = found.v[:, head // n_rep]  # (B, T, hd)
    w_o = model.blocks[layer].attn.out_proj.weight[:, head * config.head_dim:(head + 1) * config.head_dim]  # (d, hd)
    writes = values @ w_o.T  # (B, T_k, d): what one unit of attention on key j writes
    scale, _ = _final_norm_parts(model, stream[-1])  # (B, T_q, 1): the frozen scale at each query position
    unembed = model.lm_head.weight.float()  # (vocab, d): float32 as the weights' sums below, whatever the model's dtype
    unembed = unembed - unembed.mean(dim=0)
    # N_i(write_j) = γ ⊙ P write_j / scale_i: the query's scale factors out of the sum over queries
    per_key = (weights / scale).sum(dim=1)  # (B, T_k): Σ_i w_ij / scale_i
    weighted = per_key[..., None] * _norm_linear(model, writes)  # (B, T_k, d)
    mass = weights.sum(dim=1)  # (B, T_k)
    ids = idx.reshape(-1)
    by_token_write = torch.zeros(config.vocab_size, config.d_model, dtype=weighted.dtype, device=idx.device)
    by_token_write.index_add_(0, ids, weighted.reshape(-1, config.d_model))
    by_token_mass = torch.zeros(config.vocab_size, dtype=mass.dtype, device=idx.device)
    by_token_mass.index_add_(0, ids, mass.reshape(-1))
    order = torch.argsort(by_token_mass, descending=True)[:attended]
    total = float(by_token_mass.sum())
    result = []
    for s in order.tolist():
        if by_token_mass[s] <= 0:
            break
        promoted = unembed @ (by_token_write[s] / by_token_mass[s])  # (vocab,)
        best = torch.topk(promoted, min(top, promoted.shape[0]))
        result.append({"token": s, "attention": float(by_token_mass[s]) / total,
                       "promoted": [(int(v), float(p)) for v, p in zip(best.indices, best.values)]})
    return result

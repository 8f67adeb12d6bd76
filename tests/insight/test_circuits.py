"""Circuits (insight/circuits.py) against independent computations: composition scores rebuilt as full
d_model × d_model matrices from the raw state dict, their chance level against sampled random rotations, direct
logit attribution against the logits, and path ablation against a forward pass patched by hand with a hook."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from insight.circuits import (COMPOSITION_KINDS, composition_scores, composition_zscores, direct_logit_attribution,
                              ov_promoted_tokens, path_ablation, rope_rotations)
from insight.roles import duplicate_token_score, induction_score, prev_token_score, role_probe
from model import GPT, ModelConfig
from model.gpt import apply_rope

SHAPES = {
    "mha-rmsnorm-rope": dict(n_head=4, n_kv_head=4, pos="rope", norm="rmsnorm", mlp="swiglu"),
    "gqa-rmsnorm-rope": dict(n_head=4, n_kv_head=2, pos="rope", norm="rmsnorm", mlp="swiglu"),
    "mha-layernorm-learned": dict(n_head=4, n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True),
    "gqa-layernorm-rope": dict(n_head=4, n_kv_head=2, pos="rope", norm="layernorm", mlp="gelu", bias=True),
    "mqa-rmsnorm-learned": dict(n_head=4, n_kv_head=1, pos="learned", norm="rmsnorm", mlp="gelu",
                                tie_embeddings=True),
}
VOCAB, BLOCK = 48, 20


def tiny(shape: str = "gqa-rmsnorm-rope", seed: int = 0, **extra) -> GPT:
    """A 3-layer model whose norms have gains (and biases) away from 1 (and 0), so that folding them matters, and
    whose heads write strongly enough to move the loss."""
    torch.manual_seed(seed)
    model = GPT(ModelConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=3, d_model=32, attn_impl="manual",
                            **{**SHAPES[shape], **extra}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
        for block in model.blocks:
            block.attn.out_proj.weight.mul_(20.0)
            block.attn.qkv_proj.weight.mul_(8.0)  # sharp attention: a path cut moves the maps and the loss
    return model.eval()


def text_and_probe(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    text = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(seed))
    return text, role_probe(range(1, VOCAB), 0, BLOCK, batch=3, seed=seed)


# --- composition from the raw weights --------------------------------------------------------------------------

def rope_matrix(config: ModelConfig, offset: int) -> torch.Tensor:
    """(hd, hd): the rotation RoPE applies to a row vector at position `offset`, built from complex numbers:
    channel pair j is multiplied by exp(i · offset · theta^(-2j/hd))."""
    hd = config.head_dim
    rows = []
    for e in torch.eye(hd, dtype=torch.float64):
        z = torch.complex(e[0::2], e[1::2])  # (hd/2,)
        angle = offset * config.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        rotated = z * torch.exp(1j * angle)
        rows.append(torch.stack([rotated.real, rotated.imag], dim=-1).reshape(hd))
    return torch.stack(rows)  # row i: the image of basis vector i


def raw_head_matrices(model: GPT) -> dict:
    """From the state dict alone: per layer, full (d, d) matrices W_OV^h and the pieces of W_QK^h, with the layer's
    input norm folded in (gain, and LayerNorm's centring on both sides)."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    H, K, hd, d = c.n_head, c.n_kv_head, c.head_dim, c.d_model
    centre = torch.eye(d, dtype=torch.float64) - torch.full((d, d), 1.0 / d, dtype=torch.float64)
    layers = []
    for layer in range(c.n_layer):
        qkv = sd[f"blocks.{layer}.attn.qkv_proj.weight"]
        out = sd[f"blocks.{layer}.attn.out_proj.weight"]
        gain = sd[f"blocks.{layer}.attn_norm.weight"]
        read = torch.diag(gain) if c.norm == "rmsnorm" else centre @ torch.diag(gain)
        write = torch.eye(d, dtype=torch.float64) if c.norm == "rmsnorm" else centre
        heads = []
        for h in range(H):
            g = h // (H // K)
            w_q = read @ qkv[h * hd:(h + 1) * hd].T  # (d, hd)
            w_k = read @ qkv[(H + g) * hd:(H + g + 1) * hd].T
            w_v = read @ qkv[(H + K + g) * hd:(H + K + g + 1) * hd].T
            w_o = out[:, h * hd:(h + 1) * hd].T @ write  # (hd, d)
            heads.append(dict(q=w_q, k=w_k, ov=w_v @ w_o, kv=g))
        layers.append(heads)
    return layers


def raw_reading_matrix(model: GPT, heads: list[dict], kind: str, target: int, group: bool, offsets) -> torch.Tensor:
    """W^B of one target, (d, n · d): its matrices at every offset (and every head of the group) side by side."""
    n_rep = model.config.n_head // model.config.n_kv_head
    members = [h for h in range(model.config.n_head) if h // n_rep == target] if group else [target]
    blocks = []
    for h in members:
        if kind == "v":
            blocks.append(heads[h]["ov"])
            continue
        for offset in offsets:
            rotation = (rope_matrix(model.config, offset) if model.config.pos == "rope"
                        else torch.eye(model.config.head_dim, dtype=torch.float64))
            qk = heads[h]["q"] @ rotation @ heads[h]["k"].T  # (d, d): x_q W_QK x_kᵀ at distance offset
            blocks.append(qk if kind == "q" else qk.T)
    return torch.cat(blocks, dim=1)


def raw_composition(model: GPT, group_kv: bool, offsets) -> dict[str, np.ndarray]:
    c = model.config
    layers = raw_head_matrices(model)
    n_targets = {"q": c.n_head, "k": c.n_kv_head if group_kv else c.n_head, "v": c.n_kv_head if group_kv else c.n_head}
    found = {kind: np.full((c.n_layer, c.n_head, c.n_layer, n_targets[kind]), np.nan) for kind in COMPOSITION_KINDS}
    for la in range(c.n_layer):
        for lb in range(la + 1, c.n_layer):
            for kind in COMPOSITION_KINDS:
                for b in range(n_targets[kind]):
                    reading = raw_reading_matrix(model, layers[lb], kind, b, group_kv and kind != "q", offsets)
                    for a in range(c.n_head):
                        writing = layers[la][a]["ov"]
                        found[kind][la, a, lb, b] = float(torch.linalg.norm(writing @ reading)
                                                          / (torch.linalg.norm(writing) * torch.linalg.norm(reading)))
    return found


@pytest.mark.parametrize("group_kv", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_composition_equals_the_formula_on_full_matrices_from_the_state_dict(shape, group_kv):
    model = tiny(shape)
    offsets = range(BLOCK) if model.config.pos == "rope" else [0]
    scores = composition_scores(model, group_kv=group_kv)
    expected = raw_composition(model, group_kv, offsets)
    for kind in COMPOSITION_KINDS:
        assert scores[kind].shape == expected[kind].shape
        # NaN where la >= lb in both; rtol: the model's RoPE table is float32
        np.testing.assert_allclose(scores[kind], expected[kind], rtol=1e-6, atol=1e-12)
    assert np.isnan(scores["k"][1, :, 0]).all() and np.isnan(scores["q"][2, :, 2]).all()
    assert np.isfinite(scores["v"][0, :, 2]).all()


@pytest.mark.parametrize("shape", ["gqa-rmsnorm-rope", "gqa-layernorm-rope"])
def test_rope_offsets_choose_the_distances_and_zero_alone_is_the_unrotated_form(shape):
    model = tiny(shape)
    for offsets in ([0], [3], [1, 7, 19]):
        scores = composition_scores(model, rope_offsets=offsets)
        expected = raw_composition(model, True, offsets)
        for kind in COMPOSITION_KINDS:
            np.testing.assert_allclose(scores[kind], expected[kind], rtol=1e-6, atol=1e-12)
    every, unrotated = composition_scores(model), composition_scores(model, rope_offsets=[0])
    assert not np.allclose(every["k"][0, :, 1], unrotated["k"][0, :, 1], atol=1e-4)  # RoPE changes Q and K ...
    np.testing.assert_allclose(every["v"], unrotated["v"], rtol=1e-12)  # ... and never V


def test_rope_offsets_are_refused_without_rope_or_out_of_range():
    learned = tiny("mha-layernorm-learned")
    np.testing.assert_allclose(composition_scores(learned, rope_offsets=[0])["q"], composition_scores(learned)["q"])
    with pytest.raises(ValueError, match="no RoPE"):
        composition_scores(learned, rope_offsets=[2])
    with pytest.raises(ValueError, match="block_size"):
        composition_scores(tiny(), rope_offsets=[BLOCK])


def test_rope_rotations_are_what_the_model_applies():
    model = tiny()
    x = torch.randn(1, BLOCK, 4, model.config.head_dim, generator=torch.Generator().manual_seed(0))
    rotated = apply_rope(x, model.rope_freqs[:BLOCK]).double()
    rotations = rope_rotations(model, list(range(BLOCK)))  # (BLOCK, hd, hd)
    by_hand = torch.einsum("thc,tce->the", x[0].double(), rotations)
    torch.testing.assert_close(by_hand, rotated[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(rotations[4], rope_matrix(model.config, 4), atol=1e-6, rtol=0)


def test_a_head_that_writes_nothing_composes_with_nothing():
    model = tiny()
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight[:, :model.config.head_dim] = 0.0  # head 0 of layer 0
    scores = composition_scores(model)
    assert all(np.isnan(scores[kind][0, 0, 1:]).all() for kind in COMPOSITION_KINDS)  # 0 / 0: undefined
    assert np.isfinite(scores["k"][0, 1, 1:]).all()


# --- the chance level: a random rotation of the residual stream ------------------------------------------------

def random_rotation(n: int, gen: torch.Generator) -> torch.Tensor:
    """Haar-distributed (n, n) orthogonal: QR of a Gaussian, columns' signs fixed by R's diagonal."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


@pytest.mark.parametrize("shape", ["mha-rmsnorm-rope", "mha-layernorm-learned"])
def test_the_chance_level_is_the_mean_and_spread_over_random_rotations(shape):
    """z = (s² - E) / sd: E and sd checked against 3000 rotations Q of the residual stream between A and B,
    s²(Q) = ‖A Q B‖² / (‖A‖² ‖B‖²) on the full matrices; under LayerNorm Q turns only the centred subspace."""
    model = tiny(shape)
    d = model.config.d_model
    layers = raw_head_matrices(model)
    gen = torch.Generator().manual_seed(0)
    if model.config.norm == "layernorm":  # an orthonormal basis of the vectors with mean 0, and 1/sqrt(d) beside it
        basis, _ = torch.linalg.qr(torch.cat([torch.ones(d, 1, dtype=torch.float64),
                                              torch.randn(d, d - 1, generator=gen, dtype=torch.float64)], dim=1))
        centred = basis[:, 1:]  # (d, d - 1)
        rotations = [centred @ random_rotation(d - 1, gen) @ centred.T + basis[:, :1] @ basis[:, :1].T
                     for _ in range(3000)]
    else:
        rotations = [random_rotation(d, gen) for _ in range(3000)]
    offsets = range(BLOCK) if model.config.pos == "rope" else [0]
    scores, z = composition_scores(model), composition_zscores(model)
    for kind, (a, b) in [("k", (1, 2)), ("q", (3, 0)), ("v", (2, 2))]:
        writing = layers[0][a]["ov"]
        reading = raw_reading_matrix(model, layers[1], kind, b, False, offsets)
        scale = float(torch.linalg.norm(writing) * torch.linalg.norm(reading)) ** 2
        null = np.array([float(torch.linalg.norm(writing @ q @ reading)) ** 2 / scale for q in rotations])
        n = d - (model.config.norm == "layernorm")
        assert null.mean() == pytest.approx(1 / n, rel=0.05)
        spread = (scores[kind][0, a, 1, b] ** 2 - 1 / n) / z[kind][0, a, 1, b]  # the sd z divided by
        assert spread == pytest.approx(null.std(), rel=0.08)


def test_z_rises_for_an_edge_built_into_the_weights():
    """Head 1 of layer 1 made to read its keys exactly where head 2 of layer 0 writes: a z far above the
    others into that target, while the raw scores of the same pair stay below 1."""
    model = tiny("mha-rmsnorm-rope")
    c = model.config
    hd = c.head_dim
    with torch.no_grad():
        w_o = model.blocks[0].attn.out_proj.weight[:, 2 * hd:3 * hd]  # (d, hd): where L0.H2 writes
        gain = model.blocks[1].attn_norm.weight
        model.blocks[1].attn.qkv_proj.weight[(c.n_head + 1) * hd:(c.n_head + 2) * hd] = (w_o / gain[:, None]).T
    z = composition_zscores(model)["k"][0, :, 1, 1]
    assert z[2] > 3 * np.delete(z, 2).max() and z[2] > 10


# --- direct logit attribution ----------------------------------------------------------------------------------

@pytest.mark.parametrize("relative_to_mean", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_direct_attributions_sum_to_the_logit(shape, relative_to_mean):
    model = tiny(shape)
    text, _ = text_and_probe()
    found = direct_logit_attribution(model, text, relative_to_mean=relative_to_mean)
    n = text.shape[0] * (text.shape[1] - 1)  # the last position has no next token
    assert found["heads"].shape == (n, 3, 4) and found["mlp"].shape == (n, 3) and found["logit"].shape == (n,)
    total = (found["heads"].sum(axis=(1, 2)) + found["mlp"].sum(axis=1) + found["attn_bias"].sum(axis=1)
             + found["embedding"] + found["position"] + found["norm_bias"])
    with torch.no_grad():
        logits, _ = model(text)  # the independent logits: GPT.forward
    wanted = logits[:, :-1].gather(-1, text[:, 1:, None])[..., 0]
    if relative_to_mean:
        wanted = wanted - logits[:, :-1].mean(dim=-1)
    np.testing.assert_allclose(found["logit"], wanted.reshape(-1).double().numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(total, found["logit"], atol=1e-4, rtol=1e-6)
    assert np.abs(found["heads"]).max() > 0.01  # the heads contribute: a wrong split would show
    if model.config.pos == "rope":
        assert not found["position"].any()


def test_attribution_counts_the_targets_given_and_a_silent_head_gets_zero():
    model = tiny()
    text, _ = text_and_probe()
    targets = torch.full_like(text, -1)
    targets[0, 3], targets[1, 10] = 5, 7
    found = direct_logit_attribution(model, text, targets=targets)
    assert found["logit"].shape == (2,)
    with torch.no_grad():
        logits, _ = model(text)
    np.testing.assert_allclose(found["logit"], [logits[0, 3, 5].item(), logits[1, 10, 7].item()], atol=1e-5)
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 2 * 8:3 * 8] = 0.0
    assert not direct_logit_attribution(model, text)["heads"][:, 1, 2].any()
    with pytest.raises(ValueError, match="every target is ignored"):
        direct_logit_attribution(model, text, targets=torch.full_like(text, -1))


def test_promoted_tokens_add_up_to_the_heads_attribution_of_every_token():
    """Σ_s attention(s) · promoted_s[v] over the tokens attended, times the head's total attention, is the head's
    direct attribution to token v relative to the mean, summed over every query position."""
    model = tiny("mha-layernorm-learned")
    text, _ = text_and_probe()
    layer, head, v = 1, 2, 11
    listed = ov_promoted_tokens(model, text, layer, head, top=VOCAB, attended=VOCAB)
    total_attention = text.numel()  # every query row's weights sum to 1
    assert sum(entry["attention"] for entry in listed) == pytest.approx(1.0)
    mine = sum(entry["attention"] * dict(entry["promoted"])[v] for entry in listed) * total_attention
    attribution = direct_logit_attribution(model, text, targets=torch.full_like(text, v), relative_to_mean=True)
    assert mine == pytest.approx(attribution["heads"][:, layer, head].sum(), rel=1e-4, abs=1e-4)
    top3 = ov_promoted_tokens(model, text, layer, head, top=3, attended=2)
    assert len(top3) == 2 and all(len(entry["promoted"]) == 3 for entry in top3)
    assert top3[0]["attention"] >= top3[1]["attention"]
    assert [p for _, p in top3[0]["promoted"]] == sorted((p for _, p in top3[0]["promoted"]), reverse=True)


# --- path ablation against a forward pass patched by hand ------------------------------------------------------

def intact_pieces(model: GPT, idx: torch.Tensor, source: tuple[int, int], target_layer: int):
    """From hooks on an intact pass: the residual stream entering the target's layer (B, T, d) and what the
    source head wrote, out_h W_O^hᵀ (B, T, d)."""
    found = {}
    hd = model.config.head_dim
    la, a = source

    def keep_input(module, args):
        found["x"] = args[0].detach().clone()

    def keep_write(module, args):
        out_h = args[0][..., a * hd:(a + 1) * hd]  # (B, T, hd): out_proj's input, the heads side by side
        found["write"] = out_h @ module.weight[:, a * hd:(a + 1) * hd].T

    handles = [model.blocks[target_layer].register_forward_pre_hook(keep_input),
               model.blocks[la].attn.out_proj.register_forward_pre_hook(keep_write)]
    with torch.no_grad():
        model(idx)
    for handle in handles:
        handle.remove()
    return found["x"], found["write"]


def hand_patched(model: GPT, idx: torch.Tensor, kind: str, source: tuple[int, int], target: tuple[int, int],
                 mode: str) -> tuple[float, torch.Tensor]:
    """(mean loss of idx's next tokens, the target layer's maps (B, H, T, T)) with the target's q, k or v columns
    of qkv_proj's output recomputed from the residual stream less the source's write, by a forward hook."""
    c = model.config
    lb, hb = target
    hd, H, K = c.head_dim, c.n_head, c.n_kv_head
    x, write = intact_pieces(model, idx, source, lb)
    if mode == "mean":
        write = write - write.mean(dim=(0, 1), keepdim=True)
    g = hb // (H // K)
    start = {"q": hb, "k": H + g, "v": H + K + g}[kind] * hd
    block = model.blocks[lb]
    replacement = F.linear(block.attn_norm(x - write), block.attn.qkv_proj.weight,
                           block.attn.qkv_proj.bias)[..., start:start + hd]  # (B, T, hd)

    def replace(module, args, output):
        patched = output.clone()
        patched[..., start:start + hd] = replacement
        return patched

    handle = block.attn.qkv_proj.register_forward_hook(replace)
    try:
        with torch.no_grad():
            logits, _ = model(idx)
            maps = model.attention_maps(idx, [lb])[lb]
    finally:
        handle.remove()
    loss = F.cross_entropy(logits[:, :-1].double().flatten(0, 1), idx[:, 1:].flatten()).item()
    return loss, maps


def intact_loss(model: GPT, idx: torch.Tensor) -> float:
    with torch.no_grad():
        logits, _ = model(idx)
    return F.cross_entropy(logits[:, :-1].double().flatten(0, 1), idx[:, 1:].flatten()).item()


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("shape", ["gqa-rmsnorm-rope", "mha-layernorm-learned"])
def test_path_ablation_equals_a_forward_patched_by_hand(shape, mode):
    model = tiny(shape)
    text, probe = text_and_probe()
    R = (probe.shape[1] - 1) // 2
    for kind, target in [("q", (1, 3)), ("k", (2, 1)), ("v", (2, 2))]:
        sources = [(0, 1), (target[0] - 1, 2)]
        found = path_ablation(model, text, probe, kind, target, sources=sources, mode=mode)
        hb = target[1]
        with torch.no_grad():
            intact_text = model.attention_maps(text, [target[0]])[target[0]][:, hb:hb + 1]
            intact_probe = model.attention_maps(probe, [target[0]])[target[0]][:, hb:hb + 1]
        for i, source in enumerate(sources):
            patched_text_loss, text_maps = hand_patched(model, text, kind, source, target, mode)
            _, probe_maps = hand_patched(model, probe, kind, source, target, mode)
            assert found["dloss"][i] == pytest.approx(patched_text_loss - intact_loss(model, text), abs=2e-5)
            assert found["prev_token"][i] == pytest.approx(
                prev_token_score(text_maps[:, hb:hb + 1])[0] - prev_token_score(intact_text)[0], abs=2e-6)
            assert found["induction"][i] == pytest.approx(
                induction_score(probe_maps[:, hb:hb + 1], R)[0] - induction_score(intact_probe, R)[0], abs=2e-6)
            assert found["duplicate_token"][i] == pytest.approx(
                duplicate_token_score(probe_maps[:, hb:hb + 1], R)[0] - duplicate_token_score(intact_probe, R)[0],
                abs=2e-6)
        # the cut paths matter in this model, by far more than the tolerances above
        assert max(np.abs(found["dloss"]).max(), np.abs(found["prev_token"]).max()) > 1e-3


@pytest.mark.parametrize("kind", COMPOSITION_KINDS)
def test_path_ablation_of_a_head_that_writes_nothing_changes_nothing(kind):
    model = tiny()
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight[:, 3 * 8:4 * 8] = 0.0  # head 3 of layer 0 writes nothing
    text, probe = text_and_probe()
    found = path_ablation(model, text, probe, kind, (2, 1), sources=[(0, 3), (1, 0)])
    for name, values in found.items():
        assert abs(values[0]) < 1e-6, name
    assert np.abs(found["dloss"][1]) > 1e-5  # the other source does move the loss


def test_path_ablation_is_not_the_heads_removal_and_leaves_the_model_as_it_was():
    from insight.ablation import ablation_dloss
    model = tiny(dropout=0.3).train()
    before = copy.deepcopy(model.state_dict())
    text, probe = text_and_probe()
    found = {kind: path_ablation(model, text, probe, kind, (1, 0)) for kind in COMPOSITION_KINDS}
    assert model.training and all(block.attn.head_patch is None for block in model.blocks)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.eval()
    assert len(found["q"]["dloss"]) == 4  # default sources: every head of layer 0
    removed = ablation_dloss(model, text)[0]
    for kind in COMPOSITION_KINDS:  # one path of a head is not all of its paths
        assert not np.allclose(found[kind]["dloss"], removed, atol=1e-4)


def test_path_ablation_without_a_probe_and_its_refusals():
    model = tiny()
    text, _ = text_and_probe()
    found = path_ablation(model, text, None, "k", (1, 2))
    assert np.isnan(found["induction"]).all() and np.isfinite(found["dloss"]).all()
    with pytest.raises(ValueError, match="kind"):
        path_ablation(model, text, None, "o", (1, 2))
    with pytest.raises(ValueError, match="mode"):
        path_ablation(model, text, None, "k", (1, 2), mode="off")
    with pytest.raises(ValueError, match="target"):
        path_ablation(model, text, None, "k", (0, 2))
    with pytest.raises(ValueError, match="before the target"):
        path_ablation(model, text, None, "k", (1, 2), sources=[(1, 0)])
    assert math.isfinite(path_ablation(model, text, None, "v", (2, 3), sources=[(1, 1)])["dloss"][0])

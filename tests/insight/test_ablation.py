"""Head ablation (insight/ablation.py) against independent computations on copies of the model whose weights
are edited by hand, and the model hooks it runs on (HeadPatch, GPT.residual_stream, GPT.hidden_from)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from insight.ablation import ABLATION_MODES, ablation_dloss, default_heads_per_pass, token_losses
from model import GPT, ModelConfig
from model.gpt import HeadPatch

SHAPES = {
    "gqa-rope": dict(n_head=4, n_kv_head=2, pos="rope", norm="rmsnorm", mlp="swiglu"),
    "mha-learned-bias": dict(n_head=4, n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True),
    "mqa": dict(n_head=4, n_kv_head=1, pos="rope", norm="rmsnorm", mlp="gelu"),
}


def tiny(shape: str = "gqa-rope", attn_impl: str = "manual", seed: int = 0, **extra) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(vocab_size=48, block_size=20, n_layer=3, d_model=32, attn_impl=attn_impl,
                            **{**SHAPES[shape], **extra}))
    with torch.no_grad():  # larger out_proj weights than GPT-2's init, so every head moves the loss visibly
        for block in model.blocks:
            block.attn.out_proj.weight.mul_(20.0)
    return model.eval()


def loss_of(model: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None) -> float:
    """The independent loss: GPT.forward's own cross-entropy, in float64 from its logits."""
    with torch.no_grad():
        if targets is None:
            logits, _ = model(idx[:, :-1])
            targets = idx[:, 1:]
        else:
            logits, _ = model(idx)
    return float(F.cross_entropy(logits.double().flatten(0, 1), targets.flatten(), ignore_index=-1))


def w_o_columns(model: GPT, layer: int, head: int) -> slice:
    head_dim = model.config.head_dim
    return slice(head * head_dim, (head + 1) * head_dim)


def zeroed_head(model: GPT, layer: int, head: int) -> GPT:
    """A copy whose W_O^h (out_proj's columns of head h in `layer`) is zero: the head writes nothing."""
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.blocks[layer].attn.out_proj.weight[:, w_o_columns(model, layer, head)] = 0.0
    return edited


def head_output_means(model: GPT, idx: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each head's output averaged over batch and positions, (n_head, head_dim) per layer, recomputed from
    attention_internals: out_h = weights_h @ v of the kv head it reads."""
    n_rep = model.config.n_head // model.config.n_kv_head
    means = {}
    for layer, internals in model.attention_internals(idx).items():
        v = internals.v.repeat_interleave(n_rep, dim=1)  # (B, n_head, T, head_dim)
        means[layer] = (internals.weights @ v).mean(dim=(0, 2))  # (n_head, head_dim)
    return means


def mean_folded_into_bias(model: GPT, layer: int, head: int, mean: torch.Tensor) -> GPT:
    """A copy where head h writes its mean output whatever the input: W_O^h zeroed, W_O^h mean added to
    out_proj's bias (a new bias for a model without biases)."""
    edited = copy.deepcopy(model)
    out_proj = edited.blocks[layer].attn.out_proj
    with torch.no_grad():
        columns = w_o_columns(model, layer, head)
        constant = out_proj.weight[:, columns] @ mean  # (d_model,)
        out_proj.weight[:, columns] = 0.0
        if out_proj.bias is None:
            out_proj.bias = nn.Parameter(constant)
        else:
            out_proj.bias += constant
    return edited


# --- ablation_dloss against edited copies ------------------------------------------------------------------------

@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_zero_ablation_equals_zeroing_the_heads_output_columns(shape, attn_impl):
    model = tiny(shape, attn_impl)
    idx = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(1))
    dloss = ablation_dloss(model, idx, "zero")
    assert dloss.shape == (3, 4) and dloss.dtype == np.float64
    intact = loss_of(model, idx)
    expected = np.array([[loss_of(zeroed_head(model, l, h), idx) - intact for h in range(4)] for l in range(3)])
    np.testing.assert_allclose(dloss, expected, atol=1e-5, rtol=0)
    assert np.abs(expected).max() > 1e-3  # the heads matter: a wrong head or layer would show


@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])
@pytest.mark.parametrize("shape", ["gqa-rope", "mha-learned-bias"])
def test_mean_ablation_equals_folding_the_mean_output_into_the_bias(shape, attn_impl):
    model = tiny(shape, attn_impl)
    idx = torch.randint(0, 48, (3, 16), generator=torch.Generator().manual_seed(2))
    dloss = ablation_dloss(model, idx, "mean")
    means = head_output_means(model, idx)
    intact = loss_of(model, idx)
    expected = np.array([[loss_of(mean_folded_into_bias(model, l, h, means[l][h]), idx) - intact
                          for h in range(4)] for l in range(3)])
    np.testing.assert_allclose(dloss, expected, atol=1e-5, rtol=0)
    assert not np.allclose(dloss, ablation_dloss(model, idx, "zero"), atol=1e-4)  # the mode is not ignored


def test_targets_are_the_positions_scored_and_minus_one_is_skipped():
    model = tiny()
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 48, (2, 20), generator=gen)
    targets = torch.randint(0, 48, (2, 20), generator=gen)
    targets[0, :7] = -1
    targets[1, 12:] = -1
    dloss = ablation_dloss(model, idx, "zero", targets=targets)
    intact = loss_of(model, idx, targets)
    for layer, head in [(0, 0), (1, 3), (2, 1)]:
        assert dloss[layer, head] == pytest.approx(loss_of(zeroed_head(model, layer, head), idx, targets) - intact,
                                                   abs=1e-5)
    assert not np.allclose(dloss, ablation_dloss(model, idx, "zero"), atol=1e-4)
    with pytest.raises(ValueError, match="idx's shape"):
        ablation_dloss(model, idx, targets=targets[:, 1:])
    with pytest.raises(ValueError, match="every target is ignored"):
        ablation_dloss(model, idx, targets=torch.full_like(idx, -1))


@pytest.mark.parametrize("heads_per_pass", [1, 3, 4, 100])
def test_heads_per_pass_changes_only_the_batching(heads_per_pass):
    model = tiny()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(4))
    for mode in ("zero", "mean"):
        np.testing.assert_allclose(ablation_dloss(model, idx, mode, heads_per_pass=heads_per_pass),
                                   ablation_dloss(model, idx, mode), atol=1e-6, rtol=0)


def test_default_heads_per_pass_is_all_heads_within_the_memory_budget(monkeypatch):
    model = tiny()
    assert default_heads_per_pass(model, 2, 12) == 4
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(4))
    all_at_once = ablation_dloss(model, idx)
    per_copy = 4 * 2 * 12 * (3 * 4 * 12 + model.config.hidden_dim + 4 * 32)
    monkeypatch.setattr("insight.ablation.ABLATION_BUDGET_BYTES", 2 * per_copy)
    assert default_heads_per_pass(model, 2, 12) == 2
    monkeypatch.setattr("insight.ablation.ABLATION_BUDGET_BYTES", 1)
    assert default_heads_per_pass(model, 2, 12) == 1
    np.testing.assert_allclose(ablation_dloss(model, idx), all_at_once, atol=1e-6, rtol=0)


def test_ablation_runs_in_eval_mode_and_leaves_the_model_as_it_was():
    model = tiny(dropout=0.5).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(5))
    first = ablation_dloss(model, idx)
    assert model.training and all(block.attn.head_patch is None for block in model.blocks)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    np.testing.assert_array_equal(first, ablation_dloss(model, idx))  # no dropout: the same numbers again
    model.eval()
    assert first[1, 2] == pytest.approx(loss_of(zeroed_head(model, 1, 2), idx) - loss_of(model, idx), abs=1e-5)


def test_modes_other_than_zero_and_mean_are_refused():
    assert ABLATION_MODES == ("zero", "mean", "off")
    model = tiny()
    idx = torch.randint(0, 48, (1, 8))
    for mode in ("off", "Zero", "ones"):
        with pytest.raises(ValueError, match="'zero' or 'mean'"):
            ablation_dloss(model, idx, mode)


def test_token_losses_are_the_per_position_cross_entropy():
    model = tiny(dropout=0.5).train()
    idx = torch.randint(0, 48, (3, 20), generator=torch.Generator().manual_seed(6))
    losses = token_losses(model, idx)
    assert losses.shape == (3, 19) and losses.dtype == torch.float32 and model.training
    model.eval()
    with torch.no_grad():
        logits, loss = model(idx[:, :-1], idx[:, 1:])
    for b, i in [(0, 0), (1, 7), (2, 18)]:
        assert losses[b, i].item() == pytest.approx(-torch.log_softmax(logits[b, i].double(), -1)[idx[b, i + 1]].item(),
                                                    abs=1e-5)
    assert losses.mean().item() == pytest.approx(loss.item(), abs=1e-6)


# --- the model hooks ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", list(SHAPES))
def test_hidden_from_any_layer_of_the_residual_stream_gives_the_forward_logits(shape):
    model = tiny(shape)
    idx = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, _ = model(idx)
        stream = model.residual_stream(idx)
        assert len(stream) == model.config.n_layer + 1
        np.testing.assert_allclose(model.logits(model.final_norm(stream[-1])), logits, atol=1e-5)
        for layer in range(model.config.n_layer):
            assert stream[layer].shape == (2, 20, 32)
            np.testing.assert_allclose(model.logits(model.hidden_from(layer, stream[layer])), logits, atol=1e-5)
        with pytest.raises(ValueError, match="out of range"):
            model.hidden_from(3, stream[0])
        with pytest.raises(ValueError, match="longer than block_size"):
            model.residual_stream(torch.zeros(1, 21, dtype=torch.long))
        with pytest.raises(ValueError, match="longer than block_size"):
            model.hidden_from(1, torch.zeros(1, 21, 32))
        model.setup_kv_cache(1)
        with pytest.raises(ValueError, match="clear_kv_cache"):
            model.residual_stream(idx)
        with pytest.raises(ValueError, match="clear_kv_cache"):
            model.hidden_from(0, stream[0])
        model.clear_kv_cache()


@pytest.mark.parametrize("values", [None, "given"])
def test_a_head_patch_acts_the_same_on_both_paths_and_row_by_row(values):
    manual = tiny("gqa-rope", "manual")
    fused = tiny("gqa-rope", "sdpa")
    idx = torch.randint(0, 48, (3, 20), generator=torch.Generator().manual_seed(8))
    keep = torch.tensor([[True, False, True, True], [False, False, True, True], [True, True, True, True]])
    given = torch.randn(1, 4, 1, manual.config.head_dim) if values else None
    results = []
    with torch.no_grad():
        for model in (manual, fused):
            model.blocks[1].attn.head_patch = HeadPatch(keep, given)
            results.append(model(idx)[0])
            model.blocks[1].attn.head_patch = None
        np.testing.assert_allclose(results[0], results[1], atol=1e-5)
        # row by row with a one-row patch: the same as one batch with a patch per row
        for row in range(3):
            manual.blocks[1].attn.head_patch = HeadPatch(keep[row:row + 1], given)
            np.testing.assert_allclose(manual(idx[row:row + 1])[0][0], results[0][row], atol=1e-5)
        manual.blocks[1].attn.head_patch = None
        assert torch.allclose(manual(idx)[0][2], results[0][2], atol=1e-5)  # row 2 kept every head
        assert not torch.allclose(manual(idx)[0][0], results[0][0], atol=1e-3)


def test_a_zero_patch_equals_zeroing_w_o_on_the_from_scratch_path_with_weights():
    model = tiny("mha-learned-bias")
    idx = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(9))
    keep = torch.tensor([[True, True, False, True]])
    model.blocks[0].attn.head_patch = HeadPatch(keep)
    patched_maps = model.attention_maps(idx)
    with torch.no_grad():
        patched = model(idx)[0]
    model.blocks[0].attn.head_patch = None
    edited = zeroed_head(model, 0, 2)
    with torch.no_grad():
        np.testing.assert_allclose(patched, edited(idx)[0], atol=1e-5)
    for layer, weights in edited.attention_maps(idx).items():  # later layers' maps see the patched stream
        np.testing.assert_allclose(patched_maps[layer], weights, atol=1e-6)

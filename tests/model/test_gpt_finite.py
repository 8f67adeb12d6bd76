"""The check every pass outside training ends with (model/gpt.py: GPT._check_finite): finite weights that
overflow never reach a caller as inf or NaN; the pass stops in one UserError naming the first layer whose
attention weights or output went non-finite. Generated models and overflowing layers (hypothesis), through
forward, generation (eager, no cache, compiled), the attention maps and the internals a dump is made of."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from model import GPT, ModelConfig
from model.generate import generate

SCORES = 1e30  # q, k of ~1e29: their products pass float32's 3.4e38, and the scores are inf - inf = NaN
MLP = 1e22  # fc_in and fc_out both: the MLP's hidden units ~1e21, its output past 3.4e38


def tiny_model(seed: int = 0, **shape) -> GPT:
    torch.manual_seed(seed)
    config = dict(vocab_size=32, block_size=16, n_layer=3, n_head=2, d_model=16)
    return GPT(ModelConfig(**{**config, **shape})).eval()


def scale(module: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)


def overflow(model: GPT, layer: int, part: str) -> str:
    """Scale layer's attention scores or MLP past float32; returns what the check should name."""
    if part == "attention weights":
        scale(model.blocks[layer].attn.qkv_proj, SCORES)
    else:
        scale(model.blocks[layer].mlp, MLP)
    return f"layer {layer}'s {part}"


def raises_naming(where: str, call) -> None:
    with pytest.raises(UserError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message and f"first appear in {where}," in message, message
    assert "computing in float32" in message and "use an earlier checkpoint" in message, message


shapes = st.fixed_dictionaries({
    "n_kv_head": st.sampled_from([1, 2]), "norm": st.sampled_from(["rmsnorm", "layernorm"]),
    "pos": st.sampled_from(["rope", "learned"]), "mlp": st.sampled_from(["swiglu", "gelu"]),
    "attn_impl": st.sampled_from(["sdpa", "manual"]), "tie_embeddings": st.booleans()})


@settings(max_examples=25, deadline=None)
@given(shape=shapes, layers=st.sets(st.integers(0, 2), min_size=1), part=st.sampled_from(["attention weights", "output"]),
       T=st.integers(2, 16), seed=st.integers(0, 99))
def test_the_first_overflowing_layer_is_named_by_every_pass(shape, layers, part, T, seed):
    """Any model shape, any set of layers whose attention scores or MLP overflow: forward, a generation (KV
    cache or not), the attention maps and the internals all stop naming the first of those layers and what
    overflowed there; the intact model's passes return finite numbers. (The fused kernel turns rows of NaN
    scores into zeros, which are finite: a pass that runs an overflowing layer's attention on it has nothing
    non-finite to report, and a pass that computes that layer's weights from scratch does.)"""
    model = tiny_model(seed, **shape)
    idx = torch.randint(0, 32, (2, T), generator=torch.Generator().manual_seed(seed))
    assert torch.isfinite(model(idx)[0]).all() and torch.isfinite(model.attention_maps(idx)[0]).all()
    where = [overflow(model, layer, part) for layer in sorted(layers)][0]
    every_pass = part == "output" or shape["attn_impl"] == "manual"
    if every_pass:
        raises_naming(where, lambda: model(idx))
        raises_naming(where, lambda: generate(model, idx[:, :T - 1], 2, temperature=0))  # the KV-cache prefill
        raises_naming(where, lambda: generate(model, idx[:, :T - 1], 2, temperature=0, use_kv_cache=False))
        raises_naming(where, lambda: model.attention_internals(idx, layers=[0]))
    raises_naming(where, lambda: model.attention_maps(idx))
    raises_naming(where, lambda: model.attention_internals(idx, layers=sorted(layers)))
    model.train()  # training has its own check of the loss and gradients (train.nonfinite): not this one
    logits = model(idx)[0]  # no UserError
    assert not (every_pass and torch.isfinite(logits).all())


@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])  # sdpa: the flat decode step (model/decode.py)
def test_a_decode_step_that_overflows_is_stopped_at_the_token_not_after(attn_impl):
    """The prefill is finite; the weights then grow (as a later step of training could leave them) and the
    next decode step through the KV cache overflows: stopped there, not sampled as token 0."""
    model = tiny_model(attn_impl=attn_impl)
    drawn = []

    def grow(token):
        drawn.append(int(token[0]))
        if len(drawn) == 1:
            overflow(model, 2, "attention weights")
    raises_naming("layer 2's attention weights",
                  lambda: generate(model, torch.zeros(1, 3, dtype=torch.long), 5, temperature=0, on_token=grow))
    assert len(drawn) == 1


def test_an_mlp_output_is_named_as_the_layers_output_and_the_head_as_itself():
    """Attention weights that stay finite but an MLP that overflows: the layer's output. Every layer finite but
    the untied LM head overflows: the final norm and LM head. The message gives the largest weight there."""
    model = tiny_model(tie_embeddings=False)
    idx = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(0))
    raises_naming(overflow(model, 1, "output"), lambda: model(idx))
    scale(model.blocks[1].mlp, 1 / MLP)
    assert torch.isfinite(model(idx)[0]).all()
    scale(model.final_norm, 1e20)
    scale(model.lm_head, 1e20)
    with pytest.raises(UserError, match="first appear in the final norm and LM head") as e:
        model(idx)
    largest = max(float(p.detach().abs().max()) for p in (model.lm_head.weight, model.final_norm.weight))
    assert f"its largest weight {largest:.3g}" in str(e.value)


def test_in_a_lower_precision_the_fix_is_float32():
    """A model in bfloat16 whose weights overflow there: the message says to compute in float32."""
    model = tiny_model(attn_impl="manual").to(torch.bfloat16)
    overflow(model, 0, "attention weights")
    with pytest.raises(UserError, match=r"layer 0's attention weights, computing in bfloat16 .*--dtype float32"):
        model(torch.zeros(1, 4, dtype=torch.long))


def test_the_compiled_decode_step_gets_the_same_check():
    """On a CPU the compiled step's logits are checked outside the graph: weights that grow after the first
    token stop the next compiled step, naming the layer, where it would otherwise feed NaN to sampling."""
    model = tiny_model()
    drawn = []

    def grow(token):
        drawn.append(int(token[0]))
        if len(drawn) == 1:
            overflow(model, 1, "output")
    raises_naming("layer 1's output", lambda: generate(
        model, torch.zeros(1, 3, dtype=torch.long), 4, temperature=0, compile=True, on_token=grow))
    assert len(drawn) == 1


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
       values=st.lists(st.sampled_from(["max", "-max", "tiny", "zero", "inf", "-inf", "nan", "one"]),
                       min_size=1, max_size=40),
       padding=st.integers(0, 70_000), data=st.data())
def test_the_one_reduction_check_agrees_with_isfinite_entry_by_entry(dtype, values, padding, data):
    """GPT._check_finite's test (model.gpt._all_finite, one min-and-max reduction) says 'finite' exactly when every
    entry is: extreme finite numbers pass, and an inf or a NaN fails wherever it sits in a row long enough for the
    reduction's vector lanes, its tail and its split between threads (a decode step's row: 50304 logits)."""
    from model.gpt import _all_finite
    info = torch.finfo(dtype)
    table = {"max": info.max, "-max": -info.max, "tiny": info.tiny, "zero": 0.0, "inf": float("inf"),
             "-inf": float("-inf"), "nan": float("nan"), "one": 1.0}
    x = torch.linspace(-1, 1, padding + len(values), dtype=torch.float64).to(dtype)
    at = data.draw(st.lists(st.integers(0, x.numel() - 1), min_size=len(values), max_size=len(values), unique=True))
    x[at] = torch.tensor([table[v] for v in values], dtype=dtype)
    x = x.reshape(1, 1, -1)
    assert _all_finite(x) == bool(torch.isfinite(x).all())


def test_a_pass_over_no_rows_is_finite():
    """An empty batch has nothing to overflow (a min-and-max reduction over nothing would raise instead)."""
    from model.gpt import _all_finite
    assert _all_finite(torch.empty(0, 3, 7))
    assert tiny_model()(torch.zeros(0, 3, dtype=torch.long))[0].shape == (0, 3, 32)

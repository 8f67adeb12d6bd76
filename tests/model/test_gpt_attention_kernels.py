"""The fast attention paths a model can take (GPT.set_attention_kernel: the fused kernel, the same on float32
copies under a bfloat16 autocast, chunked batched matmuls) and how `dtype: auto` chooses one (training/autotune.py):
the upcast computes exactly the float32 kernel's result rounded once, each setting reaches every layer and
only plain causal attention (decoding against a cache keeps the fused kernel), the paths give the same
numbers, and the choice follows the timings, prints them, survives a save and a resume, and is refused when
damaged. The matmul path's formula itself: tests/model/test_gpt_attention.py."""
from __future__ import annotations

import json
import math
import re
import types

import pytest
import torch
import torch.nn.functional as F

import training.autotune as autotune
from model import GPT, ModelConfig
from model.generate import generate
import model.gpt as gpt
from model.gpt import ATTENTION_KERNELS, causal_mask, fused_attention, scaled_dot_product_attention
from tests.training.test_autotune import ScriptedSteps
from training.optim import build_optimizers
from training.runtime import Runtime


def qkv(n_head: int, n_kv_head: int, T: int = 12, head_dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, T, head_dim, generator=gen).bfloat16() for h in (n_head, n_kv_head, n_kv_head)]


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_float32_copies_give_the_float32_kernel_rounded_once(n_kv_head, masked):
    q, k, v = qkv(4, n_kv_head)
    mask = causal_mask(12, 12)[4:] if masked else None  # the last 8 queries over all 12 keys, as in decoding
    if masked:
        q = q[:, :, 4:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, mask, causal=not masked, float32=True)
    n_rep = 4 // n_kv_head
    expected = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(n_rep, 1),
                                              v.float().repeat_interleave(n_rep, 1), attn_mask=mask,
                                              is_causal=mask is None)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected.bfloat16(), atol=0, rtol=0)  # float32 throughout, one rounding
    # and the from-scratch formula in float64 on the same inputs agrees within that one rounding
    grouped = q.double().view(2, n_kv_head, n_rep, q.size(2), 8)
    reference, _ = scaled_dot_product_attention(grouped, k.double().unsqueeze(2), v.double().unsqueeze(2),
                                                mask=mask, causal=mask is None)
    torch.testing.assert_close(out.double(), reference.view_as(out.double()), atol=1e-2, rtol=8e-3)


def test_without_the_upcast_the_kernel_takes_bfloat16_as_autocast_gives_it():
    q, k, v = qkv(4, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = fused_attention(q, k, v, None, causal=True, float32=False)
        on_float32 = fused_attention(q.float(), k.float(), v.float(), None, causal=True, float32=True)  # nothing to upcast
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(plain, expected, atol=0, rtol=0)
    assert on_float32.dtype == torch.float32


@pytest.mark.parametrize("float32", [False, True])
def test_a_decoded_query_without_mask_or_causal_sees_every_key(float32):
    """Eager decoding passes one query, no mask and causal=False (its row of the mask is all True): every
    written key counts, not only the first one, as the kernel's top-left causal mask would have it."""
    q, k, v = qkv(4, 2, T=10)
    q = q[:, :, -1:]  # (2, 4, 1, 8): the newest position's query
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, None, causal=False, float32=float32)
    grouped = q.double().view(2, 2, 2, 1, 8)
    reference, _ = scaled_dot_product_attention(grouped, k.double().unsqueeze(2), v.double().unsqueeze(2),
                                                mask=torch.ones(1, 10, dtype=torch.bool), causal=False)
    torch.testing.assert_close(out.double(), reference.view_as(out.double()), atol=2e-2, rtol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first_key_only = fused_attention(q, k, v, None, causal=True, float32=float32)
    assert not torch.allclose(out, first_key_only, atol=1e-2)  # the two readings differ: the test can fail


def sdpa_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                           attn_impl="sdpa"))


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_the_setting_reaches_every_layers_kernel_and_only_when_set(monkeypatch, kernel):
    seen = []
    fused, matmul = F.scaled_dot_product_attention, gpt.matmul_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, *a, **kw: seen.append(("fused", q.dtype))
                        or fused(q, *a, **kw))
    monkeypatch.setattr(gpt, "matmul_attention", lambda q, *a, **kw: seen.append(("matmul", q.dtype))
                        or matmul(q, *a, **kw))
    model = sdpa_model()
    model.set_attention_kernel(kernel)
    idx = torch.randint(0, 32, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(idx)
    expected = {"fused": ("fused", torch.bfloat16), "fused float32": ("fused", torch.float32),
                "matmul": ("matmul", torch.bfloat16)}[kernel]
    assert seen == [expected] * 2  # one call per layer, of the path and in the dtype it was set to
    assert logits.dtype == torch.bfloat16
    reference, _ = model(idx)  # float32 without autocast: every setting stays within bfloat16's rounding of it
    torch.testing.assert_close(logits.float(), reference, atol=0.1, rtol=0.05)
    seen.clear()  # decoding against a KV cache takes the fused kernel whatever the setting
    with torch.autocast("cpu", dtype=torch.bfloat16):
        generate(model, idx[:, :4], max_new_tokens=2, top_k=1)
    assert seen and all(path == "fused" for path, _ in seen)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_every_kernel_gives_the_from_scratch_numbers_in_training_and_evaluation(kernel):
    """In float64 the three paths compute one formula: the logits and every weight's gradient of a model with
    each setting equal those of the from-scratch path (attn_impl manual)."""
    torch.manual_seed(1)
    idx, targets = torch.randint(0, 32, (2, 16)), torch.randint(0, 32, (2, 16))
    fast = sdpa_model(seed=2).double()
    fast.set_attention_kernel(kernel)
    scratch = GPT(ModelConfig(**{**fast.config.__dict__, "attn_impl": "manual"})).double()
    scratch.load_state_dict(fast.state_dict())
    for model in (fast, scratch):
        _, loss = model(idx, targets)
        loss.backward()
    torch.testing.assert_close(fast(idx)[0], scratch(idx)[0], atol=1e-10, rtol=1e-10)
    for (name, p), q in zip(fast.named_parameters(), scratch.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-10, rtol=1e-10, msg=name)


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="'flash' is not one of fused, fused float32, matmul"):
        sdpa_model().set_attention_kernel("flash")


# --- how dtype: auto chooses it ------------------------------------------------------------------------

class ScriptedAttention(ScriptedSteps):
    """ScriptedSteps on a model with the fused kernel, the kernel's timings scripted too."""

    def __init__(self, monkeypatch, durations, attention_ms: dict[str, float]):
        super().__init__(monkeypatch, durations)
        self.attention_calls = []

        def timings(model, batch_size, seq_len, dtype, device):
            self.attention_calls.append((batch_size, seq_len, dtype))
            self.events.append("attention timed")
            return dict(attention_ms)
        monkeypatch.setattr(autotune, "attention_kernel_timings", timings)

    def compile(self, module):
        self.events.append(f"torch.compile ({module.blocks[0].attn.attention_kernel} attention)")
        return types.SimpleNamespace(compiled=module)

    def choose(self, steps_left=10**6, dtype="auto", compile_model="auto"):
        self.model = sdpa_model()
        optimizers = build_optimizers(self.model, autotune.RunConfig().train)
        batch = (torch.zeros(3, 16, dtype=torch.long), torch.zeros(3, 16, dtype=torch.long))
        return autotune.choose((self.model, optimizers, batch), Runtime(torch.device("cpu"), None),
                               autotune.TrainConfig(grad_accum=1, grad_clip=1.0, compile=compile_model), steps_left,
                               dtype, say=self.events.append)


@pytest.mark.parametrize("bf16_ms, f32_ms, matmul_ms, kernel", [
    (30.0, 20.0, 25.0, "fused float32"), (30.0, 25.0, 20.0, "matmul"), (30.0, 30.0 / 1.04, 31.0, "fused"),
    (20.0, 30.0, 20.0 / 1.04, "fused"), (20.0, 30.0, 10.0, "matmul")])
def test_auto_keeps_the_fastest_kernel_only_when_it_beats_the_fused_one_by_more_than_noise(
        monkeypatch, bf16_ms, f32_ms, matmul_ms, kernel):
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    scripted = ScriptedAttention(monkeypatch, {"float32": [1.0], "bfloat16": [0.5], "compiled": [0.4]},
                                 {"bfloat16 attention": bf16_ms, "float32 attention": f32_ms,
                                  "matmul attention": matmul_ms})
    choice, compiled = scripted.choose()
    assert choice.dtype == "bfloat16" and choice.attention_kernel == kernel
    assert scripted.attention_calls == [(3, 16, "bfloat16")]  # the run's micro-batch shape, in the chosen dtype
    assert all(block.attn.attention_kernel == kernel for block in scripted.model.blocks)
    # measured after the dtype, before the compile, which then traces the kernel as chosen
    order = [e for e in scripted.events if e == "attention timed" or e.startswith("torch.compile")]
    assert order == ["attention timed", f"torch.compile ({kernel} attention)"]
    kept_name = {"fused": "bfloat16 attention", "fused float32": "float32 attention", "matmul": "matmul attention"}
    parts = []
    for name, ms in (("float32 attention", f32_ms), ("matmul attention", matmul_ms)):
        verdict = ("kept" if kept_name[kernel] == name else f"not kept ({kept_name[kernel]} faster)"
                   if bf16_ms / ms >= autotune.MIN_GAIN else f"not kept (under {autotune.MIN_GAIN:.2f}x)")
        parts.append(f"{name} {ms:.1f} vs bfloat16 attention {bf16_ms:.1f} ms/call: {bf16_ms / ms:.2f}x, {verdict}")
    summary = choice.summary()
    assert re.search(r"kept; " + re.escape("; ".join(parts)) + "; bfloat16 compiled", summary), summary
    assert autotune.Choice.from_json(json.loads(json.dumps(choice.to_json()))) == choice


@pytest.mark.parametrize("durations, dtype", [({"float32": [0.5], "bfloat16": [1.0], "compiled": [0.4]}, "auto"),
                                              ({"bfloat16": [0.5], "compiled": [0.4]}, "bfloat16")])
def test_not_kept_when_float32_wins_and_not_measured_when_the_dtype_is_set(monkeypatch, durations, dtype):
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    scripted = ScriptedAttention(monkeypatch, {"float32": [1.0], **durations}, {
        "bfloat16 attention": 9.0, "float32 attention": 1.0, "matmul attention": 2.0})
    choice, _ = scripted.choose(dtype=dtype)
    assert choice.attention is None and choice.attention_kernel == "fused"
    assert scripted.attention_calls == ([(3, 16, "bfloat16")] if dtype == "auto" else [])
    assert all(block.attn.attention_kernel == "fused" for block in scripted.model.blocks)


def test_the_bfloat16_steps_are_timed_with_the_kernel_chosen(monkeypatch):
    """The kernel is timed after the warm-ups and before the dtype's timed rounds: bfloat16's steps are
    compared with float32's as they will run."""
    monkeypatch.setattr(autotune, "MEASURE_S", 0.0)
    scripted = ScriptedAttention(monkeypatch, {"float32": [1.0], "bfloat16": [0.5], "compiled": [0.4]},
                                 {"bfloat16 attention": 30.0, "float32 attention": 20.0, "matmul attention": 25.0})
    scripted.choose()
    timed = scripted.events.index("attention timed")
    assert scripted.events[:timed].count("bfloat16") == 1  # its warm-up only
    assert scripted.events[timed + 1:].count("bfloat16") >= autotune.ROUNDS * autotune.MIN_STEPS


def test_the_real_timing_names_every_kernel_with_positive_times(monkeypatch):
    budgets = []
    time_rounds = autotune._time_rounds
    monkeypatch.setattr(autotune, "_time_rounds", lambda runs, device, measure_s=None: budgets.append(measure_s)
                        or time_rounds(runs, device, measure_s))
    timed = autotune.attention_kernel_timings(sdpa_model(), 2, 16, "bfloat16", torch.device("cpu"))
    assert budgets == [autotune.KERNEL_MEASURE_S]  # the kernels' shorter budget, not a training step's
    assert set(timed) == {"bfloat16 attention", "float32 attention", "matmul attention"}
    assert all(math.isfinite(ms) and ms > 0 for ms in timed.values())


ATTENTION = autotune.Comparison({"bfloat16 attention": 30.0, "float32 attention": 20.0, "matmul attention": 25.0},
                                "bfloat16 attention", "float32 attention", unit="ms/call")
KERNEL_NAMES = {"fused": "bfloat16 attention", "fused float32": "float32 attention", "matmul": "matmul attention"}
SAVED = autotune.Choice(dtype="bfloat16", compile=False, comparisons=[
    autotune.Comparison({"float32": 2.0, "bfloat16": 1.0}, "float32", "bfloat16")], attention=ATTENTION)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_a_resume_and_every_process_apply_the_saved_kernel_choice(tmp_path, monkeypatch, kernel):
    saved = autotune.Choice(**{**SAVED.__dict__, "attention": autotune.Comparison(
        ATTENTION.ms_per_step, ATTENTION.baseline, KERNEL_NAMES[kernel], "ms/call")})
    autotune.save_choice(tmp_path, saved)
    monkeypatch.setattr(autotune, "choose", lambda *a, **kw: pytest.fail("a resume measured again"))
    cfg = autotune.RunConfig(out_dir=str(tmp_path), dtype="auto")
    rt = Runtime(torch.device("cpu"), None)
    choice, precision = autotune.decide_precision(cfg, rt, None, steps_left=10, resumed=True)
    assert choice == saved and precision.autocast_dtype == torch.bfloat16
    assert precision.attention_kernel == kernel


@pytest.mark.parametrize("damage", [{"unit": "ms/step"}, {"unit": "s"}, {"kept": "float16 attention"},
                                    {"ms_per_step": {"bfloat16 attention": 30.0, "other": 20.0},
                                     "kept": "other", "baseline": "bfloat16 attention"},
                                    {"ms_per_step": {**ATTENTION.ms_per_step, "other": 20.0}, "kept": "other"},
                                    {"baseline": "float32 attention"},
                                    {"ms_per_step": {"bfloat16 attention": -1.0, "float32 attention": 20.0}}])
def test_a_damaged_kernel_choice_is_measured_again_and_an_earlier_file_without_one_reads(tmp_path, damage):
    good = SAVED.to_json()
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps({**good, "attention": {**good["attention"], **damage}}))
    assert autotune.saved_choice(tmp_path) is None
    earlier = {k: v for k, v in good.items() if k != "attention"}
    (tmp_path / autotune.CHOICE_FILE).write_text(json.dumps(earlier))
    choice = autotune.saved_choice(tmp_path)
    assert choice.attention is None and choice.attention_kernel == "fused" and choice.dtype == "bfloat16"


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_the_run_builds_its_model_with_the_kernel_choice(tmp_path, monkeypatch, kernel):
    """What auto decided for the kernel reaches every layer of the model the run trains (training/plan.py then
    trainer.build): the choice is a value of the plan, not a setting left on the model that was timed."""
    from tests.helpers import shakespeare_data_dir, tiny_config
    from training.trainer import train
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(shakespeare_data_dir(tmp_path / "data")))
    made = autotune.Choice(**{**SAVED.__dict__, "compile": False, "attention": autotune.Comparison(
        ATTENTION.ms_per_step, ATTENTION.baseline, KERNEL_NAMES[kernel], "ms/call")})
    monkeypatch.setattr(autotune, "choose", lambda *a, **kw: (made, None))
    result = train(tiny_config(tmp_path, "train.max_iters=2", "eval.interval=2", "attn.enabled=false", "dtype=auto",
                               "train.compile=false", "model.attn_impl=sdpa"))
    assert all(block.attn.attention_kernel == kernel for block in result.model.blocks)

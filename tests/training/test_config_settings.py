"""Every training setting changes what the run does: each test fails when its setting is ignored or off by one.

The expected values come from independent computations written out here: the learning-rate formula, the eval
batches drawn directly from the val split, a scripted sequence of eval losses (one AdamW step by hand, which
train.batch_size, grad_accum, grad_clip, lr, embedding_lr, beta1, beta2 and weight_decay all shape:
test_step.py).
docs/testing.md maps every setting to its test.
"""
from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from data.loader import BatchLoader
from data.shards import SplitFiles
from model import GPT
from pretrained.checkpoint import read_config
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.checkpoint import BEST, LATEST, load_train_state
from training.evaluate import EVAL_SEED_OFFSET, evaluate
from training.optim import build_optimizers, lr_factor
from training.runtime import setup_runtime
from training.plan import with_vocab_size
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# --- the learning-rate schedule ------------------------------------------------------------------------------

def reference_lr(step: int, lr: float, min_lr: float, warmup: int, decay_iters: int) -> float:
    """Linear warmup from lr/warmup (step 0) to lr (step warmup-1), cosine from lr (step warmup) to min_lr
    (step decay_iters), then min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_iters:
        return min_lr
    progress = (step - warmup) / max(1, decay_iters - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("overrides, min_lr, decay_iters", [
    (["train.warmup_iters=4"], 1e-4, 20),  # min_lr unset: lr / 10; lr_decay_iters unset: max_iters
    (["train.warmup_iters=0", "train.lr_decay_iters=10", "train.min_lr=0"], 0.0, 10),
    (["train.warmup_iters=5", "train.lr_decay_iters=12", "train.min_lr=3e-4"], 3e-4, 12),
])
def test_lr_factor_equals_the_formula_at_every_step(overrides, min_lr, decay_iters):
    tc = tiny_config(Path("unused"), "train.lr=1e-3", "train.max_iters=20", *overrides).train
    for step in range(25):
        assert lr_factor(step, tc) * tc.lr == pytest.approx(
            reference_lr(step, 1e-3, min_lr, tc.warmup_iters, decay_iters), rel=1e-12, abs=1e-15), step
    if tc.warmup_iters:  # the edges exactly: the last warmup step and the first cosine step are both at the peak
        assert lr_factor(tc.warmup_iters - 1, tc) == lr_factor(tc.warmup_iters, tc) == 1.0
        assert lr_factor(0, tc) == 1 / tc.warmup_iters


def reference_wsd_lr(step: int, lr: float, min_lr: float, warmup: int, decay_iters: int, cooldown: int) -> float:
    """Linear warmup as above, the peak held, then `cooldown` steps on a straight line from lr (the cooldown's
    first step) towards min_lr (reached at decay_iters), then min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_iters:
        return min_lr
    start = decay_iters - cooldown
    if step < start:
        return lr
    return lr - (lr - min_lr) * (step - start) / cooldown


@pytest.mark.parametrize("overrides, min_lr, decay_iters, cooldown", [
    (["train.warmup_iters=4"], 1e-4, 20, 8),  # cooldown_frac 0.4 of 20 steps
    (["train.warmup_iters=0", "train.lr_decay_iters=10", "train.min_lr=0", "train.cooldown_frac=0.3"], 0.0, 10, 3),
    (["train.warmup_iters=2", "train.min_lr=3e-4", "train.cooldown_frac=1"], 3e-4, 20, 18),  # not inside the warmup
    (["train.warmup_iters=3", "train.lr_decay_iters=16", "train.cooldown_frac=0.01"], 1e-4, 16, 1),  # >= 1 step
])
def test_wsd_lr_factor_equals_the_formula_at_every_step(overrides, min_lr, decay_iters, cooldown):
    tc = tiny_config(Path("unused"), "train.lr=1e-3", "train.max_iters=20", "train.lr_schedule=wsd", *overrides).train
    for step in range(25):
        assert lr_factor(step, tc) * tc.lr == pytest.approx(
            reference_wsd_lr(step, 1e-3, min_lr, tc.warmup_iters, decay_iters, cooldown), rel=1e-12, abs=1e-15), step
    assert lr_factor(decay_iters - cooldown, tc) == 1.0 and lr_factor(decay_iters - cooldown + 1, tc) < 1.0


def test_cooldown_frac_outside_its_range_is_refused_in_one_line(tmp_path):
    for bad in ("0", "-0.1", "1.5"):
        with pytest.raises(UserError, match="cooldown_frac"):
            tiny_config(tmp_path, "train.lr_schedule=wsd", f"train.cooldown_frac={bad}")


def test_the_run_steps_at_the_scheduled_lr(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, "train.lr=2e-3", "train.min_lr=2e-4", "train.warmup_iters=3", "train.lr_decay_iters=8",
                      "train.max_iters=10", "train.log_interval=1", "eval.interval=100", *QUIET))
    logged = {row["step"]: row["lr"] for row in metrics(out) if "lr" in row}
    assert sorted(logged) == list(range(1, 11))
    for step, lr in logged.items():  # the row of step s is logged after optimizer step s - 1 (0-based)
        assert lr == pytest.approx(reference_lr(step - 1, 2e-3, 2e-4, 3, 8), rel=1e-12), step


# --- the optimizers' parameter groups (one optimizer step by hand: test_step.py) -----------------------------

def test_muon_takes_the_hidden_matrices_at_its_own_lr_and_momentum():
    cfg = tiny_config(Path("unused"), "train.optimizer=muon", "train.muon_lr=0.05", "train.muon_momentum=0.8",
                      "train.lr=2e-3", "train.weight_decay=0.2", "model.tie_embeddings=false")
    model = GPT(cfg.model)
    muon, adamw = build_optimizers(model, cfg.train).optimizers
    assert type(muon).__name__ == "Muon" and type(adamw).__name__ == "AdamW"
    hidden = {id(p) for name, p in model.named_parameters() if p.dim() == 2 and name.startswith("blocks.")}
    assert {id(p) for g in muon.param_groups for p in g["params"]} == hidden
    assert len(muon.param_groups) == 3  # fused q|k|v, fused gate|up (SwiGLU), whole matrices
    for group in muon.param_groups:
        assert (group["lr"], group["peak_lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.05, 0.8, 0.2)
    # the embedding table, the LM head, the norms: the table at lr too while embedding_lr is unset
    assert [(g["lr"], g["weight_decay"]) for g in adamw.param_groups] == [(2e-3, 0.2), (2e-3, 0.2), (2e-3, 0.0)]
    assert adamw.param_groups[0]["params"] == [model.tok_emb.weight]
    assert adamw.param_groups[1]["params"] == [model.lm_head.weight]
    cfg.train.embedding_lr = 0.03
    assert [g["lr"] for g in build_optimizers(model, cfg.train).optimizers[1].param_groups] == [0.03, 2e-3, 2e-3]


# --- evals and best/ -------------------------------------------------------------------------------------------

def test_eval_losses_are_the_mean_over_fixed_batches_of_each_split(tmp_path):
    """The val loss is the mean over eval.iters batches of eval.batch_size windows of the *val* split, drawn
    from the eval stream (seed + EVAL_SEED_OFFSET); likewise for train; the model is in eval mode for it
    (dropout off: two evals agree) and back in training mode after."""
    cfg = tiny_config(tmp_path, "eval.iters=3", "eval.batch_size=5", "model.dropout=0.5", *QUIET)
    from data.prepare import prepare_data
    prepared = prepare_data(cfg.data)
    torch.manual_seed(0)
    model = GPT(with_vocab_size(cfg, cfg.model, prepared.tokenizer.vocab_size)).train()
    rt = setup_runtime("cpu", "float32")
    losses = evaluate(model, cfg, prepared, rt, model.config.block_size)
    assert model.training and evaluate(model, cfg, prepared, rt, model.config.block_size) == losses
    model.eval()
    for split in ("train", "val"):
        loader = BatchLoader(SplitFiles(prepared.split_paths(split), prepared.dtype), model.config.block_size, 5,
                             seed=cfg.seed + EVAL_SEED_OFFSET)
        with torch.no_grad():
            batch_losses = [model(*loader.next_batch())[1].item() for _ in range(3)]
        assert losses[split] == pytest.approx(sum(batch_losses) / 3, rel=1e-6), split
    assert losses["train"] != losses["val"]


def scripted_evals(monkeypatch, val_losses: list[float]) -> None:
    """training.trainer.evaluate returns these val losses in turn (train loss: val + 1)."""
    values = iter(val_losses)

    def fake_evaluate(model, cfg, prepared, rt, block_size):
        val = next(values)
        return {"train": val + 1.0, "val": val}

    monkeypatch.setattr("training.trainer.evaluate", fake_evaluate)


def test_best_is_replaced_only_by_a_better_eval_even_across_a_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    overrides = ["train.max_iters=6", "eval.interval=1", *QUIET]
    scripted_evals(monkeypatch, [3.0, 2.0, 2.5])
    train(tiny_config(out, *overrides), should_stop=lambda steps: steps == 3)
    assert (read_config(out / BEST)["step"], read_config(out / BEST)["val_loss"]) == (2, 2.0)  # not the worse 3rd
    assert load_train_state(out / LATEST)["best_val"] == 2.0
    scripted_evals(monkeypatch, [2.2, 1.9, 1.95])  # steps 4, 5, 6 of the resumed run
    result = train(tiny_config(out, *overrides))
    assert result.best_val == 1.9
    assert (read_config(out / BEST)["step"], read_config(out / BEST)["val_loss"]) == (5, 1.9)
    best_logged = [(row["step"], row["val/best"]) for row in metrics(out) if "val/best" in row]
    assert best_logged == [(1, 3.0), (2, 2.0), (3, 2.0), (4, 2.0), (5, 1.9), (6, 1.9)]


def test_eval_interval_and_log_interval_set_when_the_run_evaluates_and_logs(tmp_path):
    out = tmp_path / "run"
    result = train(tiny_config(out, "train.max_iters=7", "eval.interval=3", "train.log_interval=3", *QUIET))
    assert [e["step"] for e in result.evals] == [3, 6, 7]  # every interval, and the last step
    assert [row["step"] for row in metrics(out) if "train/loss" in row] == [1, 3, 6, 7]  # the first step too


def test_tokens_per_s_counts_training_time_only_when_evals_fall_between_log_lines(tmp_path, monkeypatch):
    """On a scripted clock (every step 1 s, every eval and save 100 s) each logged tokens/s is exactly one
    step's tokens per second, also for a window an eval interrupts (eval.interval 3, log_interval 4): the
    window keeps its steps before the eval and their time, and leaves the eval's time out."""
    import training.trainer as trainer
    clock = [0.0]
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_step, real_eval = trainer.train_step, trainer.evaluate_and_save

    def step(run, i):
        clock[0] += 1.0
        return real_step(run, i)

    def evaluate(run, i):
        clock[0] += 100.0
        real_eval(run, i)
    monkeypatch.setattr(trainer, "train_step", step)
    monkeypatch.setattr(trainer, "evaluate_and_save", evaluate)
    out = tmp_path / "run"
    cfg = tiny_config(out, "train.max_iters=9", "eval.interval=3", "train.log_interval=4", *QUIET)
    train(cfg)
    per_step = cfg.train.batch_size * cfg.model.block_size
    rates = [row["tokens_per_s"] for row in metrics(out) if "tokens_per_s" in row]
    assert len(rates) == 4 and rates == pytest.approx([per_step] * 4)  # steps 1, 4, 8, 9


def test_mfu_is_measured_against_peak_flops(tmp_path):
    out = tmp_path / "run"
    # a peak above what the tiny model reaches on a CPU (~7e9 FLOP/s): one below it is the run's own rate
    # instead, an MFU of at most 100% (tests/training/test_runtime_peak.py)
    result = train(tiny_config(out, "train.max_iters=4", "train.log_interval=1", "train.peak_flops=3e12",
                               "eval.interval=100", *QUIET))
    flops_per_token = result.model.flops_per_token(result.model.config.block_size)
    for row in (r for r in metrics(out) if "mfu" in r):
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * flops_per_token / 3e12, rel=1e-9)


# --- what the run is built from -------------------------------------------------------------------------------

def test_model_settings_reach_the_saved_model(tmp_path):
    """Every model.* key given in the YAML or on the command line is the model that trains and is saved."""
    model_overrides = {"block_size": 16, "n_layer": 3, "n_head": 4, "n_kv_head": 1, "d_model": 48, "mlp": "gelu",
                       "mlp_hidden": 40, "norm": "layernorm", "pos": "learned", "rope_theta": 500.0, "dropout": 0.1,
                       "bias": True, "tie_embeddings": False, "attn_impl": "manual", "vocab_size": 70}
    out = tmp_path / "run"
    result = train(tiny_config(out, *(f"model.{k}={v}" for k, v in model_overrides.items()), "train.max_iters=1",
                               "eval.interval=1", *QUIET))
    saved = read_config(out / LATEST)["model"]
    assert {k: saved[k] for k in model_overrides} == model_overrides
    assert result.model.config.to_dict() == saved
    assert result.model.lm_head.weight is not result.model.tok_emb.weight
    assert result.model.tok_emb.weight.shape == (70, 48) and len(result.model.blocks) == 3


def test_bpe_vocabularies_are_padded_to_a_multiple_of_64_and_set_ones_kept():
    cfg = tiny_config(Path("unused"))
    for vocab, padded in [(65, 65), (1023, 1023), (1024, 1024), (1025, 1088), (50257, 50304)]:
        prepared = types.SimpleNamespace(tokenizer=types.SimpleNamespace(vocab_size=vocab))
        assert with_vocab_size(cfg, cfg.model, prepared.tokenizer.vocab_size).vocab_size == padded, vocab
    explicit = tiny_config(Path("unused"), "model.vocab_size=100")
    assert with_vocab_size(explicit, explicit.model, 65).vocab_size == 100


def test_compile_wraps_the_model_in_torch_compile(tmp_path, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compiled.append(model) or model)
    result = train(tiny_config(tmp_path / "a", "train.compile=true", "train.max_iters=1", "eval.interval=1", *QUIET))
    assert compiled == [result.model]
    train(tiny_config(tmp_path / "b", "train.compile=false", "train.max_iters=1", "eval.interval=1", *QUIET))
    assert len(compiled) == 1


def test_dtype_sets_the_autocast_of_the_step():
    rt = setup_runtime("cpu", "bfloat16")
    assert rt.autocast_dtype == torch.bfloat16
    with rt.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    for dtype in ("float32", "auto"):  # auto: float32 on a CPU
        assert setup_runtime("cpu", dtype).autocast_dtype is None


def test_a_resumed_run_takes_this_runs_optimizer_settings(tmp_path, trained):
    """Optimizer hyperparameters come from the resumed run's config, not from the checkpoint (torch's
    load_state_dict would restore the saved ones): train.lr changed for the resume is the lr it steps at."""
    from tests.helpers import fresh_copy
    out, _ = fresh_copy(trained, tmp_path)
    train(tiny_config(out, "train.max_iters=4", "train.lr=1e-2", "train.beta2=0.5", "train.log_interval=1",
                      "eval.interval=100", *QUIET))
    tc = tiny_config(out, "train.max_iters=4", "train.lr=1e-2").train
    logged = {row["step"]: row["lr"] for row in metrics(out) if "lr" in row and row["step"] > 2}
    assert logged == {3: pytest.approx(1e-2 * lr_factor(2, tc)), 4: pytest.approx(1e-2 * lr_factor(3, tc))}
    state = load_train_state(out / LATEST)["optimizer"][0]["param_groups"]
    assert all(g["peak_lr"] == 1e-2 and g["betas"] == (0.9, 0.5) for g in state)

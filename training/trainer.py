"""The training loop: data -> model -> loss -> optimizer, with evals, checkpoints, exact resume and DDP.

`train(cfg)` is what `python train.py CONFIG` calls; tests call it directly on tiny configs.
"""
from __future__ import annotations

import dataclasses
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from common.errors import UserError
from data.loader import BatchLoader
from data.prepare import PreparedData, prepare_data
from model.checkpoint import CheckpointError, load_weights, read_config
from model.config import ModelConfig
from model.gpt import GPT
from training.checkpoint import BEST, LATEST, STATE_FILE, checkpoint_dir, load_train_state, save_checkpoint
from training.config import RunConfig, config_to_yaml
from training.logger import RunLogger
from training.optim import build_optimizers, lr_factor
from training.step import accumulate_gradients, apply_gradients
from training.runtime import (Runtime, measure_peak_flops, rng_state, seed_everything, set_rng_state,
                              setup_runtime, synchronize, teardown_runtime)

EVAL_SEED_OFFSET = 1_000_003  # eval batches come from their own stream, the same at every eval


@dataclass
class TrainResult:
    out_dir: Path
    step: int  # optimizer steps done in total (the next step to run)
    losses: dict[int, float] = field(default_factory=dict)  # step -> train loss, for the steps this call ran
    evals: list[dict[str, float]] = field(default_factory=list)
    best_val: float = math.inf
    interrupted: str | None = None  # "SIGINT" / "SIGTERM" when stopped by a signal (after saving)
    skipped_steps: int = 0  # non-finite steps skipped (train.nonfinite=skip)
    train_seconds: float = 0.0  # wall time of this call's loop, evals and saves included
    attn_seconds: float = 0.0  # of which spent on attention snapshots
    model: GPT | None = field(default=None, repr=False)  # the trained model (unwrapped from DDP/compile)


class StopRequested:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves, and returns. A second Ctrl-C aborts."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def model_config_for(cfg: RunConfig, prepared: PreparedData) -> ModelConfig:
    """The run's ModelConfig with vocab_size from the tokenizer (unless the YAML sets it)."""
    vocab = prepared.tokenizer.vocab_size
    if cfg.vocab_size_from_tokenizer:
        # BPE vocabularies are padded to a multiple of 64 (GPT-2: 50257 -> 50304) for faster matmuls
        size = vocab if vocab < 1024 else 64 * math.ceil(vocab / 64)
        return dataclasses.replace(cfg.model, vocab_size=size)
    if cfg.model.vocab_size < vocab:
        raise UserError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's vocabulary "
                        f"({vocab}): remove model.vocab_size to take it from the tokenizer")
    return cfg.model


def check_same_model(saved_dir: Path, model_cfg: ModelConfig, out_dir: Path) -> None:
    try:
        saved = read_config(saved_dir)["model"]
    except CheckpointError as e:
        raise UserError(f"cannot resume from '{saved_dir}': {e}; use another out_dir, or delete '{out_dir}' to "
                        f"start over") from None
    ours = model_cfg.to_dict()
    shape_keys = [k for k in ours if k not in ("dropout", "attn_impl")]  # these may change across a resume
    diffs = [f"{k} {saved.get(k)!r} vs {ours[k]!r}" for k in shape_keys if saved.get(k) != ours[k]]
    if diffs:
        raise UserError(f"out_dir '{out_dir}' holds a checkpoint of a different model ({'; '.join(diffs[:3])}): "
                        f"use another out_dir, or delete '{out_dir}' to start over")


def train(cfg: RunConfig, should_stop: Callable[[int], bool] | None = None) -> TrainResult:
    """Run (or resume) the training described by cfg. should_stop(steps_done) -> True stops after that
    step exactly as Ctrl-C does: checkpoint saved, result.interrupted set ("requested")."""
    rt = setup_runtime(cfg.device, cfg.dtype)
    loggers: list[RunLogger] = []
    try:
        return _train(cfg, rt, should_stop, loggers)
    except BaseException:
        for logger in loggers:  # end the progress bar's line first: the error printed next gets a line of its own
            if logger.bar is not None:
                logger.bar.close()
        raise
    finally:
        teardown_runtime(rt)


def _train(cfg: RunConfig, rt: Runtime, should_stop: Callable[[int], bool] | None,
           loggers: list[RunLogger]) -> TrainResult:
    out_dir = Path(cfg.out_dir)
    tc = cfg.train
    seed_everything(cfg.seed)
    _make_out_dir(out_dir, rt)

    # data: the main process prepares, the others wait and then read the same bins
    if rt.is_main:
        prepared = prepare_data(cfg.data, block_size=cfg.model.block_size)
    if rt.ddp:
        dist.barrier()
    if not rt.is_main:
        prepared = prepare_data(cfg.data, block_size=cfg.model.block_size, quiet=True)
    model_cfg = model_config_for(cfg, prepared)
    extra = {"tokenizer": prepared.tokenizer.to_json()}

    # resume?
    latest = checkpoint_dir(out_dir, LATEST)
    if latest is not None and tc.resume == "never":
        raise UserError(f"out_dir '{out_dir}' already holds a checkpoint and train.resume=never: set "
                        f"train.resume=auto to continue it, or choose another out_dir")
    model = GPT(model_cfg).to(rt.device)
    state = None
    if latest is not None:  # read the checkpoint first: a bad one fails before the optimizer is built
        check_same_model(latest, model_cfg, out_dir)
        try:
            load_weights(model, latest / "model.safetensors")
            state = load_train_state(latest)
        except CheckpointError as e:
            raise UserError(f"cannot resume from '{latest}': {e}; use another out_dir, or delete '{out_dir}' to "
                            f"start over") from None
    optimizers = build_optimizers(model, tc)
    loader = BatchLoader(prepared.train_path, prepared.dtype, model_cfg.block_size, tc.batch_size,
                         seed=cfg.seed, rank=rt.rank, world_size=rt.world_size, device=rt.device)
    start_step, best_val, skipped = 0, math.inf, 0
    if state is not None:
        try:
            optimizers.load_state_dict(state["optimizer"])
            loader.load_state_dict(state["loader"])
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:  # e.g. train.optimizer changed
            raise UserError(f"cannot resume from '{latest}': its {STATE_FILE} does not fit this run "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:160]}); resume with the settings it "
                            f"was saved with (e.g. the same train.optimizer), or use another out_dir") from None
        start_step, best_val, skipped = state["step"], state["best_val"], state.get("skipped_steps", 0)
    if rt.is_main:
        (out_dir / "config.yaml").write_text(config_to_yaml(cfg))

    logger = RunLogger(cfg, rt.is_main, start_step, resumed=latest is not None)
    loggers.append(logger)
    logger.write(f"model: {model.num_params() / 1e6:.2f}M parameters, {model_cfg.n_layer} layers, "
                 f"{model_cfg.n_head} heads ({model_cfg.n_kv_head} kv), d_model {model_cfg.d_model}, "
                 f"block {model_cfg.block_size}; data: {prepared.train_tokens:,} train / "
                 f"{prepared.val_tokens:,} val tokens; device {rt.device}"
                 f"{', autocast ' + str(rt.autocast_dtype).replace('torch.', '') if rt.autocast_dtype else ''}"
                 f"{f', {rt.world_size} processes' if rt.ddp else ''}")
    if latest is not None:
        logger.write(f"resuming from '{latest}' at step {start_step} (best val {best_val:.4f})")

    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if rt.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    scaler = torch.amp.GradScaler("cuda") if rt.autocast_dtype == torch.float16 else None

    tokens_per_step = tc.batch_size * tc.grad_accum * rt.world_size * model_cfg.block_size
    flops_per_step = raw_model.flops_per_token(model_cfg.block_size) * tokens_per_step
    peak_flops = tc.peak_flops or measure_peak_flops(rt.device, rt.autocast_dtype)
    monitor = _attention_monitor(cfg, raw_model, prepared, logger, rt, start_step)

    result = TrainResult(out_dir=out_dir, step=start_step, best_val=best_val, skipped_steps=skipped, model=raw_model)

    def save(step_done: int) -> None:
        if not rt.is_main:
            return
        state = {"step": step_done, "best_val": result.best_val, "skipped_steps": result.skipped_steps,
                 "optimizer": optimizers.state_dict(), "loader": loader.state_dict(), "rng": rng_state()}
        save_checkpoint(out_dir, LATEST, raw_model, extra, state)

    model.train()
    loop_t0 = time.perf_counter()
    window_t0, window_steps = loop_t0, 0
    with StopRequested() as stop:
        for step in range(start_step, tc.max_iters):
            optimizers.set_lr_factor(lr_factor(step, tc))
            loss_sum, grad_norm = accumulate_gradients(model, raw_model, loader.next_batch, rt, tc.grad_accum,
                                                       tc.grad_clip, scaler, optimizers)
            if rt.ddp:
                dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
            loss_value, norm_value = loss_sum.item(), grad_norm.item()
            if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                optimizers.zero_grad()
                if tc.nonfinite == "skip":
                    result.skipped_steps += 1
                    logger.write(f"step {step}: non-finite loss {loss_value} / grad norm {norm_value}; step skipped "
                                 f"({result.skipped_steps} so far)")
                    result.step = step + 1
                    continue
                raise UserError(f"step {step}: the loss or gradient norm is not finite (loss {loss_value}, grad norm "
                                f"{norm_value}); stopped, the last good checkpoint in '{out_dir}' is intact. "
                                f"Lower train.lr, or set train.nonfinite=skip to skip such steps")
            apply_gradients(optimizers, scaler)
            result.losses[step] = loss_value
            result.step = step + 1
            window_steps += 1

            if (step + 1) % tc.log_interval == 0 or step + 1 == tc.max_iters or step == start_step:
                synchronize(rt.device)
                elapsed = time.perf_counter() - window_t0
                tok_s = tokens_per_step * window_steps / elapsed
                mfu = flops_per_step * window_steps / elapsed / peak_flops
                lr = optimizers.param_groups[-1]["lr"]
                logger.record(step + 1, {"train/loss": loss_value, "lr": lr, "grad_norm": norm_value,
                                         "tokens_per_s": tok_s, "mfu": mfu})
                logger.progress(window_steps, {"loss": f"{loss_value:.4f}", "lr": f"{lr:.2e}",
                                               "tok/s": f"{tok_s:,.0f}", "mfu": f"{100 * mfu:.1f}%"})
                window_t0, window_steps = time.perf_counter(), 0

            last = step + 1 == tc.max_iters
            if (step + 1) % cfg.eval.interval == 0 or last:
                losses = evaluate(raw_model, cfg, prepared, rt, model_cfg.block_size)
                improved = losses["val"] < result.best_val
                result.best_val = min(result.best_val, losses["val"])
                result.evals.append({"step": step + 1, **losses})
                logger.write(f"step {step + 1}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                             f"{' (best)' if improved else ''}")
                logger.record(step + 1, {"val/loss": losses["val"], "train/eval_loss": losses["train"],
                                         "val/best": result.best_val})
                if monitor is not None:
                    monitor.snapshot(step + 1)
                if rt.is_main and improved:
                    save_checkpoint(out_dir, BEST, raw_model, {**extra, "step": step + 1, "val_loss": losses["val"]})
                save(step + 1)
                window_t0 = time.perf_counter()  # evals and saves are not training time
            elif monitor is not None and monitor.due(step + 1):
                monitor.snapshot(step + 1)

            if stop.signal_name is None and should_stop is not None and should_stop(step + 1):
                stop.signal_name = "requested"
            if stop.signal_name is not None:
                save(step + 1)
                result.interrupted = stop.signal_name
                logger.write(f"{stop.signal_name}: stopped after step {step + 1}; checkpoint saved in "
                             f"'{out_dir / LATEST}'. Run the same command to resume.")
                break
    result.train_seconds = time.perf_counter() - loop_t0
    result.attn_seconds = monitor.seconds if monitor is not None else 0.0
    logger.close()
    return result


@torch.no_grad()
def evaluate(model: GPT, cfg: RunConfig, prepared: PreparedData, rt: Runtime, block_size: int) -> dict[str, float]:
    """Mean loss over eval.iters batches of each split; the same batches every time (own fixed seed)."""
    was_training = model.training
    model.eval()
    batch_size = cfg.eval.batch_size or cfg.train.batch_size
    out = {}
    for split in ("train", "val"):
        loader = BatchLoader(prepared.split_path(split), prepared.dtype, block_size, batch_size,
                             seed=cfg.seed + EVAL_SEED_OFFSET, rank=rt.rank, world_size=rt.world_size,
                             device=rt.device)
        total = torch.zeros((), device=rt.device)
        for _ in range(cfg.eval.iters):
            x, y = loader.next_batch()
            with rt.autocast():
                _, loss = model(x, y)
            total += loss.float()
        if rt.ddp:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        out[split] = total.item() / cfg.eval.iters
    model.train(was_training)
    return out


def _make_out_dir(out_dir: Path, rt: Runtime) -> None:
    if not rt.is_main:
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write to out_dir '{out_dir}' ({e.strerror or e}): choose a writable folder "
                        f"with out_dir=PATH") from None


def _attention_monitor(cfg: RunConfig, model: GPT, prepared: PreparedData, logger: RunLogger, rt: Runtime,
                       start_step: int) -> Any:
    if not (rt.is_main and cfg.attn.enabled):
        return None
    from training.attn_monitor import AttentionMonitor
    return AttentionMonitor(cfg, model, prepared, logger, rt, start_step)

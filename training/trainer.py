"""The training loop: data -> model -> loss -> optimizer, with evals, checkpoints, exact resume and DDP.

`train(cfg)` is what `python train.py CONFIG` calls; tests call it directly on tiny configs. It reads top to
bottom: resolve (training/plan.py: everything the run is, decided once), build (model, optimizers, loader, the
resume), loop (steps, evals, checkpoints, a clean stop).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from common.errors import UserError, out_of_memory
from common.writes import owning, write_file
from data.loader import BatchLoader
from data.prepare import PreparedData
from data.prepared import reading
from model.gpt import GPT
from training.checkpoint import BEST, LATEST, checkpoint_dir, save_checkpoint
from training.config import RunConfig, config_to_yaml
from training.dist_checkpoint import save_sharded
from training.evaluate import evaluate
from training.logger import RunLogger
from training.optim import Optimizers, build_optimizers
from training.parallel import MonitorFollower, agreed_stop, is_sharded, shard_model
from training.plan import RunPlan, resolve_run
from training.resume import resume
from training.run_dir import RunDirLock, could_not_write, lock_run_dir, make_out_dir
from training.runtime import (PeakFlops, Runtime, measure_peak_flops, rng_state, seed_everything, setup_runtime,
                              synchronize, teardown_runtime)
from training.step import accumulate_gradients, apply_gradients
from training.stop import StopRequested


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
    # the run's induction heads and phase change in one line (training/attn_monitor.py); None without a monitor
    induction_summary: str | None = None
    model: GPT | None = field(default=None, repr=False)  # the trained model (unwrapped from DDP/compile)


def train(cfg: RunConfig, should_stop: Callable[[int], bool] | None = None) -> TrainResult:
    """Run (or resume) the training described by cfg: resolve, build (with the resume), loop.
    should_stop(steps_done) -> True stops after that step exactly as Ctrl-C does: checkpoint saved,
    result.interrupted set ("requested")."""
    with owning(cfg.out_dir, "out_dir"):  # refused inside another run's folder, before anything is written
        return _train(cfg, should_stop)


def _train(cfg: RunConfig, should_stop: Callable[[int], bool] | None) -> TrainResult:
    started = time.perf_counter()  # the clock of the metrics rows' time_s (RunLogger)
    rt = setup_runtime(cfg.device, cfg.dtype)
    run: Run | None = None
    lock: RunDirLock | None = None
    finished = False
    try:
        if rt.is_main:  # the one writer of out_dir (training/run_dir.py); the other ranks only read
            make_out_dir(Path(cfg.out_dir))
            lock = lock_run_dir(cfg.out_dir)
            # finish a save that a crash interrupted, before any process looks
            checkpoint_dir(lock, BEST)
            checkpoint_dir(lock, LATEST)
        if rt.ddp:
            dist.barrier()
        plan = resolve_run(cfg, rt)
        with reading(plan.prepared.dir):  # no data.prepare remakes the shards the loop reads
            run = build(plan, started)
            result = train_loop(run, should_stop)
        finished = True
        return result
    except BaseException:
        if run is not None and run.logger.bar is not None:
            run.logger.bar.close()  # end the progress bar's line first: the error printed next gets a line of its own
        raise
    finally:
        if lock is not None:
            lock.release()
        teardown_runtime(rt, finished)


@dataclass
class Run:
    """Everything the loop works with, built by `build`."""

    cfg: RunConfig
    rt: Runtime
    out_dir: Path
    prepared: PreparedData
    model: nn.Module  # what runs forward: raw_model, maybe compiled and/or DDP-wrapped
    raw_model: GPT  # the plain module: its weights are saved, evaluated and probed
    optimizers: Optimizers
    loader: BatchLoader
    extra: dict[str, Any]  # saved beside the weights in config.json (the tokenizer, the data's fingerprint)
    files: dict[str, bytes]  # saved beside config.json (a tokenizer.json the tokenizer description names)
    logger: RunLogger
    monitor: Any  # training.attn_monitor.AttentionMonitor, or None
    result: TrainResult
    scaler: torch.amp.GradScaler | None = None
    tokens_per_step: int = 0  # every process's tokens: what tokens_per_s counts
    device_flops_per_step: float = 0.0  # one process's share of a step's FLOPs: what MFU counts
    peak: PeakFlops | None = None  # one device's peak FLOP/s, what MFU divides by

    def save(self, step_done: int) -> None:
        """Write latest/ with everything a resume needs (main process only; every process under FSDP)."""
        counters = {"step": step_done, "best_val": self.result.best_val, "skipped_steps": self.result.skipped_steps}
        if self.cfg.train.parallel == "fsdp":
            save_sharded(self.out_dir, self.raw_model, self.optimizers, self.extra, self.rt,
                         {**counters, "loader": self.loader.state_dict()}, files=self.files)
            return
        loaders = [self.loader.state_dict()] * self.rt.world_size  # each process's own position in the data
        if self.rt.ddp:
            dist.all_gather_object(loaders, self.loader.state_dict())
        if not self.rt.is_main:
            return
        state = {**counters, "optimizer": self.optimizers.state_dict(), "loader": loaders[0], "loaders": loaders,
                 "rng": rng_state()}
        save_checkpoint(self.out_dir, LATEST, self.raw_model, self.extra, state, files=self.files)

    def save_best(self, step: int, val_loss: float) -> None:
        """Write best/: weights + config (main process only; every process gathers them under FSDP)."""
        extra = {**self.extra, "step": step, "val_loss": val_loss}
        if self.cfg.train.parallel == "fsdp":
            save_sharded(self.out_dir, self.raw_model, self.optimizers, extra, self.rt, state=None,
                         files=self.files)
        elif self.rt.is_main:
            save_checkpoint(self.out_dir, BEST, self.raw_model, extra, files=self.files)


def build(plan: RunPlan, started: float | None = None) -> Run:
    """The model, optimizers and loader the plan describes; the resume from out_dir/latest if there is one; then
    the resolved config written to out_dir, the logger, compile/DDP wrapping and the attention monitor.
    started: when the run began (time.perf_counter()), from which the metrics rows' time_s count; None: from now."""
    cfg, rt, tc = plan.cfg, plan.rt, plan.cfg.train
    seed_everything(cfg.seed)  # the model's initialisation does not depend on what resolving drew
    # FSDP: built whole on the CPU, then each process keeps its shard on the device
    if plan.source is not None and plan.latest is None:
        model = plan.source.build_for(plan.model_config)  # the pretrained weights; optimizer and schedule start fresh
    else:
        model = GPT(plan.model_config)  # GPT-2's random initialisation (a resume then loads out_dir/latest into it)
    model.set_attention_kernel(plan.attention_kernel)
    model = shard_model(model, rt) if tc.parallel == "fsdp" else model.to(rt.device)
    optimizers = build_optimizers(model, tc)
    optimizers.set_compute_dtype(rt.autocast_dtype)
    prepared = plan.prepared
    loader = BatchLoader(prepared.split_files("train"), plan.model_config.block_size, tc.batch_size,
                         seed=cfg.seed, rank=rt.rank, world_size=rt.world_size, device=rt.device)
    result = TrainResult(out_dir=plan.out_dir, step=0, model=model)
    if plan.resume_point is not None:
        state = resume(plan.resume_point, plan.out_dir, model, optimizers, loader, rt)
        result.step, result.best_val = state["step"], state["best_val"]
        result.skipped_steps = state.get("skipped_steps", 0)
    if rt.is_main:
        # the model section as resolved (vocabulary from the tokenizer, a source's shape): `train.py
        # RUN/config.yaml out_dir=RUN` then describes this very model and resumes it
        with could_not_write(plan.out_dir / "config.yaml", plan.out_dir):
            write_file(plan.out_dir / "config.yaml", config_to_yaml(dataclasses.replace(cfg, model=plan.model_config)))

    logger = RunLogger(cfg, rt.is_main, result.step, resumed=plan.latest is not None, started=started)
    try:
        if plan.latest is not None:
            logger.write(f"resuming from '{plan.latest}' at step {result.step} (best val {result.best_val:.4f})")
        tokens_per_step = tc.batch_size * tc.grad_accum * rt.world_size * plan.model_config.block_size
        # each process runs 1/world_size of the step's tokens on its own device, measured against its own peak
        device_flops = model.flops_per_token(plan.model_config.block_size) * tokens_per_step / rt.world_size
        return Run(cfg=cfg, rt=rt, out_dir=plan.out_dir, prepared=prepared, model=_wrap(model, rt),
                   raw_model=model, optimizers=optimizers, loader=loader, extra=plan.extra, files=plan.files,
                   logger=logger, result=result, tokens_per_step=tokens_per_step, device_flops_per_step=device_flops,
                   scaler=torch.amp.GradScaler("cuda") if rt.autocast_dtype == torch.float16 else None,
                   peak=PeakFlops(tc.peak_flops, lambda: measure_peak_flops(rt.device, rt.autocast_dtype),
                                  logger.write),
                   monitor=_attention_monitor(cfg, model, prepared, logger, rt, result.step))
    except BaseException:
        if logger.bar is not None:
            logger.bar.close()  # end the progress bar's line first: the error printed next gets a line of its own
        raise


def _wrap(model: GPT, rt: Runtime) -> nn.Module:
    """What runs forward: the model, compiled if the plan says so (when auto compiled a model of the same shape
    to time it, torch reuses that compiled code), inside DDP under torchrun (FSDP: already sharded)."""
    wrapped: nn.Module = torch.compile(model) if rt.compile else model
    if rt.ddp and not is_sharded(model):
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(wrapped, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None)
    return wrapped


def train_loop(run: Run, should_stop: Callable[[int], bool] | None = None) -> TrainResult:
    """Steps from the run's current step to train.max_iters, with logging, evals, checkpoints and a clean
    stop on SIGINT/SIGTERM (or should_stop)."""
    tc, result = run.cfg.train, run.result
    start_step = result.step
    run.model.train()
    loop_t0 = time.perf_counter()
    window_t0, window_steps = loop_t0, 0
    with StopRequested() as stop:
        for step in range(start_step, tc.max_iters):
            loss_value, norm_value = train_step(run, step)
            # a skipped non-finite step (train.nonfinite=skip) has nothing to log, but its eval, checkpoint and
            # stop come as any step's: the weights it left unchanged are saved at the last step, and a Ctrl-C
            # during a run of skipped steps still stops the run
            if loss_value is not None:
                window_steps += 1
                if (step + 1) % tc.log_interval == 0 or step + 1 == tc.max_iters or step == start_step:
                    log_progress(run, step, loss_value, norm_value, time.perf_counter() - window_t0, window_steps)
                    window_t0, window_steps = time.perf_counter(), 0

            paused_t0 = time.perf_counter()
            if (step + 1) % run.cfg.eval.interval == 0 or step + 1 == tc.max_iters:
                evaluate_and_save(run, step + 1)
            elif run.monitor is not None and run.monitor.due(step + 1):
                run.monitor.snapshot(step + 1)
            # evals, saves and snapshots are not training time: the window's clock skips them (its steps
            # before an eval keep their time, so tokens/s stays true when evals fall between log lines)
            window_t0 += time.perf_counter() - paused_t0

            if stop.signal_name is None and should_stop is not None and should_stop(step + 1):
                stop.signal_name = "requested"
            if run.rt.ddp:  # all processes stop after the same step (saving is collective under FSDP)
                stop.signal_name = agreed_stop(stop.signal_name, run.rt.device)
            if stop.signal_name is not None:
                run.save(step + 1)
                result.interrupted = stop.signal_name
                run.logger.write(f"{stop.signal_name}: stopped after step {step + 1}; checkpoint saved in "
                                 f"'{run.out_dir / LATEST}'. Run the same command to resume.")
                break
    result.train_seconds = time.perf_counter() - loop_t0
    result.induction_summary = run.monitor.summary() if run.monitor is not None else None
    result.attn_seconds = run.monitor.seconds if run.monitor is not None else 0.0  # with the summary's path ablation
    if result.induction_summary is not None:
        run.logger.write(result.induction_summary)
    run.logger.close()
    return result


def train_step(run: Run, step: int) -> tuple[float | None, float]:
    """One optimizer step at `step` (0-based). Returns (loss, grad norm); loss None when the step was a
    non-finite one and train.nonfinite=skip skipped it. With nonfinite=stop such a step raises UserError
    before the weights change."""
    tc, rt, result = run.cfg.train, run.rt, run.result
    run.optimizers.set_step(step)
    loss_sum, grad_norm = accumulate_gradients(run.model, run.raw_model, run.loader.next_batch, rt, tc, run.scaler,
                                               run.optimizers)
    if rt.ddp:  # the mean over processes (SUM, then divide: gloo takes ReduceOp.AVG only from PyTorch 2.6)
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_sum /= rt.world_size
    loss_value, norm_value = loss_sum.item(), grad_norm.item()
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        run.optimizers.zero_grad()
        if tc.nonfinite == "skip":
            result.skipped_steps += 1
            run.logger.write(f"step {step}: non-finite loss {loss_value} / grad norm {norm_value}; step skipped "
                             f"({result.skipped_steps} so far)")
            result.step = step + 1
            return None, norm_value
        raise UserError(f"step {step}: the loss or gradient norm is not finite (loss {loss_value}, grad norm "
                        f"{norm_value}); stopped, the last good checkpoint in '{run.out_dir}' is intact. "
                        f"Lower train.lr, or set train.nonfinite=skip to skip such steps")
    apply_gradients(run.optimizers, run.scaler)
    result.losses[step] = loss_value
    result.step = step + 1
    return loss_value, norm_value


def log_progress(run: Run, step: int, loss_value: float, norm_value: float, elapsed: float, steps: int) -> None:
    """Scalars of the last `steps` steps (taking `elapsed` seconds) to metrics.jsonl, W&B and the bar:
    tokens_per_s of all processes together, MFU per device (one process's FLOP/s over its device's peak, never
    above 1: PeakFlops; marked <= where it is an upper bound)."""
    synchronize(run.rt.device)
    tok_s = run.tokens_per_step * steps / elapsed
    mfu = run.peak.mfu(run.device_flops_per_step * steps / elapsed)
    lr = run.optimizers.param_groups[-1]["lr"]
    run.logger.record(step + 1, {"train/loss": loss_value, "lr": lr, "grad_norm": norm_value,
                                 "tokens_per_s": tok_s, "mfu": mfu})
    run.logger.progress(steps, {"loss": f"{loss_value:.4f}", "lr": f"{lr:.2e}",
                                "tok/s": f"{tok_s:,.0f}", "mfu": f"{'<=' * run.peak.bounded}{100 * mfu:.1f}%"})


def evaluate_and_save(run: Run, step: int) -> None:
    """After `step` steps: eval losses, an attention snapshot, best/ if val improved, then latest/."""
    result = run.result
    try:
        losses = evaluate(run.raw_model, run.cfg, run.prepared, run.rt, run.raw_model.config.block_size)
    except (RuntimeError, MemoryError) as e:  # the eval's batches are eval.batch_size's, not train.batch_size's
        batch = run.cfg.eval.batch_size or f"unset, so train.batch_size's {run.cfg.train.batch_size}"
        error = out_of_memory(e, run.rt.device, f"lower eval.batch_size (now {batch})")
        if error is None:
            raise
        raise error from None
    improved = losses["val"] < result.best_val
    result.best_val = min(result.best_val, losses["val"])
    result.evals.append({"step": step, **losses})
    icl = losses.get("icl_score")  # None from an evaluate that measures losses only (a test's scripted one)
    run.logger.write(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                     f"{' (best)' if improved else ''}{'' if icl is None else f', ICL score {icl:.3f}'}")
    run.logger.record(step, {"val/loss": losses["val"], "train/eval_loss": losses["train"],
                             "val/best": result.best_val, **({} if icl is None else {"val/icl_score": icl})})
    if run.monitor is not None:
        if icl is not None:
            run.monitor.record_icl(step, icl)
        run.monitor.snapshot(step)
    if improved:
        run.save_best(step, losses["val"])
    run.save(step)


def _attention_monitor(cfg: RunConfig, model: GPT, prepared: PreparedData, logger: RunLogger, rt: Runtime,
                       start_step: int) -> Any:
    if cfg.attn.enabled and cfg.train.parallel == "fsdp" and not rt.is_main:
        return MonitorFollower(cfg, model, prepared, rt)  # the probe is a collective over the shards
    if not (rt.is_main and cfg.attn.enabled):
        return None
    from training.attn_monitor import AttentionMonitor
    return AttentionMonitor(cfg, model, prepared, logger, rt, start_step)

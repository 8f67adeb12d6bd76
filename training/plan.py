"""A run resolved once: the config (overrides already applied) and this machine -> everything the run is.

    resolve_run(cfg, rt, say) -> RunPlan

It decides, in this order and before any model of the run is built:
    latest        the checkpoint a resume continues (out_dir/latest), or None for a fresh run
    source        train.init_from's model, read without its weights (on a resume: out_dir/latest, for its shape
                  and tokenizer), or None for scratch
    model_config  the model's final shape: the config's, vocab_size from the tokenizer unless the config sets
                  it; or the source's, with the config's dropout, attn_impl and a block_size no longer than its own
    prepared      the tokenizer and the encoded splits, prepared on first use for that block_size
    resume_point  out_dir/latest's weights and training state, read and checked against all of the above
    rt, precision device and processes, the autocast dtype, compile and the attention kernel's precision:
                  `dtype: auto` / `train.compile: auto` are timed here on a model of the run's shape built for
                  the timing alone (training/autotune.py), or read back from out_dir on a resume
Nothing changes these afterwards: training/trainer.py builds the model, optimizers and loader from them.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from common.errors import UserError
from data.loader import BatchLoader
from data.prepare import PreparedData, prepare_data
from data.tokenizer import stored_tokenizer
from model.config import ModelConfig
from model.gpt import GPT
from pretrained.load import Pretrained
from pretrained.memory import BYTES_FP32, TRAINING_BYTES_PER_PARAM, check_fits_in_memory, param_count
from training.autotune import Choice, decide_precision
from training.checkpoint import LATEST
from training.config import RunConfig
from training.init_from import CROPPABLE, init_source
from training.optim import build_optimizers
from training.resume import ResumePoint, data_fingerprint, read_resume_point
from training.runtime import Runtime, seed_everything


@dataclass(frozen=True)
class RunPlan:
    """Everything a run is, resolved once (module doc)."""

    cfg: RunConfig  # the settings as given; callees take the sections they use
    rt: Runtime  # where and how it executes: device, processes, autocast dtype, compile (final)
    attention_kernel: str  # the fast path of plain causal attention (what auto measured fastest)
    choice: Choice | None  # what dtype/compile auto decided, with its measurements; None when nothing was auto
    out_dir: Path
    latest: Path | None  # the checkpoint a resume continues
    source: Pretrained | None  # train.init_from's model; None for scratch
    model_config: ModelConfig  # the final shape
    prepared: PreparedData  # tokenizer and encoded data
    # saved beside the weights in config.json (the tokenizer, the data's fingerprint), and the files beside it
    # (a tokenizer.json the tokenizer description names)
    extra: dict[str, Any]
    files: dict[str, bytes]
    resume_point: ResumePoint | None  # out_dir/latest, read and checked: what build loads into the run


def resolve_run(cfg: RunConfig, rt: Runtime, say: Callable[[str], None] | None = None) -> RunPlan:
    """The run's plan (module doc). rt: the processes and device from setup_runtime, with the explicit dtype's
    autocast; the plan's rt adds what auto decided. `say`: where the lines that say what is trained and what
    auto times go (before the progress bar exists); by default stderr, on the main process only."""
    if say is None:
        say = (lambda line: print(line, file=sys.stderr)) if rt.is_main else (lambda line: None)
    out_dir = Path(cfg.out_dir)
    seed_everything(cfg.seed)
    latest = out_dir / LATEST if (out_dir / LATEST).is_dir() else None
    if latest is not None and cfg.train.resume == "never":
        raise UserError(f"out_dir '{out_dir}' already holds a checkpoint and train.resume=never: set "
                        f"train.resume=auto to continue it, or choose another out_dir")
    source = init_source(cfg, latest)
    shape = model_shape(cfg, source)
    prepared = _prepare(cfg, rt, source, shape.block_size)
    model_config = shape if source is not None else with_vocab_size(cfg, shape, prepared.tokenizer.vocab_size)
    check_memory(model_config, rt, cfg.train.parallel == "fsdp")
    n_params = param_count(model_config)  # GPT(model_config).num_params(), from the config alone
    tokenizer_spec, files = stored_tokenizer(prepared.tokenizer)
    extra = {"tokenizer": tokenizer_spec, "data": data_fingerprint(prepared)}
    resume_point = (read_resume_point(latest, out_dir, model_config, extra, cfg.train, rt.world_size)
                    if latest is not None else None)
    for line in describe(cfg, rt, source if latest is None else None, model_config, prepared, n_params):
        say(line)
    # steps_left: a resume reuses its saved choice; one whose choice was lost measures as for the whole run
    choice, precision = decide_precision(cfg, rt, _timing_run(cfg, rt, model_config, prepared),
                                         steps_left=cfg.train.max_iters, resumed=latest is not None, say=say)
    rt = dataclasses.replace(rt, autocast_dtype=precision.autocast_dtype, compile=precision.compile)
    return RunPlan(cfg=cfg, rt=rt, attention_kernel=precision.attention_kernel, choice=choice, out_dir=out_dir,
                   latest=latest, source=source, model_config=model_config, prepared=prepared, extra=extra,
                   files=files, resume_point=resume_point)


def model_shape(cfg: RunConfig, source: Pretrained | None) -> ModelConfig:
    """The config's model section; with train.init_from, the source's shape with the config's dropout and
    attention implementation, at the config's model.block_size when it sets one (no larger than the source's:
    training/init_from.py refuses that)."""
    if source is None:
        return cfg.model
    return dataclasses.replace(source.config, dropout=cfg.model.dropout, attn_impl=cfg.model.attn_impl,
                               block_size=cfg.model_set.get(CROPPABLE, source.config.block_size))


def with_vocab_size(cfg: RunConfig, shape: ModelConfig, vocab: int) -> ModelConfig:
    """A scratch model's shape with vocab_size from the tokenizer's `vocab` (unless the config sets it)."""
    if cfg.vocab_size_from_tokenizer:
        # BPE vocabularies are padded to a multiple of 64 (GPT-2: 50257 -> 50304) for faster matmuls
        size = vocab if vocab < 1024 else 64 * math.ceil(vocab / 64)
        return dataclasses.replace(shape, vocab_size=size)
    if shape.vocab_size < vocab:
        raise UserError(f"model.vocab_size={shape.vocab_size} is smaller than the tokenizer's vocabulary "
                        f"({vocab}): remove model.vocab_size to take it from the tokenizer")
    return shape


def _prepare(cfg: RunConfig, rt: Runtime, source: Pretrained | None, block_size: int) -> PreparedData:
    """The main process prepares the data; the others wait for it, then read the same bins. With
    train.init_from, with the source's tokenizer."""
    tokenizer = source.tokenizer if source is not None else None
    if rt.is_main:
        prepared = prepare_data(cfg.data, block_size=block_size, tokenizer=tokenizer)
    if rt.ddp:
        torch.distributed.barrier()
    if not rt.is_main:
        prepared = prepare_data(cfg.data, block_size=block_size, quiet=True, tokenizer=tokenizer)
    return prepared


def check_memory(model_config: ModelConfig, rt: Runtime, sharded: bool) -> None:
    """Refuse, before allocating, a model whose training state cannot fit: the model is built (and a resume's
    weights read) on the CPU first, whole, then moved to the device; under FSDP each process then keeps
    1/world_size of the weights, gradients and AdamW moments. The run's one memory check: a resume reads its
    checkpoint's config without one of its own (training/resume.py)."""
    if sharded or rt.device.type != "cpu":  # on a CPU the training state's check below covers the weights
        built = "whole before sharding" if sharded else "on the CPU before they move to the device"
        check_fits_in_memory(model_config, "cpu", BYTES_FP32, source="this run's config",
                             what=f"its weights, built {built}")
    per_param = max(1, TRAINING_BYTES_PER_PARAM // rt.world_size) if sharded else TRAINING_BYTES_PER_PARAM
    check_fits_in_memory(model_config, rt.device, per_param, source="this run's config",
                         what="its weights, gradients and AdamW moments")


def describe(cfg: RunConfig, rt: Runtime, source: Pretrained | None, model_config: ModelConfig,
             prepared: PreparedData, n_params: int) -> list[str]:
    """The lines that say what is trained, before anything is timed: where its weights come from (`source`,
    for a fresh start from it), its shape and `n_params` parameters, data and device."""
    lines = []
    if source is not None:
        full = source.config.block_size
        context = (f"; context cropped to {model_config.block_size} of its {full}"
                   if model_config.block_size < full else "")
        lines.append(f"starting from the weights of {cfg.train.init_from} ({source.kind} checkpoint), with a fresh "
                     f"optimizer and schedule; tokenizer {source.tokenizer!r}{context}")
    lines.append(f"model: {n_params / 1e6:.2f}M parameters, {model_config.n_layer} layers, "
                 f"{model_config.n_head} heads ({model_config.n_kv_head} kv), d_model {model_config.d_model}, "
                 f"block {model_config.block_size}; data: {prepared.train_tokens:,} train / "
                 f"{prepared.val_tokens:,} val tokens; device {rt.device}"
                 f"{', autocast ' + str(rt.autocast_dtype).replace('torch.', '') if rt.autocast_dtype else ''}"
                 f"{f', {rt.world_size} processes' if rt.ddp else ''}"
                 f"{', FSDP' if cfg.train.parallel == 'fsdp' else ''}")
    return lines


def _timing_run(cfg: RunConfig, rt: Runtime, model_config: ModelConfig, prepared: PreparedData):
    """What auto times, built only when it measures: a model of the run's shape (its weights do not change a
    step's time; it is dropped afterwards, and torch.compile reuses its compiled code for the run's model, which
    has the same structure), its optimizers, and the first batch of the run's data."""
    def build():
        model = GPT(model_config).to(rt.device)
        loader = BatchLoader(prepared.split_files("train"), model_config.block_size, cfg.train.batch_size,
                             seed=cfg.seed, device=rt.device)
        return model, build_optimizers(model, cfg.train), loader.next_batch()
    return build

"""Is a loaded train_state.pt fit for this run? Checked before any of it is used.

`torch.load(weights_only=True)` stops code from running, not bad contents: AdamW moments of another shape
reach the fused optimizer kernel, which reads past the end of its buffers (a crash, or memory corruption);
`step: -5` would evaluate at negative steps. So every part of the state is checked against the model and
the run's settings first, and anything that does not fit is a CheckpointError naming the part:
  - step in [0, train.max_iters]; best_val a float (not NaN); skipped_steps in [0, step];
  - the optimizer states: as many optimizers and parameter groups as this run builds, each group over the
    same parameters, and per parameter exactly the tensors its optimizer keeps (AdamW: step, exp_avg,
    exp_avg_sq; Muon: momentum_buffer), of the parameter's shape and dtype, finite;
  - the RNG states: each one loads into a fresh generator of its kind (shape, dtype and length included);
  - the loader state: a non-negative batch count (seed, split and ranks are checked by the loader itself).
"""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from common.schema import is_int
from pretrained.checkpoint import CheckpointError
from training.muon import Muon
from training.optim import Optimizers

# per-parameter state each optimizer keeps (tensors of the parameter's shape, except AdamW's scalar step)
STATE_TENSORS = {torch.optim.AdamW: {"step", "exp_avg", "exp_avg_sq"}, Muon: {"momentum_buffer"}}
MAX_COUNT = 2**62  # step and batch counts beyond this are damage, not training


def check_train_state(state: dict[str, Any], path: Path, model: nn.Module, optimizers: Optimizers,
                      max_iters: int) -> None:
    """Raise CheckpointError("'path' does not fit this run: ...") unless `state` fits (module doc)."""
    problem = (_counters_problem(state, max_iters) or _optimizer_problem(state["optimizer"], model, optimizers)
               or _rng_problem(state["rng"]) or _loader_problem(state["loader"]))
    if problem:
        raise CheckpointError(f"'{path}' does not fit this run: {problem}")


def check_counters(state: dict[str, Any], path: Path, max_iters: int) -> None:
    """The counters alone (step, best_val, skipped_steps): what an FSDP state holds beside its DCP shards,
    whose tensors DCP itself checks against the sharded model and optimizer."""
    problem = _counters_problem(state, max_iters) if all(k in state for k in ("step", "best_val")) \
        else "it lacks the step or best_val"
    if problem:
        raise CheckpointError(f"'{path}' does not fit this run: {problem}")


def _counters_problem(state: dict[str, Any], max_iters: int) -> str | None:
    step, best_val, skipped = state["step"], state["best_val"], state.get("skipped_steps", 0)
    if not is_int(step) or not 0 <= step <= MAX_COUNT:
        return f"step {step!r} is not a step count"
    if step > max_iters:
        return (f"it is at step {step}, beyond train.max_iters={max_iters}: raise train.max_iters to continue "
                f"the run")
    if not isinstance(best_val, float) or math.isnan(best_val) or best_val == -math.inf:
        return f"best_val {best_val!r} is not a loss"
    if not is_int(skipped) or not 0 <= skipped <= step:
        return f"skipped_steps {skipped!r} is not a count in [0, step={step}]"
    return None


def _optimizer_problem(saved: Any, model: nn.Module, optimizers: Optimizers) -> str | None:
    names = {id(p): name for name, p in model.named_parameters()}
    ours = optimizers.optimizers
    if len(saved) != len(ours):
        kinds = " + ".join(type(opt).__name__ for opt in ours)
        return (f"it holds the state of {len(saved)} optimizer(s), this run uses {len(ours)} ({kinds}): resume "
                f"with the train.optimizer it was saved with")
    for i, (opt, opt_state) in enumerate(zip(ours, saved)):
        where = f"optimizer {i} ({type(opt).__name__})"
        if not isinstance(opt_state, dict) or not isinstance(opt_state.get("state"), dict) \
                or not isinstance(opt_state.get("param_groups"), list):
            return f"{where} is not an optimizer state"
        fresh_groups = opt.state_dict()["param_groups"]
        groups = opt_state["param_groups"]
        if len(groups) != len(fresh_groups) or any(
                not isinstance(g, dict) or g.get("params") != f["params"] for g, f in zip(groups, fresh_groups)):
            return f"{where}: its parameter groups do not match this model's (another model or optimizer)"
        params = [p for group in opt.param_groups for p in group["params"]]  # index i of the state dict
        expected_keys = STATE_TENSORS.get(type(opt))
        for index, param_state in opt_state["state"].items():
            if not is_int(index) or not 0 <= index < len(params):
                return f"{where} keeps state for parameter {index!r}, which this model lacks"
            param = params[index]
            problem = _param_state_problem(param_state, param, expected_keys)
            if problem:
                return f"{where}, {names.get(id(param), f'parameter {index}')}: {problem}"
    return None


def _param_state_problem(param_state: Any, param: torch.Tensor, expected_keys: set[str] | None) -> str | None:
    if not isinstance(param_state, dict):
        return "its state is not a mapping of tensors"
    if expected_keys is not None and set(param_state) != expected_keys:
        return f"its state holds {sorted(param_state)}, expected {sorted(expected_keys)}"
    for key, value in param_state.items():
        if not isinstance(value, torch.Tensor):
            return f"{key} is a {type(value).__name__}, not a tensor"
        if key == "step":  # AdamW's step count: a float32 scalar
            if value.dim() != 0 or not value.is_floating_point() or not 0 <= float(value) <= MAX_COUNT \
                    or not float(value).is_integer():
                return f"step {value.tolist()!r} is not a step count"
            continue
        if tuple(value.shape) != tuple(param.shape) or value.dtype != param.dtype:
            return (f"{key} has shape {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}, the "
                    f"parameter {tuple(param.shape)} {str(param.dtype).replace('torch.', '')}")
        if not torch.isfinite(value).all():
            return f"{key} holds NaN or inf values"
        if key == "exp_avg_sq" and (value < 0).any():
            return f"{key} holds negative values (a mean of squares)"
    return None


def _rng_problem(rng: Any) -> str | None:
    """Each RNG state is tried on a fresh generator of its kind: the global ones stay untouched."""
    try:
        version, internal, gauss = rng["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = rng["numpy"]
        if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.shape != (624,) \
                or not bool(((keys >= 0) & (keys < 2**32)).all()):
            raise ValueError("the numpy key is not 624 32-bit integers")
        if not is_int(pos) or not 0 <= pos <= 624:
            raise ValueError(f"the numpy position {pos!r} is outside 0..624")
        np.random.RandomState().set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch_state = rng["torch"]
        if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8:
            raise ValueError("the torch state is not a byte tensor")
        torch.Generator().set_state(torch_state)
        for cuda_state in rng.get("cuda", []):
            if not isinstance(cuda_state, torch.Tensor) or cuda_state.dtype != torch.uint8 or cuda_state.dim() != 1:
                raise ValueError("a CUDA state is not a byte tensor")
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, RuntimeError) as e:
        return f"its RNG states are damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
    return None


def _loader_problem(loader: dict[str, Any]) -> str | None:
    drawn = loader.get("batches_drawn")
    if not is_int(drawn) or not 0 <= drawn <= MAX_COUNT:
        return f"the loader's batches_drawn {drawn!r} is not a batch count"
    return None

"""Checkpoints of an FSDP run: sharded through torch.distributed.checkpoint, plus consolidated weights.

    out_dir/latest/   dcp/ (.metadata, __<rank>_0.distcp: each process's shards of the weights and AdamW
                      moments), fsdp_state.pt (step, best val, skipped steps, and every process's data
                      loader position and RNG states), model.safetensors + config.json (the whole model,
                      gathered: what sample.py and `load_model` read)
    out_dir/best/     model.safetensors + config.json, gathered the same way

Why both: the sharded state is what a resume needs and what scales (no process ever holds the whole
optimizer state, and DCP writes every shard in parallel); the consolidated weights are what everything
else reads, so an FSDP run's checkpoints sample exactly like a single-process run's.

Atomic like training/checkpoint.py: every process writes its shards into `.latest.tmp/dcp`; then rank 0
writes the rest, fsyncs, and swaps the folder in with the same two renames (latest -> .latest.old,
.latest.tmp -> latest), so a crash at any moment leaves a complete checkpoint (checkpoint_dir recovers
one caught between the renames). The processes wait for each other (barriers) before and after.
A resume loads each process's shards into the freshly sharded model and optimizer, and its own loader
position and RNG states: the same exact-resume guarantee as a single process (tests/training/test_dist_checkpoint.py).
`fsdp_state.pt` holds only tensors and plain data and is read with weights_only=True. The out_dir must be
a filesystem every process sees (one machine, or a shared mount across nodes).
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from common.errors import UserError
from common.writes import fsync_dir, owning, write_file
from pretrained.checkpoint import BEST, LATEST, CheckpointError, write_model_files
from training.checkpoint import WRITE_ERRORS, _reason, rename_in
from training.runtime import Runtime, rng_state, set_rng_state
from training.state_check import check_counters

STATE_FILE = "fsdp_state.pt"
DCP_DIR = "dcp"


def _all_ok(ok: bool, device: torch.device) -> bool:
    """Did every process succeed? (A flag on the run's device: NCCL reduces CUDA tensors only.)"""
    flag = torch.tensor(0 if ok else 1, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag) == 0


def save_sharded(out_dir: Path, model: nn.Module, optimizers: Any, extra: dict[str, Any], rt: Runtime,
                 state: dict[str, Any] | None, files: dict[str, bytes] | None = None) -> None:
    """Write atomically, with the training `state`, out_dir/latest: consolidated weights, the sharded weights +
    optimizer and every rank's loader/RNG state; without it (None), out_dir/best: the consolidated weights
    alone. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    import torch.distributed.checkpoint as dcp

    name = LATEST if state is not None else BEST  # only latest/ is resumed from: best/ needs no shards
    tmp = out_dir / f".{name}.tmp"
    # the whole model's weights, gathered on rank 0's CPU (empty on other ranks)
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if model.config.tie_embeddings:
        weights.pop("lm_head.weight", None)  # tok_emb.weight's tensor (pretrained/checkpoint.py saves it once)
    weights = {key: tensor.detach().contiguous() for key, tensor in weights.items()}
    error: BaseException | None = None
    if rt.is_main:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except WRITE_ERRORS as e:
            error = e
    if _all_ok(error is None, rt.device) and state is not None:  # the shards: every rank writes its own, in parallel
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, {"loader": state.pop("loader"), "rng": rng_state()})
        try:
            model_state, optim_state = get_state_dict(model, optimizers.optimizers)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / DCP_DIR))
        except WRITE_ERRORS as e:  # DCP raises on every rank when one fails to write
            error = e
    if rt.is_main and error is None:
        try:
            bad = [key for key, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()]
            if bad:
                raise UserError(f"the model holds NaN or inf values (e.g. {bad[0]}); not saving it over the last "
                                f"good checkpoint. Lower train.lr or enable train.grad_clip")
            with owning(out_dir, "out_dir"):
                write_model_files(tmp, weights, {"model": model.config.to_dict(), **extra}, files)
                if state is not None:
                    write_file(tmp / STATE_FILE, lambda f: torch.save(
                        {**state, "world_size": dist.get_world_size(), "ranks": ranks}, f))
                fsync_dir(tmp / DCP_DIR)
        except (UserError, *WRITE_ERRORS) as e:  # UserError: NaN weights, never saved over a good checkpoint
            error = e
    if not _all_ok(error is None, rt.device):
        if rt.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, UserError):
            raise error
        reason = f" ({_reason(error)})" if error is not None else " (on another process)"
        raise UserError(f"could not write checkpoint '{out_dir / name}'{reason}; the previous checkpoint is "
                        f"intact. Free disk space or fix permissions of '{out_dir}'")
    if rt.is_main:  # the complete `.name.tmp` becomes `name` (two renames, as training/checkpoint.py does)
        rename_in(out_dir, name)
        fsync_dir(out_dir)
        shutil.rmtree(out_dir / f".{name}.old", ignore_errors=True)
    dist.barrier()


def read_sharded_state(latest: Path, out_dir: Path, world_size: int, max_iters: int) -> dict[str, Any]:
    """The training state of a sharded latest/ (step, best_val, skipped_steps, each process's loader and RNG),
    read and checked against this run's process count and train.max_iters before anything is loaded: a
    checkpoint that does not fit is a UserError."""
    redo = f"use another out_dir, or delete '{out_dir}' to start over"
    path = latest / STATE_FILE
    if not path.is_file():
        raise UserError(f"cannot resume from '{latest}' with train.parallel=fsdp: it has no {STATE_FILE} (it was "
                        f"saved by train.parallel=ddp or a single process; resume it with train.parallel=ddp), or {redo}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for code in the pickle; truncated or damaged files
        raise UserError(f"cannot resume from '{path}' ({type(e).__name__}: {_reason(e)[:120]}): {redo}") from None
    if not isinstance(state, dict) or not isinstance(state.get("ranks"), list) \
            or state.get("world_size") != world_size or len(state["ranks"]) != world_size:
        saved = state.get("world_size") if isinstance(state, dict) else None
        raise UserError(f"'{path}' was saved by {saved} processes and this run has {world_size}: resume with the "
                        f"same number of processes (each one's data position is its own), or {redo}")
    try:
        check_counters(state, path, max_iters)
    except CheckpointError as e:
        raise UserError(f"cannot resume from '{latest}': {e}; {redo}") from None
    return state


def load_sharded(latest: Path, out_dir: Path, state: dict[str, Any], model: nn.Module, optimizers: Any, loader: Any,
                 rt: Runtime) -> dict[str, Any]:
    """Restore a sharded latest/ into this run's model, optimizer, loader and RNG, from its training state as
    read_sharded_state checked it; returns that state (step, best_val, skipped_steps)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import torch.distributed.checkpoint as dcp

    redo = f"use another out_dir, or delete '{out_dir}' to start over"
    try:
        model_state, optim_state = get_state_dict(model, optimizers.optimizers)
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(latest / DCP_DIR))
        set_state_dict(model, optimizers.optimizers, model_state_dict=model_state, optim_state_dict=optim_state)
        mine = state["ranks"][rt.rank]
        loader.load_state_dict(mine["loader"])
        set_rng_state(mine["rng"])
    except UserError:
        raise
    except Exception as e:  # DCP: missing or mismatched shards, another optimizer, a damaged file
        raise UserError(f"cannot resume from '{latest}': its sharded state does not fit this run "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:160]}); resume with the settings it was "
                        f"saved with, or {redo}") from None
    return state

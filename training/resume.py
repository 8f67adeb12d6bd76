"""Resuming a run from out_dir/latest, after checking that the checkpoint belongs to this run.

A resume continues the saved run exactly, so everything it loads must fit: the model's shape (config.json),
the data it was trained on (the tokenizer and a content fingerprint of the token bins, both in config.json),
and the training state (training/state_check.py). Anything else is refused with one line that says what
differs, before any of it is used; nothing in latest/ changes. Training other data from these weights is a
new run: `out_dir=NEW train.init_from=OLD_OUT_DIR` (fresh optimizer and schedule, the weights kept).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from common.errors import UserError
from data.prepare import PreparedData
from pretrained.checkpoint import WEIGHTS_FILE, CheckpointError, read_config, read_weights
from model.config import ModelConfig
from model.gpt import GPT
from training.checkpoint import STATE_FILE, load_train_state
from training.config import TrainConfig
from training.dist_checkpoint import STATE_FILE as FSDP_STATE_FILE, load_sharded, read_sharded_state
from training.optim import Optimizers, build_optimizers
from training.runtime import Runtime, set_rng_state
from training.state_check import check_train_state

FINGERPRINT_BYTES = 1 << 20  # of each token bin: its first and last MiB, and its length


def data_fingerprint(prepared: PreparedData) -> dict[str, Any]:
    """What a checkpoint records about its data (config.json's "data"): the source in words, and a content
    fingerprint: token counts and a sha256 over the shard sizes and the first and last MiB of each split's
    token stream. Cheap on any corpus size, independent of where the data folder lies or of file times, and
    different for another corpus even when its vocabulary has the same size."""
    digest = hashlib.sha256()
    for split in ("train", "val"):
        stream, total = prepared.stream(split), prepared.split_tokens(split)
        n = min(total, FINGERPRINT_BYTES // prepared.dtype.itemsize)
        sizes = ",".join(str(shard.tokens) for shard in prepared.split_shards(split))
        digest.update(f"{split}:{total}:{sizes}:{prepared.dtype.name}:".encode())
        digest.update(np.ascontiguousarray(stream.read(0, n)).tobytes())
        digest.update(np.ascontiguousarray(stream.read(total - n, total)).tobytes())
    return {"source": prepared.meta.get("source"), "train_tokens": prepared.train_tokens,
            "val_tokens": prepared.val_tokens, "fingerprint": digest.hexdigest()[:16],
            "content": source_content(prepared.meta)}


def source_content(meta: dict[str, Any]) -> str | None:
    """A hash of the corpus's every byte, from the whole-file sha256 per local file that the prepare recorded
    (meta.json "files": [name, size, sha256], in the corpus's order); None for a corpus with no local files (a
    hub dataset) or a folder prepared before whole files were hashed. The token fingerprint above reads only the
    ends of each split: an edit in the middle that keeps the token count would otherwise resume unnoticed."""
    files = meta.get("files")
    if not isinstance(files, list) or not files:
        return None
    hashes = [entry[2] if isinstance(entry, list) and len(entry) == 3 else None for entry in files]
    if not all(isinstance(h, str) and len(h) == 64 for h in hashes):
        return None
    return hashlib.sha256(",".join(hashes).encode()).hexdigest()[:16]


def _start_new_run(out_dir: Path) -> str:
    return f"start a new run from these weights: out_dir=NEW_DIR train.init_from={out_dir}"


def check_same_model(saved: dict[str, Any], model_cfg: ModelConfig, out_dir: Path) -> None:
    ours = model_cfg.to_dict()
    shape_keys = [k for k in ours if k not in ("dropout", "attn_impl")]  # these may change across a resume
    diffs = [f"{k} {saved['model'].get(k)!r} vs {ours[k]!r}" for k in shape_keys if saved["model"].get(k) != ours[k]]
    if diffs:
        raise UserError(f"out_dir '{out_dir}' holds a checkpoint of a different model ({'; '.join(diffs[:3])}): "
                        f"use another out_dir, or delete '{out_dir}' to start over")


def check_same_data(saved: dict[str, Any], extra: dict[str, Any], out_dir: Path) -> None:
    """The tokenizer and the data of the checkpoint must be this run's (checkpoints from before the data was
    recorded are compared on the tokenizer alone)."""
    saved_tok, our_tok = saved.get("tokenizer"), extra["tokenizer"]
    if saved_tok != our_tok:
        theirs, ours = _describe_tokenizer(saved_tok), _describe_tokenizer(our_tok)
        same_size = " (the same size, other tokens)" if theirs == ours else ""
        raise UserError(f"out_dir '{out_dir}' holds a checkpoint trained with another tokenizer ({theirs}) than "
                        f"this run's data has ({ours}){same_size}: resume with the data it was trained on, or "
                        f"{_start_new_run(out_dir)}")
    saved_data, our_data = saved.get("data"), extra["data"]
    # the corpus's content is compared where both sides recorded it (checkpoints from before it was recorded,
    # and hub corpora, are compared on their tokens alone)
    other_content = isinstance(saved_data, dict) and None not in (saved_data.get("content"), our_data.get("content")) \
        and saved_data.get("content") != our_data.get("content")
    if isinstance(saved_data, dict) and (other_content or any(saved_data.get(k) != our_data[k]
                                                              for k in ("train_tokens", "val_tokens", "fingerprint"))):
        raise UserError(f"out_dir '{out_dir}' holds a checkpoint trained on other data ({_describe_data(saved_data)}) "
                        f"than this run's ({_describe_data(our_data)}): resume with the data it was trained on, "
                        f"or {_start_new_run(out_dir)}")


def _describe_tokenizer(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "none recorded"
    kind = spec.get("kind", "?")
    if kind == "char":
        chars = spec.get("chars", "")
        return f"char, {len(chars)} characters" if isinstance(chars, str) else "char"
    return f"{kind} {spec.get('encoding', '')}, {spec.get('vocab_size', '?')} tokens"


def _describe_data(data: dict[str, Any]) -> str:
    content = f", content {data['content']}" if data.get("content") else ""
    return (f"{data.get('source')}: {data.get('train_tokens')} train / {data.get('val_tokens')} val tokens, "
            f"fingerprint {data.get('fingerprint')}{content}")


def _refuse(latest: Path, out_dir: Path, reason: str) -> UserError:
    return UserError(f"cannot resume from '{latest}': {reason}; use another out_dir, or delete '{out_dir}' "
                     f"to start over")


@dataclass
class ResumePoint:
    """What out_dir/latest holds for a resume, read and checked against the run before any model is built
    (`read_resume_point`, in training/plan.py), then put into the built run by `resume`."""

    latest: Path
    weights: dict[str, torch.Tensor] | None  # None under FSDP: its shards are read and checked by DCP at load
    # the training state: step, best_val, skipped_steps, and the optimizer, loader(s) and RNG (under FSDP each
    # process's loader and RNG; the optimizer is in the shards)
    state: dict[str, Any] | None

    def take(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """The weights and training state, handed over once: the plan holding this point then keeps no second
        copy of them alive while the run trains."""
        weights, state, self.weights, self.state = self.weights, self.state, None, None
        if state is None:
            raise RuntimeError(f"the resume point of '{self.latest}' was already taken")
        return weights, state


def read_resume_point(latest: Path, out_dir: Path, model_config: ModelConfig, extra: dict[str, Any],
                      train_cfg: TrainConfig, world_size: int = 1) -> ResumePoint:
    """Read and check everything a resume loads (module doc) against the run's final model config and data
    (`extra`: the tokenizer and data fingerprint it records): weights and optimizer state are compared with a
    model and optimizers of that config built on the meta device, so nothing of the run is allocated yet. A
    checkpoint that does not fit is a UserError; nothing is loaded into anything."""
    try:
        # its memory: the plan checked the run's model_config, which the checkpoint's must equal (check_same_model)
        saved = read_config(latest, check_memory=False)
        check_same_data(saved, extra, out_dir)  # first: other data (a tokenizer of another size) explains a
        check_same_model(saved, model_config, out_dir)  # vocab_size that differs better than the shape does
        if train_cfg.parallel == "fsdp":
            return ResumePoint(latest, weights=None,
                               state=read_sharded_state(latest, out_dir, world_size, train_cfg.max_iters))
        if (latest / FSDP_STATE_FILE).is_file():
            raise UserError(f"'{latest}' was saved by train.parallel=fsdp: resume it with train.parallel=fsdp, or "
                            f"use another out_dir")
        weights = read_weights(latest / WEIGHTS_FILE, model_config)
        state = load_train_state(latest)
        with torch.device("meta"):
            model = GPT(model_config)
            check_train_state(state, latest / STATE_FILE, model, build_optimizers(model, train_cfg),
                              train_cfg.max_iters)
    except CheckpointError as e:
        raise _refuse(latest, out_dir, str(e)) from None
    return ResumePoint(latest, weights, state)


def resume(point: ResumePoint, out_dir: Path, model: nn.Module, optimizers: Optimizers, loader: Any,
           rt: Runtime | None = None) -> dict[str, Any]:
    """Load the checked weights, optimizer, loader position and RNG states of `point` into the freshly built
    run (an FSDP run's sharded ones through torch.distributed.checkpoint: training/dist_checkpoint.py, on `rt`).
    Returns the training state (step, best_val, skipped_steps)."""
    weights, state = point.take()
    if weights is None:  # FSDP: its config, data and training state were checked by read_resume_point
        return load_sharded(point.latest, out_dir, state, model, optimizers, loader, rt)
    try:
        model.load_state_dict(weights, strict=False)  # strict=False only for a tied lm_head, never saved
        optimizers.load_state_dict(state["optimizer"])
        loaders = state.get("loaders")  # every process's loader position (one process: loaders[0] is "loader")
        loader.load_state_dict(loaders[loader.rank] if isinstance(loaders, list) and len(loaders) == loader.world_size
                               else state["loader"])
        set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:  # what the checks cannot foresee
        raise _refuse(point.latest, out_dir, f"its {STATE_FILE} does not fit this run ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:160]})") from None
    return state

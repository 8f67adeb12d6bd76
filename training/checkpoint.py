"""Training checkpoints: saved atomically, loaded without running any code.

    out_dir/latest/   model.safetensors, config.json (model + tokenizer), train_state.pt
    out_dir/best/     model.safetensors, config.json (the lowest val loss so far; what sample.py reads)

A save writes a complete folder `.latest.tmp`, fsyncs it, then swaps it in with two renames
(latest -> .latest.old, .latest.tmp -> latest). A crash at any moment leaves either the old or the new
checkpoint complete on disk: `latest` itself, or `.latest.old` between the two renames, which
`checkpoint_dir` recovers. `train_state.pt` holds only tensors, numbers, strings, lists and dicts, and
is read with `torch.load(weights_only=True)`, which refuses anything else instead of executing it.
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from model.checkpoint import CheckpointError, fsync_file, save_model
from model.gpt import GPT

LATEST = "latest"
BEST = "best"
STATE_FILE = "train_state.pt"


def save_checkpoint(out_dir: str | Path, name: str, model: GPT, extra: dict[str, Any],
                    train_state: dict[str, Any] | None = None) -> Path:
    """Write `out_dir/name` atomically. A failed write (disk full, permissions) leaves the previous
    checkpoint intact and raises UserError saying so."""
    out_dir = Path(out_dir)
    final, tmp, old = out_dir / name, out_dir / f".{name}.tmp", out_dir / f".{name}.old"
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"the model holds NaN or inf values (e.g. {bad[0]}); not saving it over '{final}', "
                        f"which keeps the last good checkpoint. Lower train.lr or enable train.grad_clip")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tmp, extra)
        if train_state is not None:
            torch.save(train_state, tmp / STATE_FILE)
            fsync_file(tmp / STATE_FILE)
        fsync_dir(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"could not write checkpoint '{final}' ({e.strerror or e}); the previous checkpoint "
                        f"is intact. Free disk space or fix permissions of '{out_dir}'") from None
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_dir(out_dir: str | Path, name: str) -> Path | None:
    """The complete checkpoint `out_dir/name`, recovering one caught between the two renames of a save."""
    out_dir = Path(out_dir)
    final, old = out_dir / name, out_dir / f".{name}.old"
    if final.is_dir():
        return final
    if old.is_dir():
        os.replace(old, final)  # a save died after moving the old one aside: it is still the newest complete one
        return final
    return None


def load_train_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"no {STATE_FILE} in '{directory}': cannot resume from it")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"'{path}' holds objects other than tensors and plain data; refusing to load it "
                              f"(it could run code). ({str(e).splitlines()[0][:120]})") from None
    except Exception as e:  # truncated zip, bad magic number, ...
        raise CheckpointError(f"'{path}' is corrupted or truncated ({type(e).__name__}: {str(e)[:120]})") from None


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new file in `path` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Training checkpoints: saved atomically, loaded without running any code.

    out_dir/latest/   model.safetensors, config.json (model + tokenizer), train_state.pt
    out_dir/best/     model.safetensors, config.json (the lowest val loss so far; what sample.py reads)

A save writes a complete folder `.latest.tmp`, fsyncs it, then swaps it in with two renames
(latest -> .latest.old, .latest.tmp -> latest). A crash at any moment leaves either the old or the new
checkpoint complete on disk: `latest` itself, or `.latest.old` between the two renames, which
`checkpoint_dir` recovers when the next run starts (the writer, under the run's lock: training/run_dir.py). `train_state.pt` holds only tensors, numbers, strings, lists and dicts, and
is read with `torch.load(weights_only=True)`, which refuses anything else instead of executing it.

Test hook: with `ATTNGPT_TEST_SAVE_DELAY=<seconds>` in the environment, a save sleeps that long once the
temporary folder is complete and again between the two renames, so a crash test can kill a run inside
those windows on purpose (tests/training/test_checkpoint_reliability.py). Unset (always, outside tests), it does nothing.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.writes import fsync_dir, owning, write_file
from pretrained.checkpoint import BEST, LATEST, CheckpointError, save_model
from model.gpt import GPT
from training.run_dir import RunDirLock

try:
    from safetensors import SafetensorError
except ImportError:  # older safetensors do not export it; their write errors are OSErrors
    SafetensorError = OSError

STATE_FILE = "train_state.pt"
TEST_SAVE_DELAY_ENV = "ATTNGPT_TEST_SAVE_DELAY"
# what a failed write raises: OSError from Python, RuntimeError from torch.save's zip writer,
# SafetensorError ("I/O error: No space left on device") from safetensors
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
# what a training state must hold for a resume, and of which type
STATE_KEYS = {"step": int, "best_val": float, "optimizer": list, "loader": dict, "rng": dict}


def save_checkpoint(out_dir: str | Path, name: str, model: GPT, extra: dict[str, Any],
                    train_state: dict[str, Any] | None = None, files: dict[str, bytes] | None = None) -> Path:
    """Write `out_dir/name` atomically (`files`: written beside config.json, e.g. a tokenizer.json). A failed
    write (disk full, permissions) leaves the previous checkpoint intact and raises UserError saying so."""
    out_dir = Path(out_dir)
    final, tmp, old = out_dir / name, out_dir / f".{name}.tmp", out_dir / f".{name}.old"
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"the model holds NaN or inf values (e.g. {bad[0]}); not saving it over '{final}', "
                        f"which keeps the last good checkpoint. Lower train.lr or enable train.grad_clip")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        with owning(out_dir, "out_dir"):  # this process's run (the trainer owns it already; a direct call too)
            save_model(model, tmp, extra, files)
            if train_state is not None:
                write_file(tmp / STATE_FILE, lambda f: torch.save(train_state, f))
        rename_in(out_dir, name)
    except WRITE_ERRORS as e:
        if not final.exists() and old.is_dir():
            try:
                os.replace(old, final)  # the second rename failed: put the previous checkpoint back
            except OSError:
                pass  # the next run's checkpoint_dir() recovers it from .name.old
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"could not write checkpoint '{final}' ({_reason(e)}); the previous checkpoint "
                        f"is intact. Free disk space or fix permissions of '{out_dir}'") from None
    fsync_dir(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def rename_in(out_dir: Path, name: str) -> None:
    """The complete `.name.tmp` (its files fsynced) becomes `name` with two renames (`name` -> `.name.old`, `.name.tmp`
    -> `name`); the caller fsyncs out_dir and removes `.name.old` afterwards. Used by both writers (this one
    and training/dist_checkpoint.py), with the crash-test pauses between the steps."""
    final, tmp, old = out_dir / name, out_dir / f".{name}.tmp", out_dir / f".{name}.old"
    fsync_dir(tmp)
    _test_pause()
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    _test_pause()
    os.replace(tmp, final)


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _test_pause() -> None:
    """The crash-test hook (module doc): sleep ATTNGPT_TEST_SAVE_DELAY seconds when it is set."""
    delay = os.environ.get(TEST_SAVE_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def checkpoint_dir(lock: RunDirLock, name: str) -> Path | None:
    """The complete checkpoint `name` of the locked run directory, finishing a save that a crash interrupted.

    Only the writer calls this, holding the run's lock (readers use pretrained.checkpoint.find_checkpoint, which
    reads a half-swapped checkpoint where it lies). A save died:
      - between its two renames (`name` missing, `.name.old` complete): `.name.old` is renamed back;
      - after both renames (`name` and `.name.old`): the new `name` is complete, `.name.old` is removed;
      - before the renames: `.name.tmp` is removed (the previous `name` was never touched).
    A regular file where the folder belongs is refused now, not at the first save; so is a symbolic link (to a
    folder or not): every save renames `name` aside and a new folder into its place, which would replace the
    link by a folder, and the temporary `.name.tmp` is written through whatever it points to. A run keeps its
    checkpoints as real folders inside out_dir (out_dir itself may be a link: renames inside it are plain)."""
    if not lock.held:
        raise RuntimeError("checkpoint_dir needs the run directory's lock: only the writer may recover a save")
    out_dir = lock.out_dir
    final, old, tmp = out_dir / name, out_dir / f".{name}.old", out_dir / f".{name}.tmp"
    for path in (final, old, tmp):
        if path.is_symlink():
            raise UserError(f"'{path}' is a symbolic link (to '{os.readlink(path)}'), where the run keeps its {name} "
                            f"checkpoint as a real folder (each save replaces it by renaming): replace the link by a "
                            f"copy of the folder it points to, or choose another out_dir")
        if path.exists() and not path.is_dir():
            raise UserError(f"'{path}' is a file, where the run keeps its {name} checkpoint folder: move or "
                            f"delete it, or choose another out_dir")
    shutil.rmtree(tmp, ignore_errors=True)
    if not final.is_dir() and old.is_dir():
        os.replace(old, final)  # the newest complete checkpoint: the save died after moving it aside
        fsync_dir(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final if final.is_dir() else None


def load_train_state(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"no {STATE_FILE} in '{directory}': cannot resume from it")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # "Unsupported global: GLOBAL io.open", "unsupported GLOBAL posix.system", "Unsupported operand 149"
        found = re.search(r"(?i)unsupported (?:global: )?(?:GLOBAL \S+|operand \d+)", str(e))
        detail = f" ({found.group(0)[:120]})" if found else ""
        raise CheckpointError(f"'{path}' holds objects other than tensors and plain data{detail}; refusing to "
                              f"load it, since unpickling it could run code") from None
    except Exception as e:  # truncated zip, bad magic number, ...
        raise CheckpointError(f"'{path}' is corrupted or truncated ({type(e).__name__}: {_reason(e)[:120]})") from None
    wrong = [key for key, kind in STATE_KEYS.items() if not isinstance(state, dict)
             or not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)]
    if wrong:
        raise CheckpointError(f"'{path}' is not an attngpt training state (missing or invalid: {', '.join(wrong)})")
    return state

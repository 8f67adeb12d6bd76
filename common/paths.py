"""Paths from the user: what `~` means in them, and where a command that only reads a run may write.

Why one module: a path comes in through a config file, an override or a flag, and every one of them must mean
the same thing (`~/runs/x` is the home folder's runs/x everywhere, never a folder named `~`); and the commands
that read a run (sample.py's attention dump, convert.py's output folder) must never write into one, which only
its training process writes.

`expand_path(text, setting)`   `~` and `~user` expanded, nothing else changed (a relative path stays relative);
                               a NUL character, which no file system takes, and a name that is not valid UTF-8
                               (bytes arriving as lone surrogates; no config or log could record it) are a
                               UserError naming the setting.
                               Config settings marked as paths go through it when the config is read
                               (common/config_io.py: PATH), command-line flags through `path_argument`.
`enclosing_run(path)`          the run or model folder that `path` lies in (the folder itself or one above it),
                               and why it is one; None when it lies in none. What marks such a folder:
                                 - `.train.lock` (a training run's lock: training/run_dir.py);
                                 - `config.yaml` beside a `latest/` or `best/` that holds `model.safetensors`
                                   (a run's out_dir copied without its lock);
                                 - a checkpoint's or model's files: `model.safetensors` (or its sharded index),
                                   `train_state.pt`, `fsdp_state.pt` -- a run's `latest/` and `best/`, a folder
                                   convert.py wrote, a Hugging Face model folder.
                               `path` is resolved first (symbolic links followed, as a write would follow them);
                               the parts that do not exist yet are taken as written.
`check_outside_runs(path, what, fix, own_mark)`   a UserError when `path` lies in such a folder; with `own_mark`,
                               a folder `path` that holds that file and no subfolder (a model folder the command
                               itself wrote, e.g. convert.py's) is not refused for its own model files: only a run
                               lock or a run's config in it, or a run or model folder above it, count.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

from common.errors import UserError

RUN_LOCK = ".train.lock"  # training/run_dir.py
RUN_CONFIG = "config.yaml"  # the resolved config a run writes into its out_dir
CHECKPOINT_NAMES = ("latest", "best")
# files only a checkpoint or a model folder holds (pretrained/checkpoint.py, training/checkpoint.py,
# training/dist_checkpoint.py; a Hugging Face folder's weights)
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "train_state.pt", "fsdp_state.pt")


def expand_path(text: str, setting: str) -> str:
    """`text` with a leading `~` or `~user` expanded (module doc); `setting` names where it came from."""
    if "\x00" in text:
        raise UserError(f"{setting} holds a NUL character ({text[:60]!r}), which no path can hold: give a real path")
    try:  # bytes that are not UTF-8 arrive from the command line as lone surrogates (surrogateescape)
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{setting} {ascii(text)[:80]} is not valid UTF-8: configs, checkpoints and logs record "
                        f"their paths as UTF-8 text, so rename the file or folder to a UTF-8 name") from None
    return os.path.expanduser(text)


def path_argument(setting: str) -> Callable[[str], Path]:
    """An argparse `type=` for a path flag: expand_path's Path, its refusal as argparse's one-line error."""
    return lambda text: Path(path_text_argument(setting)(text))


def path_text_argument(setting: str) -> Callable[[str], str]:
    """path_argument's text, for a flag that takes a path or a name (sample.py --ckpt: a folder or a hub id)."""
    def parse(text: str) -> str:
        try:
            return expand_path(text, setting)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _marks(folder: Path, model_files: bool = True) -> str | None:
    """Why `folder` is a run or model folder, or None; model_files=False: a run's marks only."""
    if (folder / RUN_LOCK).exists():
        return f"it holds {RUN_LOCK}, a training run's lock"
    if (folder / RUN_CONFIG).is_file() and any((folder / name / MODEL_FILES[0]).is_file() for name in CHECKPOINT_NAMES):
        return f"it holds a run's {RUN_CONFIG} beside its checkpoints"
    return next((f"it holds {name}" for name in MODEL_FILES if model_files and (folder / name).exists()), None)


def enclosing_run(path: str | Path, own_mark: str | None = None) -> tuple[Path, str] | None:
    """(the run or model folder `path` lies in, why it is one) or None (module doc); own_mark: check_outside_runs."""
    resolved = Path(path).expanduser().resolve()
    ours = own_mark is not None and is_own_folder(resolved, own_mark)
    for folder in (resolved, *resolved.parents):
        try:
            reason = _marks(folder, model_files=not (ours and folder == resolved))
        except OSError:  # a folder we may not look into: it marks nothing we can see
            continue
        if reason is not None:
            return folder, reason
    return None


def is_own_folder(folder: Path, own_mark: str) -> bool:
    """`folder` holds the file `own_mark` and no subfolder: a flat model folder a command wrote itself (a run
    or anything else it could hold would be a subfolder)."""
    try:
        return (folder / own_mark).is_file() and not any(child.is_dir() for child in folder.iterdir())
    except OSError:
        return False


def check_outside_runs(path: str | Path, what: str, fix: str, own_mark: str | None = None) -> None:
    """Refuse (UserError) a `path` to write to that lies in a run or model folder. `what` names the setting
    ("--dump-dir"), `fix` says what to give instead; own_mark: module doc."""
    found = enclosing_run(path, own_mark)
    if found is None:
        return
    folder, reason = found
    where = ("is a run or model folder" if folder == Path(path).expanduser().resolve()
             else f"lies inside the run or model folder '{folder}'")
    raise UserError(f"{what} '{path}' {where} ({reason}), and a reader never writes into one: {fix}")

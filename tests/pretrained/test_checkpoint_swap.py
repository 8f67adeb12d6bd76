"""load_checkpoint while a run saves into the same out_dir, with each moment of a save's swap placed exactly
(in-process, no training: the folders are written with save_model). A save renames `name` to `.name.old`,
`.name.tmp` to `name`, then removes `.name.old` file by file; a reader caught in any of these looks again and
reads what is in place, while a damaged checkpoint that stays put is refused at once. tests/training/test_run_dir.py
runs a real reader in a loop against a real run."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import pretrained.checkpoint as checkpoint
from model import GPT, ModelConfig
from pretrained.checkpoint import (BEST, CONFIG_FILE, SWAP_RETRIES, WEIGHTS_FILE, CheckpointError, load_checkpoint,
                              read_config, save_model)

CONFIG = ModelConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8)


def saved_run(out: Path, *steps: int) -> Path:
    """out_dir with best/ saved at each of `steps` in turn, as a run saves: written to .best.tmp, then
    swapped in (best -> .best.old, .best.tmp -> best, .best.old removed). Weights differ by step."""
    for step in steps:
        torch.manual_seed(step)
        save_model(GPT(CONFIG), out / f".{BEST}.tmp", extra={"step": step})
        if (out / BEST).exists():
            os.replace(out / BEST, out / f".{BEST}.old")
        os.replace(out / f".{BEST}.tmp", out / BEST)
        shutil.rmtree(out / f".{BEST}.old", ignore_errors=True)
    return out


def test_a_reader_that_finds_best_just_as_a_save_renames_it_away_reads_the_old_one(tmp_path, monkeypatch):
    """best/ is found, then renamed to .best.old by a save before the reader looks at it, so it is gone both
    before and after the failed read. That is a swap in progress, not a damaged checkpoint: the reader looks
    again and reads .best.old. A folder that stays put without a config.json is still refused at once."""
    out = saved_run(tmp_path / "run", 2)
    real_find, calls = checkpoint.find_checkpoint, []

    def find_then_save_renames(path):
        folder = real_find(path)
        calls.append(folder.name)
        if len(calls) == 1:  # the save's first rename lands right after the reader found best/
            os.replace(out / BEST, out / f".{BEST}.old")
        return folder

    monkeypatch.setattr(checkpoint, "find_checkpoint", find_then_save_renames)
    folder, _, payload = load_checkpoint(out)
    assert calls == [BEST, f".{BEST}.old"] and folder == out / f".{BEST}.old"
    assert payload["step"] == read_config(out / f".{BEST}.old")["step"] == 2
    for name in ("damaged", "damaged.old", ".damaged"):  # a look-alike of `.name.old` is no swap either
        damaged = tmp_path / name
        damaged.mkdir()
        (damaged / WEIGHTS_FILE).write_bytes(b"")
        calls.clear()
        monkeypatch.setattr(checkpoint, "find_checkpoint", lambda path: calls.append(path) or Path(path))
        with pytest.raises(CheckpointError, match="no config.json"):
            load_checkpoint(damaged)
        assert len(calls) == 1, name  # refused at once, not after the retries


def test_a_reader_of_an_old_folder_that_a_save_is_removing_reads_the_new_one(tmp_path, monkeypatch):
    """The reader found .best.old (between the renames); the save then put the new best/ in place and began
    removing .best.old, weights first. Its config.json still stands, so the folder looks unchanged, yet it is
    on its way out: the reader looks again and reads the new best/."""
    out = saved_run(tmp_path / "run", 2)
    os.replace(out / BEST, out / f".{BEST}.old")
    real_load, loads = checkpoint.load_model, []

    def load_as_the_save_finishes(folder, device="cpu"):
        loads.append(Path(folder).name)
        if len(loads) == 1:  # the save's second rename, then the old one's weights removed
            torch.manual_seed(3)
            save_model(GPT(CONFIG), out / f".{BEST}.tmp", extra={"step": 3})
            os.replace(out / f".{BEST}.tmp", out / BEST)
            (out / f".{BEST}.old" / WEIGHTS_FILE).unlink()
        return real_load(folder, device)

    monkeypatch.setattr(checkpoint, "load_model", load_as_the_save_finishes)
    folder, _, payload = load_checkpoint(out)
    assert loads == [f".{BEST}.old", BEST] and folder == out / BEST and payload["step"] == 3


def test_a_checkpoint_that_keeps_changing_is_read_a_bounded_number_of_times(tmp_path, monkeypatch):
    """Every read is overtaken by a new save (config.json replaced: another inode). The reader tries
    SWAP_RETRIES + 1 times, then says so in one line; one save fewer and it reads the last one."""
    out = saved_run(tmp_path / "run", 1)
    real_load, loads = checkpoint.load_model, []

    def load_then_a_save_lands(folder, device="cpu", saves=SWAP_RETRIES + 1):
        result = real_load(folder, device)
        loads.append(result[1]["step"])
        if len(loads) <= saves:
            saved_run(out, len(loads) + 1)
        return result

    monkeypatch.setattr(checkpoint, "load_model", load_then_a_save_lands)
    with pytest.raises(CheckpointError, match="kept changing while it was read"):
        load_checkpoint(out)
    assert loads == list(range(1, SWAP_RETRIES + 2))

    out, loads[:] = saved_run(tmp_path / "run2", 1), []
    monkeypatch.setattr(checkpoint, "load_model",
                        lambda folder, device="cpu": load_then_a_save_lands(folder, device, saves=SWAP_RETRIES))
    folder, _, payload = load_checkpoint(out)
    assert payload["step"] == SWAP_RETRIES + 1 and loads == list(range(1, SWAP_RETRIES + 2))
    assert (folder / CONFIG_FILE).is_file()

"""The run directory's lock and the recovery only its holder does, in process (tests/training/test_run_dir.py drives
the same through the command lines): the lock is held for the whole run and released after; a stale lock file
blocks nobody; recovering a checkpoint swap needs the lock; the next run finishes a swap a crash interrupted;
a reader that races a swap looks for the checkpoint again instead of falling through to another one."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from pretrained.checkpoint import find_checkpoint, read_config
from tests.helpers import fresh_copy, prepared_shakespeare_dir, tiny_config
from training.checkpoint import BEST, LATEST, checkpoint_dir, load_train_state
from training.run_dir import LOCK_FILE, lock_run_dir
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path):
    out = tmp_path / "run"
    seen = []

    def try_second_writer(step: int) -> bool:
        with pytest.raises(UserError, match=f"is in use by another training run \\(pid {os.getpid()} "):
            lock_run_dir(out)
        seen.append(step)
        return False

    train(tiny_config(out, "train.max_iters=3", "eval.interval=3", "attn.enabled=false"), should_stop=try_second_writer)
    assert seen == [1, 2, 3]
    with lock_run_dir(out) as lock:  # released when train() returned: the next writer gets it at once
        assert lock.held
    (out / LOCK_FILE).write_text("pid 999999999 on elsewhere, started long ago\n")  # a stale file, not a lock
    assert train(tiny_config(out, "train.max_iters=4", "eval.interval=4", "attn.enabled=false")).step == 4

def test_recovering_a_save_needs_the_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = lock_run_dir(out)
    lock.release()
    with pytest.raises(RuntimeError, match="needs the run directory's lock"):
        checkpoint_dir(lock, LATEST)

def test_the_next_run_recovers_a_swap_that_died_between_its_renames(tmp_path, trained):
    """latest/ and best/ moved aside (.name.old), their replacements never renamed in: the next run puts both
    back, resumes from the checkpoint in .latest.old, and removes the half-written .latest.tmp."""
    out, _ = fresh_copy(trained, tmp_path)
    for name in (LATEST, BEST):
        os.replace(out / name, out / f".{name}.old")
    (out / f".{LATEST}.tmp").mkdir()
    (out / f".{LATEST}.tmp" / "partial").write_text("half a save")
    result = train(tiny_config(out, "train.max_iters=4", "eval.interval=100", "attn.enabled=false"),
                   should_stop=lambda steps: steps == 3)  # stop (and save) before any eval could replace best/
    assert sorted(result.losses) == [2]  # resumed at step 2, not restarted from 0
    assert load_train_state(out / LATEST)["step"] == 3
    assert read_config(out / BEST)["step"] == 2  # the recovered best/
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE) == []

def test_a_swap_that_finished_its_renames_keeps_the_new_checkpoint(tmp_path, trained):
    """Both renames done, .name.old not yet removed: `name` is the newer one; the next run keeps it."""
    out, _ = fresh_copy(trained, tmp_path)
    shutil.copytree(out / LATEST, out / f".{LATEST}.old")
    state = load_train_state(out / f".{LATEST}.old")
    torch.save({**state, "step": 1}, out / f".{LATEST}.old" / "train_state.pt")  # the older one
    result = train(tiny_config(out, "train.max_iters=3", "eval.interval=100", "attn.enabled=false"))
    assert sorted(result.losses) == [2]
    assert not (out / f".{LATEST}.old").exists()

def test_find_checkpoint_looks_for_the_folder_again_after_its_old_copy(tmp_path, monkeypatch):
    """A save can finish between a reader's look for best/ and its look for .best.old (which the save then
    removed): the reader looks for best/ once more instead of falling through to latest/."""
    run = tmp_path / "run"
    for name in (BEST, LATEST):
        (run / name).mkdir(parents=True)
        (run / name / "config.json").write_text("{}")
    looks = []
    real_is_file = Path.is_file

    def racing_is_file(path: Path) -> bool:
        looks.append(path.parent.name)
        if path.parent.name == BEST and looks.count(BEST) == 1:
            return False  # best/ mid-swap at the first look
        return real_is_file(path)

    monkeypatch.setattr(Path, "is_file", racing_is_file)
    assert find_checkpoint(run) == run / BEST
    assert looks[:4] == ["run", BEST, f".{BEST}.old", BEST]


def test_the_lock_file_names_its_holder_and_an_unusable_one_is_one_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("pid 999999999 on elsewhere, started long ago, a much longer stale line\n")
    with lock_run_dir(out):
        lines = (out / LOCK_FILE).read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pid {os.getpid()} on ")  # the stale text is gone
    blocked = tmp_path / "blocked"
    (blocked / LOCK_FILE).mkdir(parents=True)  # a folder where the lock file belongs
    with pytest.raises(UserError, match=r"cannot write to out_dir '.*blocked' \(Is a directory\): choose a writable"):
        lock_run_dir(blocked)

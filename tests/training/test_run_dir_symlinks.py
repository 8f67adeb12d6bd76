"""Symbolic links in a run (training/checkpoint.py: checkpoint_dir): an out_dir that is a link trains and resumes
as a folder would, with every file in the folder it points to; so does out_dir/attn as a link (the heatmaps go
where it points). latest/ or best/ as a link is refused before any step (the bad-input matrix runs that through
train.py: train-latest-symlink, train-best-symlink), and refusing it changes nothing."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.errors import UserError
from tests.helpers import fresh_copy, tiny_config
from training.checkpoint import load_train_state
from training.trainer import train

pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from tests.helpers import prepared_shakespeare_dir
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def test_an_out_dir_that_is_a_link_trains_and_resumes_into_the_folder_it_points_to(tmp_path, trained):
    real, _ = fresh_copy(trained, tmp_path)
    link = tmp_path / "link"
    os.symlink(real, link, target_is_directory=True)
    result = train(tiny_config(link, "train.max_iters=4", "eval.interval=2", "eval.iters=1", "attn.enabled=false"))
    assert result.step == 4 and load_train_state(real / "latest")["step"] == 4
    assert link.is_symlink() and not (real / "latest").is_symlink()
    assert not list(real.glob(".*.tmp")) and not list(real.glob(".*.old"))


def test_an_attn_folder_that_is_a_link_receives_the_heatmaps(tmp_path, trained):
    run, _ = fresh_copy(trained, tmp_path)
    elsewhere = tmp_path / "heatmaps"
    elsewhere.mkdir()
    os.symlink(elsewhere, run / "attn", target_is_directory=True)
    train(tiny_config(run, "train.max_iters=4", "eval.interval=2", "eval.iters=1", "attn.enabled=true"))
    assert (run / "attn").is_symlink()
    assert (elsewhere / "stats.csv").is_file() and (elsewhere / "layer_0" / "step_000004.png").is_file()


@pytest.mark.parametrize("name", ["latest", "best", ".latest.tmp"])
def test_a_checkpoint_folder_that_is_a_link_is_refused_before_any_step(tmp_path, trained, name):
    run, _ = fresh_copy(trained, tmp_path)
    target = tmp_path / "elsewhere"
    if name.startswith("."):
        target.mkdir()  # a leftover temporary folder: a save would write through it, into `elsewhere`
    else:
        (run / name).rename(target)
    os.symlink(target, run / name, target_is_directory=True)
    def files() -> list:  # the lock's holder line is rewritten by every run that takes it
        return sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*")
                      if p.is_file() and p.name != ".train.lock")
    before = files()
    with pytest.raises(UserError, match=f"'{run / name}' is a symbolic link") as e:
        train(tiny_config(run, "train.max_iters=4", "eval.interval=2", "eval.iters=1", "attn.enabled=false"))
    assert "\n" not in str(e.value) and "replace the link by a copy of the folder it points to" in str(e.value)
    assert files() == before and (run / name).is_symlink()

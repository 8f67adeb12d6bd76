"""A run's own files describe it: `train.py RUN/config.yaml out_dir=RUN` resumes the run, from scratch (the
vocabulary the tokenizer gave) and from train.init_from (the source's shape), and the config it saved names
exactly the model its checkpoint holds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.checkpoint import LATEST
from training.config import load_run_config
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled", "eval.interval=2"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def _resume_from_own_config(run: Path, max_iters: int) -> int:
    cfg = load_run_config(run / "config.yaml", [f"out_dir={run}", f"train.max_iters={max_iters}"])
    return train(cfg).step


@pytest.mark.parametrize("shape", [[], ["model.d_model=48", "model.n_head=3", "model.n_kv_head=1"]])
def test_scratch_run_resumes_from_its_saved_config(tmp_path, shape):
    run = tmp_path / "run"
    first = train(tiny_config(run, "train.max_iters=2", *QUIET, *shape))
    saved = load_run_config(run / "config.yaml")
    checkpoint_model = json.loads((run / LATEST / "config.json").read_text())["model"]
    assert saved.model.to_dict() == checkpoint_model == first.model.config.to_dict()
    assert saved.model.vocab_size == 65  # tinyshakespeare's characters, not the default 50304
    assert _resume_from_own_config(run, 4) == 4


def test_init_from_run_resumes_from_its_saved_config(tmp_path):
    source = tmp_path / "source"
    train(tiny_config(source, "train.max_iters=2", *QUIET))
    run = tmp_path / "run"
    first = train(tiny_config(run, "train.max_iters=2", f"train.init_from={source}", "model.dropout=0.1", *QUIET))
    saved_model = yaml.safe_load((run / "config.yaml").read_text())["model"]  # the source's shape, written out
    assert saved_model == first.model.config.to_dict()
    assert saved_model["dropout"] == 0.1
    assert _resume_from_own_config(run, 4) == 4

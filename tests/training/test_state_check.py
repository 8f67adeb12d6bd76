"""training/state_check.py: is a loaded train_state.pt fit for this run? States saved by real 2-step AdamW and Muon
runs pass; each part damaged on its own (the counters, every optimizer's groups and moments, the RNG states, the
loader's position) is refused naming the part, before any of it is used."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from model import GPT
from pretrained.checkpoint import CheckpointError
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.checkpoint import LATEST, load_train_state
from training.optim import build_optimizers
from training.state_check import check_train_state
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data_dir):
    """States saved by a 2-step AdamW run and a 2-step Muon run, with a fresh model and optimizers to check
    them against."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        for name in ("adamw", "muon"):
            run = tmp_path_factory.mktemp(name)
            cfg = tiny_config(run, f"train.optimizer={name}", "train.max_iters=2", "eval.interval=2", *QUIET)
            result = train(cfg)
            model = GPT(result.model.config)
            out[name] = (load_train_state(run / LATEST), model, build_optimizers(model, cfg.train))
    return out


def check(state, model, optimizers, max_iters: int = 10) -> None:
    check_train_state(state, Path("latest/train_state.pt"), model, optimizers, max_iters)


def test_intact_states_pass(saved):
    for state, model, optimizers in saved.values():
        check(state, model, optimizers)
        check(state, model, optimizers, max_iters=2)  # a finished run: step == max_iters


def damaged(state: dict, edit) -> dict:
    state = copy.deepcopy(state)
    edit(state)
    return state


ADAMW_DAMAGE = [
    ("step -1", lambda s: s.__setitem__("step", -1), "step -1 is not a step count"),
    ("step 11", lambda s: s.__setitem__("step", 11), "at step 11, beyond train.max_iters=10"),
    ("step True", lambda s: s.__setitem__("step", True), "step True is not a step count"),
    ("best_val nan", lambda s: s.__setitem__("best_val", float("nan")), "best_val nan is not a loss"),
    ("best_val -inf", lambda s: s.__setitem__("best_val", float("-inf")), "best_val -inf is not a loss"),
    ("skipped > step", lambda s: s.__setitem__("skipped_steps", 3), "skipped_steps 3 is not a count in [0, step=2]"),
    ("two optimizers", lambda s: s["optimizer"].append(s["optimizer"][0]), "holds the state of 2 optimizer(s)"),
    ("moment shape", lambda s: s["optimizer"][0]["state"][0].__setitem__("exp_avg", torch.zeros(3)),
     "tok_emb.weight: exp_avg has shape (3,) float32, the parameter (65, 32) float32"),
    ("moment dtype", lambda s: s["optimizer"][0]["state"][1].__setitem__(
        "exp_avg_sq", s["optimizer"][0]["state"][1]["exp_avg_sq"].double()), "exp_avg_sq has shape"),
    ("moment nan", lambda s: s["optimizer"][0]["state"][2]["exp_avg"].view(-1).__setitem__(0, float("nan")),
     "exp_avg holds NaN or inf values"),
    ("negative second moment", lambda s: s["optimizer"][0]["state"][2]["exp_avg_sq"].view(-1).__setitem__(0, -1.0),
     "exp_avg_sq holds negative values"),
    ("missing moment", lambda s: s["optimizer"][0]["state"][0].pop("exp_avg"),
     "its state holds ['exp_avg_sq', 'step'], expected ['exp_avg', 'exp_avg_sq', 'step']"),
    ("adam step negative", lambda s: s["optimizer"][0]["state"][0].__setitem__("step", torch.tensor(-2.0)),
     "step -2.0 is not a step count"),
    ("unknown parameter", lambda s: s["optimizer"][0]["state"].__setitem__(999, {}),
     "keeps state for parameter 999, which this model lacks"),
    ("state not a mapping", lambda s: s["optimizer"][0].__setitem__("state", list(s["optimizer"][0]["state"].values())),
     "optimizer 0 (AdamW) is not an optimizer state"),
    ("groups not a list", lambda s: s["optimizer"][0].__setitem__("param_groups", {}),
     "optimizer 0 (AdamW) is not an optimizer state"),
    ("other groups", lambda s: s["optimizer"][0]["param_groups"][0]["params"].pop(),
     "its parameter groups do not match this model's"),
    ("python rng", lambda s: s["rng"]["python"][1].pop(), "its RNG states are damaged"),
    ("numpy rng", lambda s: s["rng"]["numpy"].__setitem__(1, torch.zeros(5, dtype=torch.int64)),
     "its RNG states are damaged (ValueError: the numpy key is not 624 32-bit integers)"),
    ("numpy key 2**32", lambda s: s["rng"]["numpy"][1].__setitem__(0, 2**32),  # would wrap to 0 in uint32
     "its RNG states are damaged (ValueError: the numpy key is not 624 32-bit integers)"),
    ("numpy position", lambda s: s["rng"]["numpy"].__setitem__(2, 10**6), "the numpy position 1000000"),
    ("torch rng", lambda s: s["rng"].__setitem__("torch", torch.zeros(7, dtype=torch.uint8)),
     "its RNG states are damaged"),
    ("cuda rng", lambda s: s["rng"].__setitem__("cuda", [torch.zeros(3)]), "a CUDA state is not a byte tensor"),
    ("loader", lambda s: s["loader"].__setitem__("batches_drawn", -4), "the loader's batches_drawn -4"),
]


@pytest.mark.parametrize("what, edit, fragment", ADAMW_DAMAGE, ids=[d[0] for d in ADAMW_DAMAGE])
def test_each_damaged_part_is_refused_naming_it(saved, what, edit, fragment):
    state, model, optimizers = saved["adamw"]
    with pytest.raises(CheckpointError) as e:
        check(damaged(state, edit), model, optimizers)
    assert str(e.value).startswith("'latest/train_state.pt' does not fit this run: ") and fragment in str(e.value)


def test_muon_momentum_of_another_shape_is_refused(saved):
    state, model, optimizers = saved["muon"]
    edit = lambda s: s["optimizer"][0]["state"][0].__setitem__("momentum_buffer", torch.zeros(2, 2))  # noqa: E731
    with pytest.raises(CheckpointError, match=r"optimizer 0 \(Muon\), blocks\.0\.attn\.qkv_proj\.weight: "
                                              r"momentum_buffer has shape \(2, 2\)"):
        check(damaged(state, edit), model, optimizers)

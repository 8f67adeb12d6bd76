"""train.nonfinite=skip never claims a checkpoint it did not write (training/trainer.py: train_loop): skipped
last steps still reach the final eval and save, of the weights the last applied step left; an eval that
overflows stops the run in one UserError naming the layer (model/gpt.py: GPT._check_finite)."""
from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from model.gpt import GPT
from pretrained.checkpoint import load_model
from tests.helpers import shakespeare_data_dir, tiny_config
from training.checkpoint import LATEST, load_train_state
from training.trainer import train

QUIET = ("attn.enabled=false", "wandb.mode=disabled")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return shakespeare_data_dir(tmp_path_factory.mktemp("data"))


def poison_steps(monkeypatch, steps: set[int], grad_accum: int = 1) -> None:
    """The training loss of these steps (0-based) is NaN; evals are untouched."""
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, input_pos=None, last_only=False):
        logits, loss = real_forward(self, idx, targets, input_pos, last_only)
        if self.training and loss is not None:
            if calls["n"] // grad_accum in steps:
                loss = loss * float("nan")
            calls["n"] += 1
        return logits, loss
    monkeypatch.setattr(GPT, "forward", poisoned)


@pytest.mark.parametrize("skipped", [{4, 5}, {5}, {0, 1, 2, 3, 4, 5}])
def test_skipped_last_steps_save_the_last_finite_state_at_the_last_step(tmp_path, data_dir, monkeypatch, skipped):
    """The last step (or all of them) skipped: latest/ is written at train.max_iters, and its weights are those
    the last applied step left, equal to the same run stopped before the skipped steps."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    poison_steps(monkeypatch, skipped)
    result = train(tiny_config(tmp_path / "skip", "train.max_iters=6", "eval.interval=100", "train.nonfinite=skip",
                               *QUIET))
    assert result.step == 6 and result.skipped_steps == len(skipped)
    state = load_train_state(tmp_path / "skip" / LATEST)
    assert state["step"] == 6 and state["skipped_steps"] == len(skipped)
    saved, _ = load_model(tmp_path / "skip" / LATEST)
    applied = min(skipped)  # the steps before the skipped ones: an independent run of exactly those
    monkeypatch.undo()
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    if applied:
        reference = train(tiny_config(tmp_path / "ref", f"train.max_iters={applied}", "eval.interval=100", *QUIET)).model
    else:
        torch.manual_seed(tiny_config(tmp_path).seed)
        reference = GPT(saved.config)
    for (name, a), b in zip(saved.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def test_an_eval_that_overflows_stops_the_run_naming_the_layer_and_keeps_the_checkpoint(tmp_path, data_dir,
                                                                                        monkeypatch):
    """Weights grown past float32's range in layer 1's MLP after the checkpoint at step 2: the eval at step 4
    overflows (in eval mode; the training steps were skipped) and the run stops in one line; latest/ stays."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    out = tmp_path / "run"
    train(tiny_config(out, "train.max_iters=2", "eval.interval=2", *QUIET))
    real_load = GPT.load_state_dict

    def grown(self, state, *args, **kwargs):
        loaded = real_load(self, state, *args, **kwargs)
        with torch.no_grad():
            for p in self.blocks[1].mlp.parameters():
                p.mul_(1e22)
        return loaded
    monkeypatch.setattr(GPT, "load_state_dict", grown)
    with pytest.raises(UserError, match="first appear in layer 1's output, computing in float32") as e:
        train(tiny_config(out, "train.max_iters=4", "eval.interval=2", "train.nonfinite=skip", *QUIET))
    assert "\n" not in str(e.value)
    assert load_train_state(out / LATEST)["step"] == 2

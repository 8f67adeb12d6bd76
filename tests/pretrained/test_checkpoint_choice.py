"""Which checkpoint each reader picks from a run's out_dir that holds both: sampling, conversion and
train.init_from read best/ (the lowest val loss), falling back to latest/ only when there is no best/ (nor a
best/ in the middle of its swap); a resume reads latest/; a checkpoint folder named directly is read as it is.
The two checkpoints differ in their weights (and the step they record), so every pick shows in what is read.
train.init_from's pick (and a resume's): tests/training/test_init_from.py.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

import sample
from data.tokenizer import CharTokenizer
from model import GPT
from pretrained.checkpoint import BEST, LATEST, find_checkpoint, load_checkpoint, save_model
from pretrained.load import open_pretrained
from tests.helpers import TINY
from training.config import load_run_config

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tinyshakespeare's 65


def model_of(seed: int) -> GPT:
    """configs/tiny.yaml's model (so train.init_from accepts it) with weights of its own."""
    torch.manual_seed(seed)
    model = GPT(dataclasses.replace(load_run_config(TINY).model, vocab_size=len(CHARS)))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)  # varied text (sampling tells the two apart)
    return model.eval()


@pytest.fixture
def run(tmp_path) -> Path:
    """out_dir with best/ (saved at step 2) and latest/ (step 5, other weights)."""
    out = tmp_path / "run"
    extra = {"tokenizer": CharTokenizer(CHARS).to_json()}
    save_model(model_of(2), out / BEST, extra={**extra, "step": 2})
    save_model(model_of(5), out / LATEST, extra={**extra, "step": 5})
    return out


def weights(model: GPT) -> torch.Tensor:
    return model.tok_emb.weight.detach().float()


def test_an_out_dir_is_read_through_its_best_and_a_folder_as_it_is(run):
    assert find_checkpoint(run) == run / BEST
    assert find_checkpoint(run / LATEST) == run / LATEST and find_checkpoint(run / BEST) == run / BEST
    folder, model, payload = load_checkpoint(run)
    assert folder == run / BEST and payload["step"] == 2
    assert torch.equal(weights(model), weights(model_of(2)))
    assert load_checkpoint(run / LATEST)[2]["step"] == 5


def test_latest_is_read_only_when_there_is_no_best(run):
    os.replace(run / BEST, run / f".{BEST}.old")  # best/ in the middle of its swap: still the best checkpoint
    assert find_checkpoint(run) == run / f".{BEST}.old"
    assert load_checkpoint(run)[2]["step"] == 2
    os.replace(run / f".{BEST}.old", run / "elsewhere")
    assert find_checkpoint(run) == run / LATEST
    assert load_checkpoint(run)[2]["step"] == 5


def test_sampling_and_conversion_read_best(run, capsys):
    source = open_pretrained(run)
    assert source.folder == run / BEST
    assert torch.equal(weights(source.build()), weights(model_of(2)))

    def text(ckpt: Path) -> str:
        assert sample.main(["--ckpt", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--seed", "3"]) == 0
        return capsys.readouterr().out

    from_run, from_best, from_latest = text(run), text(run / BEST), text(run / LATEST)
    assert from_run == from_best != from_latest

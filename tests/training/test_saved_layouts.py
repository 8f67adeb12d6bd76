"""Both sides of each guard that reads what an older version saved: a file written before a field existed
loads with the documented default, one with the field loads its value. autotune.json (a comparison's
`unsettled` spreads, the `attention` comparison, a comparison's `unit`) and train_state.pt (`skipped_steps`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import fresh_copy, prepared_shakespeare_dir, tiny_config
from training.autotune import CHOICE_FILE, FLOAT32_ATTENTION, Choice, Comparison, saved_choice
from training.checkpoint import load_train_state
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")

DTYPE_TIMINGS = {"float32": 2.0, "bfloat16": 1.5}


def write_choice(out: Path, payload: dict) -> Choice | None:
    out.mkdir(parents=True, exist_ok=True)
    (out / CHOICE_FILE).write_text(json.dumps(payload))
    return saved_choice(out)


def test_an_autotune_choice_without_the_newer_fields_reads_with_their_defaults(tmp_path):
    older = {"dtype": "bfloat16", "compile": False,
             "comparisons": [{"ms_per_step": DTYPE_TIMINGS, "baseline": "float32", "kept": "bfloat16"}]}
    choice = write_choice(tmp_path / "older", older)
    assert choice == Choice(dtype="bfloat16", compile=False, comparisons=[
        Comparison(DTYPE_TIMINGS, baseline="float32", kept="bfloat16", unit="ms/step", unsettled={})],
        compile_seconds=None, note="", attention=None)
    assert choice.attention_kernel == "fused"


def test_an_autotune_choice_with_the_newer_fields_reads_them(tmp_path):
    attention = {"ms_per_step": {"bfloat16 attention": 0.5, FLOAT32_ATTENTION: 0.4}, "baseline": "bfloat16 attention",
                 "kept": FLOAT32_ATTENTION, "unit": "ms/call", "unsettled": {}}
    newer = {"dtype": "float32", "compile": True, "compile_seconds": 12.5, "note": "n", "attention": attention,
             "comparisons": [{"ms_per_step": DTYPE_TIMINGS, "baseline": "float32", "kept": "float32",
                              "unit": "ms/step", "unsettled": {"bfloat16": 1.7}}]}
    choice = write_choice(tmp_path / "newer", newer)
    assert choice.comparisons[0].unsettled == {"bfloat16": 1.7} and choice.compile_seconds == 12.5
    assert choice.attention == Comparison({"bfloat16 attention": 0.5, FLOAT32_ATTENTION: 0.4}, "bfloat16 attention",
                                          FLOAT32_ATTENTION, "ms/call", {})
    assert choice.attention_kernel == "fused float32" and choice.to_json() == newer  # and saved back as read


@pytest.mark.parametrize("saved", [None, 1])
def test_a_training_state_without_skipped_steps_resumes_at_zero_and_one_with_it_keeps_it(trained, tmp_path, saved):
    out, _ = fresh_copy(trained, tmp_path)
    path = out / "latest" / "train_state.pt"
    state = torch.load(path, weights_only=True)
    assert state["skipped_steps"] == 0 and state["step"] == 2
    if saved is None:
        del state["skipped_steps"]  # what a run saved before the field existed
    else:
        state["skipped_steps"] = saved
    torch.save(state, path)
    result = train(tiny_config(out, "train.max_iters=3", "eval.interval=3", "attn.enabled=false"))
    want = 0 if saved is None else saved
    assert result.step == 3 and result.skipped_steps == want
    assert load_train_state(out / "latest")["skipped_steps"] == want

"""training/resume.py: a resume checks what it resumes -- the model, the data and the tokenizer against the
checkpoint's, and a train_state.pt that does not fit refused before anything changes -- before anything is used.
The command-line cases are in the bad-input matrix (tests/bad_input_trust.py); here each check is tried on its own,
in process. Each part of train_state.pt checked against the model and the run's settings (training/state_check.py):
test_state_check.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from model import GPT
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.checkpoint import LATEST, load_train_state
from training.optim import build_optimizers
from training.resume import data_fingerprint
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def test_a_rejected_state_leaves_the_checkpoint_untouched(tmp_path, trained):
    from common.errors import UserError
    from tests.helpers import fresh_copy
    out, _ = fresh_copy(trained, tmp_path)
    state = load_train_state(out / LATEST)
    torch.save({**state, "step": -5}, out / LATEST / "train_state.pt")
    before = {p.name: p.read_bytes() for p in (out / LATEST).iterdir()}
    with pytest.raises(UserError, match="cannot resume from .* step -5 is not a step count"):
        train(tiny_config(out, "train.max_iters=4", *QUIET))
    assert {p.name: p.read_bytes() for p in (out / LATEST).iterdir()} == before


def test_the_data_fingerprint_follows_the_tokens_not_the_folder(tmp_path):
    from data.prepare import load_prepared, prepare_data
    prepared = prepare_data(tiny_config(tmp_path).data)
    moved = tmp_path / "moved"
    shutil.copytree(prepared.dir, moved)
    assert data_fingerprint(load_prepared(moved)) == data_fingerprint(prepared)  # same tokens elsewhere
    val_shard = moved / prepared.split_paths("val")[0].name
    tokens = bytearray(val_shard.read_bytes())
    tokens[10] = (tokens[10] + 1) % 65  # one token of the val split differs
    val_shard.write_bytes(bytes(tokens))
    assert data_fingerprint(load_prepared(moved))["fingerprint"] != data_fingerprint(prepared)["fingerprint"]
    assert data_fingerprint(prepared)["train_tokens"] == prepared.train_tokens


def test_a_checkpoint_of_another_model_or_other_data_is_refused_in_one_line(tmp_path, trained):
    from common.errors import UserError
    from tests.helpers import fresh_copy
    out, _ = fresh_copy(trained, tmp_path)
    cases = [(["model.n_layer=3", "model.d_model=48"], ["a different model (n_layer 2 vs 3; d_model 32 vs 48)",
                                                       f"use another out_dir, or delete '{out}' to start over"]),
             (["data.val_fraction=0.2"], ["trained on other data (tinyshakespeare", "1003854 train / 111540 val tokens",
                                         "than this run's (tinyshakespeare", "train.init_from=" + str(out)])]
    (tmp_path / "other.txt").write_text("abc de\n" * 300)
    cases.append((["data.source=text", f"data.path={tmp_path / 'other.txt'}"],
                  ["trained with another tokenizer (char, 65 characters) than this run's data has (char, 7 characters)",
                   "resume with the data it was trained on, or start a new run from these weights"]))
    before = {p.name: p.read_bytes() for p in (out / LATEST).iterdir()}
    for overrides, fragments in cases:
        with pytest.raises(UserError) as e:
            train(tiny_config(out, "train.max_iters=4", *overrides, *QUIET))
        for fragment in fragments:
            assert fragment in str(e.value), (fragment, str(e.value))
    assert {p.name: p.read_bytes() for p in (out / LATEST).iterdir()} == before


@pytest.mark.parametrize("key, value", [("n_layer", 10**7), ("d_model", 10**9), ("vocab_size", 10**12)])
def test_a_checkpoint_whose_config_claims_a_model_beyond_memory_is_another_model_and_nothing_is_built(
        tmp_path, trained, monkeypatch, key, value):
    """A resume reads latest/config.json without a memory check of its own: the run's plan has checked the model
    it builds, and the checkpoint's must be that one. A config claiming a huge model is refused as a different
    model, in one line, before any model is built."""
    import json
    import model.gpt as gpt
    from common.errors import UserError
    from tests.helpers import fresh_copy
    out, _ = fresh_copy(trained, tmp_path)
    config = out / LATEST / "config.json"
    payload = json.loads(config.read_text())
    payload["model"][key] = value
    config.write_text(json.dumps(payload))
    monkeypatch.setattr(gpt.GPT, "__init__", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(UserError) as e:
        train(tiny_config(out, "train.max_iters=4", *QUIET))
    assert f"holds a checkpoint of a different model ({key} {value!r} vs" in str(e.value)


def test_a_resume_continues_the_count_of_skipped_steps(tmp_path, monkeypatch):
    """train.nonfinite=skip: the steps skipped before a checkpoint still count after the resume."""
    from model.gpt import GPT as Model
    real_forward = Model.forward
    calls = {"n": 0}

    def nan_at_step_1(self, idx, targets=None, input_pos=None, last_only=False):
        logits, loss = real_forward(self, idx, targets, input_pos, last_only)
        if self.training and loss is not None:
            calls["n"] += 1
            if calls["n"] == 2:  # step 1 (0-based)
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(Model, "forward", nan_at_step_1)
    overrides = ["train.max_iters=4", "train.nonfinite=skip", "eval.interval=100", *QUIET]
    first = train(tiny_config(tmp_path, *overrides), should_stop=lambda steps: steps == 3)
    assert first.skipped_steps == 1 and load_train_state(tmp_path / LATEST)["skipped_steps"] == 1
    second = train(tiny_config(tmp_path, *overrides))
    assert second.skipped_steps == 1 and load_train_state(tmp_path / LATEST)["skipped_steps"] == 1


def test_tokenizers_are_described_by_kind_and_size():
    from training.resume import _describe_tokenizer
    assert _describe_tokenizer({"kind": "char", "chars": "abc"}) == "char, 3 characters"
    assert _describe_tokenizer({"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257}) == \
        "tiktoken gpt2, 50257 tokens"
    assert _describe_tokenizer(None) == "none recorded"
    # a Hugging Face tokenizer records no encoding: the description has none, and no placeholder for it
    hf = _describe_tokenizer({"kind": "hf", "name": "tok", "vocab_size": 300})
    assert hf.startswith("hf ") and hf.endswith(", 300 tokens") and "None" not in hf


def test_a_corpus_edited_past_the_ends_the_token_fingerprint_reads_is_other_data(tmp_path, monkeypatch):
    """The token fingerprint reads the first and last MiB of each split; a 3 MB corpus edited in its middle (same
    size, same characters) keeps it, and only the corpus's content hash, recorded at prepare, tells. The resume is
    refused before latest/ changes, and goes on once the corpus is back."""
    from common.errors import UserError
    from training.resume import source_content
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    lines = [f"line {i % 997} of the corpus, word {(i * 7919) % 1009}\n" for i in range(80_000)]
    text = "".join(lines)
    assert len(text) > 3 << 20 - 1
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    out = tmp_path / "run"
    overrides = ["data.source=text", f"data.path={path}", "train.max_iters=4", "eval.interval=2", "eval.iters=1",
                 *QUIET]
    train(tiny_config(out, *overrides), should_stop=lambda steps: steps == 2)
    before = {p.name: p.read_bytes() for p in (out / LATEST).iterdir()}
    middle = len(text) // 3
    assert text[middle] != text[middle + 1]
    path.write_text(text[:middle] + text[middle + 1] + text[middle] + text[middle + 2:])  # two characters swapped
    with pytest.raises(UserError, match="trained on other data .* content [0-9a-f]{16}"):
        train(tiny_config(out, *overrides))
    assert {p.name: p.read_bytes() for p in (out / LATEST).iterdir()} == before
    path.write_text(text)
    assert train(tiny_config(out, *overrides)).step == 4
    # what the content hash is made of: the whole-file hashes in order; none for entries of another kind
    sha = "0" * 64
    assert source_content({"files": [["a", 1, sha], ["b", 2, "1" * 64]]}) != \
        source_content({"files": [["b", 2, "1" * 64], ["a", 1, sha]]})
    assert source_content({"files": [["a", 1, "0123456789abcdef"]]}) is None
    assert source_content({"files": []}) is None and source_content({}) is None


@pytest.mark.parametrize("change", [{"dropout": 0.3}, {"attn_impl": "manual"}, {"dropout": 0.1, "attn_impl": "manual"}])
def test_dropout_and_the_attention_implementation_may_change_across_a_resume_and_nothing_else(tmp_path, change):
    import dataclasses

    from common.errors import UserError
    from model.config import ModelConfig
    from training.resume import check_same_model
    ours = ModelConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, d_model=32, attn_impl="sdpa")
    saved = {"model": {**ours.to_dict(), **change}}
    check_same_model(saved, ours, tmp_path)  # the same model: these two do not shape it
    with pytest.raises(UserError, match=r"a different model \(n_layer 2 vs 3\)"):
        check_same_model(saved, dataclasses.replace(ours, n_layer=3), tmp_path)


def test_a_training_state_that_does_not_fit_the_built_run_names_the_error(tmp_path):
    """What read_resume_point's checks cannot foresee fails when the state is loaded: the refusal names the
    exception's type and its message, on one line."""
    from common.errors import UserError
    from model.config import ModelConfig
    from training.resume import ResumePoint, resume
    cfg = tiny_config(tmp_path)
    model = GPT(ModelConfig(vocab_size=65, block_size=32, n_layer=1, n_head=2, d_model=16))
    point = ResumePoint(tmp_path / LATEST, weights=model.state_dict(), state={"optimizer": build_optimizers(
        model, cfg.train).state_dict(), "loader": {}, "rng": {}})
    loader = type("Loader", (), {"rank": 0, "world_size": 1,
                                 "load_state_dict": lambda self, s: s["position"]})()
    with pytest.raises(UserError) as e:
        resume(point, tmp_path, model, build_optimizers(model, cfg.train), loader)
    assert "does not fit this run (KeyError: 'position')" in str(e.value) and "\n" not in str(e.value)


def test_a_tokenizer_of_the_same_size_is_said_to_hold_other_tokens_and_one_of_another_size_is_not(tmp_path):
    """Two char tokenizers of 3 characters each look the same in their descriptions: the refusal says they
    are the same size with other tokens. Of 3 and 4 characters, the descriptions differ and say so alone."""
    from common.errors import UserError
    from training.resume import check_same_data
    data = {"source": "text", "train_tokens": 10, "val_tokens": 2, "fingerprint": "f"}
    ours = {"tokenizer": {"kind": "char", "chars": "abc"}, "data": data}
    for chars, same_size in (("abd", True), ("abcd", False)):
        with pytest.raises(UserError) as e:
            check_same_data({"tokenizer": {"kind": "char", "chars": chars}, "data": data}, ours, tmp_path)
        assert ("(the same size, other tokens)" in str(e.value)) is same_size, str(e.value)
    check_same_data({"tokenizer": {"kind": "char", "chars": "abc"}, "data": data}, ours, tmp_path)  # the same: goes


def test_a_resume_point_holds_the_folder_it_was_read_from_and_hands_its_contents_over_once(tmp_path, trained):
    """read_resume_point on a run's own latest/: the point names that folder, its weights are the run's
    model's, and a second take is refused naming the folder."""
    from pretrained.checkpoint import read_config
    from tests.helpers import fresh_copy
    from training.resume import read_resume_point
    out, model = fresh_copy(trained, tmp_path)
    latest = out / LATEST
    saved = read_config(latest)
    cfg = tiny_config(out, "train.max_iters=2", "eval.interval=2", *QUIET)
    point = read_resume_point(latest, out, model.config, {"tokenizer": saved["tokenizer"], "data": saved["data"]},
                              cfg.train)
    assert point.latest == latest
    weights, state = point.take()
    assert state["step"] == 2
    ours = model.state_dict()
    assert weights.keys() <= ours.keys() and all(torch.equal(weights[k], ours[k]) for k in weights)
    with pytest.raises(RuntimeError, match=f"the resume point of '{latest}' was already taken"):
        point.take()


@pytest.mark.parametrize("dtype, autocast", [("float32", None), ("bfloat16", torch.bfloat16)])
def test_the_plan_of_a_run_that_continues_names_its_checkpoint_and_keeps_the_explicit_dtype(tmp_path, trained, dtype,
                                                                                            autocast):
    """resolve_run on an out_dir holding latest/: the plan resumes from that folder (what the trainer says
    and the logger records), its point is read from it, and an explicit dtype's autocast is the run's."""
    from tests.helpers import fresh_copy
    from training.plan import resolve_run
    from training.runtime import setup_runtime
    out, _ = fresh_copy(trained, tmp_path)
    cfg = tiny_config(out, "train.max_iters=4", "eval.interval=2", f"dtype={dtype}", *QUIET)
    lines = []
    plan = resolve_run(cfg, setup_runtime(cfg.device, cfg.dtype), say=lines.append)
    assert plan.latest == out / LATEST and plan.resume_point.latest == out / LATEST
    assert plan.rt.autocast_dtype == autocast and plan.choice is None
    assert lines and lines[-1].startswith("model: ")

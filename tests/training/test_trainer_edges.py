"""Edges of the command lines and the environment, each checked where it enters: a torchrun environment,
YAML with duplicate keys or of absurd size, seeds beyond what the RNGs take, prompt files that never end,
and every file a run writes failing like a checkpoint save (one line, the last good checkpoint intact).
The command-line forms of these cases are in the bad-input matrix (tests/bad_input_trust.py)."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

import sample
from common.config_io import MAX_CONFIG_BYTES, load_yaml
from common.config_io import apply_overrides
from common.errors import UserError
from tests.helpers import fresh_copy, prepared_shakespeare_dir, tiny_config
from training.checkpoint import LATEST, load_train_state
from training.runtime import DistributedEnv, distributed_env
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


TORCHRUN = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("env, expected", [
    ({}, DistributedEnv()),
    ({"WORLD_SIZE": "1"}, DistributedEnv()),
    ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}, DistributedEnv()),
    (TORCHRUN, DistributedEnv(rank=3, local_rank=1, world_size=4)),
    ({**TORCHRUN, "RANK": " 0 "}, DistributedEnv(rank=0, local_rank=1, world_size=4)),
])
def test_a_torchrun_environment_is_read(env, expected):
    assert distributed_env(env) == expected


@pytest.mark.parametrize("env, fragment", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "abc"}, "RANK='abc' is not an integer"),
    ({"RANK": "1"}, "RANK=1 is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "1", "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is set but WORLD_SIZE is 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: must be at least 1"),
    ({**TORCHRUN, "RANK": "4"}, "RANK=4 is outside 0..3 (WORLD_SIZE=4)"),
    ({**TORCHRUN, "RANK": "-1"}, "RANK=-1 is outside 0..3"),
    ({**TORCHRUN, "LOCAL_RANK": "9"}, "LOCAL_RANK=9 is outside 0..3"),
    ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, "WORLD_SIZE=4 is set but LOCAL_RANK is not"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not"),
    ({**TORCHRUN, "MASTER_ADDR": " "}, "MASTER_ADDR is not"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, "MASTER_PORT=None is not a port number"),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number (1..65535)"),
])
def test_a_broken_torchrun_environment_names_the_variable(env, fragment):
    with pytest.raises(UserError) as e:
        distributed_env(env)
    assert fragment in str(e.value) and "torchrun sets them all" in str(e.value)


# --- configs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ("train:\n  lr: 1\ntrain:\n  lr: 2\n", "'train' is given twice in one mapping (lines 1 and 3)"),
    ("train:\n  lr: 1\n  max_iters: 3\n  lr: 2\n", "'lr' is given twice in one mapping (lines 2 and 4)"),
    ("model: {n_layer: 2, n_layer: 3}\n", "'n_layer' is given twice in one mapping (lines 1 and 1)"),
])
def test_duplicate_yaml_keys_are_refused_naming_the_key_and_both_lines(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        load_yaml(path)
    assert fragment in str(e.value) and str(path) in str(e.value)


def test_merge_keys_may_still_override_and_overrides_refuse_duplicates(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &base {lr: 1, max_iters: 3}\ntrain:\n  <<: *base\n  lr: 2\n")
    assert load_yaml(path)["train"] == {"lr": 2, "max_iters": 3}
    with pytest.raises(UserError, match="override 'model': 'n_layer' is given twice"):
        apply_overrides({}, ["model={n_layer: 2, n_layer: 3}"])


def test_config_size_is_bounded_before_parsing(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10) + "seed: 3\n")  # just over the bound
    with pytest.raises(UserError, match="is larger than 1 MB"):
        load_yaml(path)
    path.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10 - 1) + "seed: 3\n")  # just under it
    assert load_yaml(path) == {"seed": 3}


@pytest.mark.parametrize("seed, ok", [(0, True), (2**63 - 1, True), (2**63, False), (-1, False), (2**70, False)])
def test_seed_is_bounded_naming_the_key(seed, ok):
    if ok:
        assert tiny_config(Path("unused"), f"seed={seed}").seed == seed
        return
    with pytest.raises(UserError, match=f"seed={seed}: must be an integer from 0 to 2\\*\\*63-1"):
        tiny_config(Path("unused"), f"seed={seed}")


def test_prompt_files_are_read_up_to_a_bound(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"a" * sample.PROMPT_FILE_LIMIT)
    assert len(sample.read_prompt_file(path)) == sample.PROMPT_FILE_LIMIT
    path.write_bytes(b"a" * (sample.PROMPT_FILE_LIMIT + 1))
    with pytest.raises(UserError, match="holds more than 1,000,000 bytes"):
        sample.read_prompt_file(path)
    path.write_bytes(b"one\r\ntwo\rthree\n")
    assert sample.read_prompt_file(path) == "one\ntwo\nthree\n"  # universal newlines, like a text-mode read


# --- every file a run writes: one line, last good checkpoint intact ---------------------------------------------

def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("target, path_fragment", [
    ("insight.heatmap.write_file", "attn/layer_0/step_000004.png"),  # a heatmap
    ("csv.writer", "attn/icl.csv"),  # CSV rows: icl.csv, the first an eval writes (stats.csv follows)
    ("json.dumps", "metrics.jsonl"),  # stands in for the write: its OSError reaches the same handler
])
def test_a_full_disk_while_writing_run_files_is_one_line_and_keeps_the_checkpoint(tmp_path, trained, data_dir,
                                                                                  monkeypatch, target, path_fragment):
    out, _ = fresh_copy(trained, tmp_path)
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    real = __import__("importlib").import_module(target.rsplit(".", 1)[0])
    original = getattr(real, target.rsplit(".", 1)[1])
    calls = []

    def fail_on_the_run_s_write(*args, **kwargs):
        calls.append(1)
        if target == "json.dumps" and not (args and isinstance(args[0], dict) and "time_s" in args[0]):
            return original(*args, **kwargs)  # only metrics rows fail, not other JSON
        return disk_full()

    monkeypatch.setattr(target, fail_on_the_run_s_write)
    with pytest.raises(UserError) as e:
        train(tiny_config(out, "train.max_iters=4", "eval.interval=2", "attn.layers=[0]"))
    message = str(e.value)
    assert message.startswith("could not write '") and path_fragment in message and "\n" not in message
    assert "(No space left on device); the last good checkpoint in" in message and "is intact" in message
    monkeypatch.undo()
    assert load_train_state(out / LATEST)["step"] == 2


def test_time_s_counts_from_the_start_of_the_run_with_what_came_before_the_first_step(tmp_path, data_dir,
                                                                                     monkeypatch):
    """The metrics rows' clock starts when train() begins, so the wait before the first step (data preparation,
    auto's timing) is in every time_s: resolving a run made 0.5 s slower moves the first row by as much."""
    import json
    import time

    import training.trainer as trainer
    resolve = trainer.resolve_run
    monkeypatch.setattr(trainer, "resolve_run", lambda *a, **kw: time.sleep(0.5) or resolve(*a, **kw))
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    train(tiny_config(tmp_path, "train.max_iters=1", "eval.interval=1", "attn.enabled=false"))
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["time_s"] >= 0.5

"""data/prepared.py: a prepared folder as its readers see it; here, a training run reading a folder while
data.prepare is asked to remake it (its other checks: test_prepared_trust.py)."""
from __future__ import annotations

import pytest
def test_prepare_force_refuses_a_folder_a_training_run_is_reading_and_the_run_finishes(tmp_path):
    from data.prepare import prepare_data
    from tests.helpers import prepared_shakespeare_dir, run_cli, tiny_config
    from training.config import load_run_config
    from training.trainer import train

    data_root = prepared_shakespeare_dir(tmp_path / "data")
    env = {"ATTNGPT_DATA_DIR": str(data_root)}
    force = ["-m", "data.prepare", "configs/tiny.yaml", "--force", "--quiet"]
    seen: list = []

    def prepare_again_midway(steps_done: int) -> bool:
        if steps_done == 2:
            seen.append(run_cli(force, env_extra=env))
        return False

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_root))
        mp.setenv("WANDB_MODE", "disabled")
        folder = prepare_data(load_run_config("configs/tiny.yaml").data, quiet=True).dir
        shards_before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}
        result = train(tiny_config(tmp_path / "run", "train.max_iters=4", "attn.enabled=false"),
                       should_stop=prepare_again_midway)
    assert result.step == 4  # the run read its shards to the end
    proc = seen[0]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "is being read by a training run" in proc.stderr and str(folder) in proc.stderr
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()} == shards_before  # untouched
    after = run_cli(force, env_extra=env)  # no reader any more: the folder is remade
    assert after.returncode == 0, after.stderr[-2000:]
    assert (folder / "meta.json").stat().st_mtime_ns > shards_before["meta.json"][1]


@pytest.mark.parametrize("train, val, fix", [(100, 8, "raise data.val_fraction"), (8, 100, "lower data.val_fraction"),
                                             (100, 100, None)])
def test_a_split_shorter_than_one_window_is_refused_saying_which_way_to_move_the_val_fraction(train, val, fix):
    """block_size 16 needs 17 tokens in each split: a short val split asks for more of the data, a short
    train split for less of it to go to val."""
    import types

    from common.errors import UserError
    from data.prepared import PreparedData
    data = types.SimpleNamespace(split_tokens={"train": train, "val": val}.__getitem__)
    if fix is None:
        PreparedData.check_block_size(data, 16)
        return
    split, n = ("val", val) if val < train else ("train", train)
    with pytest.raises(UserError) as e:
        PreparedData.check_block_size(data, 16)
    assert str(e.value) == (f"the {split} split has {n} tokens but block_size 16 needs at least 17: lower "
                            f"model.block_size, {fix}, or use more data")


@pytest.mark.parametrize("content, problem", [(b"{\"format_version\": 2,", "is not valid JSON"),
                                              (b"\xff{}", "is not UTF-8 text")])
def test_a_meta_json_that_cannot_be_parsed_is_refused_naming_the_file_and_the_way_back(tmp_path, content, problem):
    from common.errors import UserError
    from data.prepared import META_FILE, REDO, read_meta
    (tmp_path / META_FILE).write_bytes(content)
    with pytest.raises(UserError) as e:
        read_meta(tmp_path)
    message = str(e.value)
    assert message.startswith(f"'{tmp_path / META_FILE}' {problem}") and message.endswith(f": {REDO}")


def _hand_made_folder(folder, train_sizes, dtype="uint16"):
    """A prepared folder written by hand: char tokenizer "ab", train shards of these sizes, one val shard of 3."""
    import json

    import numpy as np

    from data.prepared import LAYOUT_VERSION, META_FILE
    folder.mkdir()
    entries = {"train": [], "val": []}
    for split, sizes in (("train", train_sizes), ("val", [3])):
        for i, n in enumerate(sizes):
            name = f"{split}_{i:05d}.bin"
            (np.arange(n) % 2).astype(np.uint16).tofile(folder / name)
            entries[split].append({"file": name, "tokens": n, "max_id": 1 if n > 1 else 0})
    (folder / META_FILE).write_text(json.dumps({"format_version": LAYOUT_VERSION, "dtype": dtype,
                                                "tokenizer": {"kind": "char", "chars": "ab"}, "shards": entries}))
    return folder


def test_a_last_shard_of_one_token_is_read_and_an_empty_one_is_refused(tmp_path):
    """A stream's last shard holds whatever was left when the data ended: one token is a shard; none is not."""
    from common.errors import UserError
    from data.prepared import load_prepared
    prepared = load_prepared(_hand_made_folder(tmp_path / "one", [5, 1]))
    assert prepared.split_tokens("train") == 6 and prepared.split_tokens("val") == 3
    with pytest.raises(UserError, match="train_00001.bin' is missing or does not hold the 0 tokens"):
        load_prepared(_hand_made_folder(tmp_path / "none", [5, 0]))


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_meta_json_naming_another_dtype_is_refused_naming_it(tmp_path, dtype):
    from common.errors import UserError
    from data.prepared import load_prepared
    with pytest.raises(UserError, match=f"names dtype '{dtype}', not uint16 or uint32"):
        load_prepared(_hand_made_folder(tmp_path / "d", [5], dtype=dtype))

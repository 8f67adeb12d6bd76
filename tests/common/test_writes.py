"""common/writes.py, the one way the product writes a file: never through a link at the target, never inside
a run or model folder this process does not write, whole or not at all, and a log appended after a torn line
starts on a line of its own. The rules are tried on generated layouts and contents; the command-line paths
(a dump folder holding a link to a run's weights, an out_dir inside another run's latest/) at the end."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from common.errors import UserError
from common.paths import CHECKPOINT_NAMES, MODEL_FILES, RUN_CONFIG, RUN_LOCK
from common.writes import append_text, owning, write_file
from tests.helpers import REPO, prepared_shakespeare_dir, run_cli, tiny_config

contents = st.one_of(st.binary(max_size=300), st.text(max_size=100))
names = st.text(alphabet="abcdefgh_.", min_size=1, max_size=8).filter(lambda n: n not in (".", ".."))


def _bytes(content: bytes | str) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def _fresh(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("w")


@settings(max_examples=40, deadline=None)
@given(old=st.binary(max_size=200), new=contents, name=names)
def test_a_link_at_the_target_is_replaced_and_what_it_points_to_is_untouched(tmp_path_factory, old, new, name):
    root = _fresh(tmp_path_factory)
    precious = root / "elsewhere" / "model.safetensors"
    precious.parent.mkdir()
    precious.write_bytes(old)
    (root / "out").mkdir()
    (root / "out" / name).symlink_to(precious)
    written = write_file(root / "out" / name, new)
    assert precious.read_bytes() == old  # the link's target is as it was
    assert not written.is_symlink() and written.read_bytes() == _bytes(new)
    assert sorted(p.name for p in (root / "out").iterdir()) == [name]  # no temporary file left


@settings(max_examples=30, deadline=None)
@given(old=st.binary(max_size=200), new=st.binary(min_size=1, max_size=200))
def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path_factory, old, new):
    root = _fresh(tmp_path_factory)
    target = root / "f.bin"
    target.write_bytes(old)

    def half_then_fail(f):
        f.write(new[: len(new) // 2])
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_file(target, half_then_fail)
    assert target.read_bytes() == old and [p.name for p in root.iterdir()] == ["f.bin"]


def _mark(folder: Path, kind: str) -> None:
    """Make `folder` a run or model folder of one of the kinds common/paths.py recognises."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "lock":
        (folder / RUN_LOCK).write_text("")
    elif kind == "run config":
        (folder / RUN_CONFIG).write_text("")
        (folder / CHECKPOINT_NAMES[0]).mkdir(exist_ok=True)
        (folder / CHECKPOINT_NAMES[0] / MODEL_FILES[0]).write_bytes(b"")
    else:
        (folder / kind).write_bytes(b"")


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 4), marked_at=st.integers(0, 4), kind=st.sampled_from(["lock", "run config", *MODEL_FILES]),
       owned=st.booleans(), data=contents)
def test_a_write_inside_a_run_or_model_folder_is_refused_unless_this_process_writes_it(
        tmp_path_factory, depth, marked_at, kind, owned, data):
    root = _fresh(tmp_path_factory)
    folders = [root / "/".join(f"d{i}" for i in range(k + 1)) for k in range(depth)]  # d0, d0/d1, ...
    target_dir = folders[-1]
    target_dir.mkdir(parents=True)
    marked = folders[marked_at] if marked_at < depth else None
    if marked is not None:
        _mark(marked, kind)
    target = target_dir / "out.bin"
    if marked is None:
        write_file(target, data)  # in no one's folder
        assert target.read_bytes() == _bytes(data)
        return
    if owned:
        with owning(marked):
            write_file(target, data)
            append_text(target_dir / "log.txt", "row")
        assert target.read_bytes() == _bytes(data)
        return
    for attempt in (lambda: write_file(target, data), lambda: append_text(target_dir / "log.txt", "row")):
        with pytest.raises(UserError, match="inside the run or model folder"):
            attempt()
    assert not target.exists() and not (target_dir / "log.txt").exists()


def test_owning_a_folder_inside_another_run_is_refused(tmp_path):
    _mark(tmp_path / "other", "lock")
    with pytest.raises(UserError, match=r"out_dir '.*latest.*' lies inside the run or model folder"):
        with owning(tmp_path / "other" / "latest" / "mine", "out_dir"):
            pass
    with owning(tmp_path / "other"):  # the run's own writer may write all of it
        with owning(tmp_path / "other" / ".latest.tmp"):
            pass


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
                              max_size=20), max_size=5),
       torn=st.text(alphabet="abc{}\":,0123456789", max_size=20), new=st.lists(
           st.text(alphabet="xyz0123456789", min_size=1, max_size=10), min_size=1, max_size=4))
@example(lines=[], torn="a", new=["X"])  # a torn line of one byte; a row ending in a letter that is not "\n"
def test_appending_after_a_torn_last_line_starts_a_fresh_one(tmp_path_factory, lines, torn, new):
    log = _fresh(tmp_path_factory) / "metrics.jsonl"
    log.write_bytes("".join(f"{line}\n" for line in lines).encode("utf-8") + torn.encode("utf-8"))
    for row in new:
        append_text(log, row)
    got = log.read_text(encoding="utf-8").split("\n")
    assert got[-1] == ""  # ends with a newline
    assert got[:-1][-len(new):] == new  # each new row on a line of its own
    assert got[:len(lines)] == lines  # the whole lines before are kept
    if torn:
        assert got[len(lines)] == torn  # the torn line is ended, not merged into the first new row


def test_a_log_that_is_a_link_is_refused(tmp_path):
    precious = tmp_path / "weights.bin"
    precious.write_bytes(b"w")
    (tmp_path / "metrics.jsonl").symlink_to(precious)
    with pytest.raises(UserError, match="symbolic link"):
        append_text(tmp_path / "metrics.jsonl", "{}")
    assert precious.read_bytes() == b"w"


# --- through the command lines ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def test_a_dump_folder_holding_links_to_a_runs_weights_replaces_the_links(tmp_path, data_dir):
    from training.trainer import train
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        mp.setenv("WANDB_MODE", "disabled")
        train(tiny_config(tmp_path / "run", "train.max_iters=2", "attn.enabled=false"))
    weights = tmp_path / "run" / "latest" / "model.safetensors"
    before = weights.read_bytes()
    dump = tmp_path / "dump"
    dump.mkdir()
    for name in ("layer_0.png", "attn.npz", "attention.html"):
        (dump / name).symlink_to(weights)
    proc = run_cli(["sample.py", "--ckpt", str(tmp_path / "run"), "--prompt", "ROMEO:", "--max-new-tokens", "2",
                    "--dump-attn", "0", "--dump-dir", str(dump)], env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert weights.read_bytes() == before
    for name in ("layer_0.png", "attn.npz", "attention.html"):
        assert not (dump / name).is_symlink() and (dump / name).stat().st_size > 0


def test_an_out_dir_inside_another_runs_checkpoint_is_refused_before_anything_is_written(tmp_path, data_dir):
    from training.trainer import train
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        mp.setenv("WANDB_MODE", "disabled")
        train(tiny_config(tmp_path / "run", "train.max_iters=2", "attn.enabled=false"))
    latest = tmp_path / "run" / "latest"
    before = sorted(p.name for p in latest.iterdir())
    proc = run_cli(["train.py", str(REPO / "configs" / "tiny.yaml"), f"out_dir={latest / 'mine'}",
                    "train.max_iters=2"], env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "lies inside the run or model folder" in proc.stderr and str(latest) in proc.stderr
    assert sorted(p.name for p in latest.iterdir()) == before and os.path.exists(latest / "model.safetensors")


def test_an_appended_row_ends_in_exactly_one_newline(tmp_path):
    log = tmp_path / "log.txt"
    for row in ("first\n\n", "second", "third\n"):
        append_text(log, row)
    assert log.read_bytes() == b"first\nsecond\nthird\n"

"""Where a reader may write (common/paths.py): never inside a run or a checkpoint or model folder. The rule on
generated folder layouts against an independent reading of the same layout (convert.py's check_out_dir on the same
layouts: tests/pretrained/hf/test_export.py); then convert.py and sample.py on a real run, with generated targets:
each ends in exit 0 or one line and exit 2, writes nothing outside the folder it was given, and leaves the run's
checkpoint exactly as it was."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import UserError
from common.paths import CHECKPOINT_NAMES, MODEL_FILES, RUN_CONFIG, RUN_LOCK, enclosing_run, expand_path
from pretrained.hf.export import CONVERT_MARK
from tests.helpers import prepared_shakespeare_dir

# what each generated mark puts into its folder; the first group marks a run or model folder, the second not
MARKS = {
    "lock": [RUN_LOCK], "run": [RUN_CONFIG, "latest/"], "run_best": [RUN_CONFIG, "best/"],
    "weights": ["model.safetensors", "config.json"], "state": ["train_state.pt"], "fsdp": ["fsdp_state.pt"],
    "index": ["model.safetensors.index.json"], "own": [CONVERT_MARK, "model.safetensors", "config.json"],
    "config_json": ["config.json"], "config_yaml": [RUN_CONFIG], "notes": ["notes.txt"], "dir_latest": ["latest/"],
}
NAMES = ("a", "b", "latest", "best")

layouts = st.fixed_dictionaries({
    "folders": st.dictionaries(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple),
                               st.sampled_from([None, *MARKS]), min_size=1, max_size=6),
    "target": st.lists(st.sampled_from(NAMES + ("new",)), min_size=1, max_size=4).map(tuple),
    "link": st.booleans(),  # reach the target through a symbolic link to its first folder
})


def build(root: Path, folders: dict[tuple[str, ...], str | None]) -> dict[tuple[str, ...], str | None]:
    """Make the layout under root; returns each folder's mark (folders a mark creates, e.g. latest/, have none)."""
    marks: dict[tuple[str, ...], str | None] = {}
    for parts, mark in sorted(folders.items()):
        for k in range(1, len(parts) + 1):
            marks.setdefault(parts[:k], None)
        marks[parts] = mark
    for parts, mark in list(marks.items()):
        folder = root.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        for entry in MARKS.get(mark, []) if mark else []:
            if entry.endswith("/"):
                (folder / entry.rstrip("/")).mkdir(exist_ok=True)
                marks.setdefault((*parts, entry.rstrip("/")), None)
            else:
                (folder / entry).write_text("{}\n")
    return marks


def contents(marks: dict, folder: tuple[str, ...]) -> set[str]:
    """What the layout puts into `folder`: its mark's files, and its subfolders as "name/"."""
    files = {e for e in MARKS.get(marks.get(folder), []) if not e.endswith("/")} if marks.get(folder) else set()
    return files | {p[-1] + "/" for p in marks if len(p) == len(folder) + 1 and p[:len(folder)] == folder}


def marking(marks: dict, folder: tuple[str, ...], held: set[str]) -> bool:
    """The rule, read from the module doc: a lock, a run's config beside a checkpoint folder with weights, or
    model files."""
    weights_below = any("model.safetensors" in contents(marks, (*folder, name)) for name in ("latest", "best")
                        if f"{name}/" in held)
    return RUN_LOCK in held or (RUN_CONFIG in held and weights_below) or bool(set(MODEL_FILES) & held)


def expected_enclosing(marks: dict, target: tuple[str, ...], own: bool) -> tuple[str, ...] | None:
    """The independent reading: the deepest folder on the target's way (itself first) whose contents mark it;
    with `own` (convert.py's view), the target itself, when it holds convert.py's mark and no subfolder, is
    marked only by a lock or a run's config."""
    for k in range(len(target), 0, -1):
        folder = target[:k]
        held = contents(marks, folder)
        if own and k == len(target) and CONVERT_MARK in held and not any(e.endswith("/") for e in held):
            held = held - set(MODEL_FILES)
        if marking(marks, folder, held):
            return folder
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts)
def test_enclosing_run_finds_the_deepest_marked_folder_on_generated_layouts(tmp_path_factory, layout):
    root = tmp_path_factory.mktemp("layout")
    marks = build(root / "tree", layout["folders"])
    target = layout["target"]
    start = root / "tree"
    if layout["link"]:
        os.symlink(root / "tree" / target[0], root / "link", target_is_directory=True)
        (root / "tree" / target[0]).mkdir(exist_ok=True)
        start = root / "link"
        target_path = start.joinpath(*target[1:])
    else:
        target_path = start.joinpath(*target)
    for own in (False, True):
        found = enclosing_run(target_path, CONVERT_MARK if own else None)
        expected = expected_enclosing(marks, target, own)
        if expected is None:
            assert found is None, (layout, found)
        else:
            assert found is not None and found[0] == (root / "tree").joinpath(*expected).resolve(), (layout, found)
            assert found[1].startswith("it holds ")


def test_the_rule_knows_the_files_runs_and_checkpoints_write():
    """The names common/paths.py recognises a run by are the ones the writers use."""
    from pretrained.checkpoint import BEST, LATEST, WEIGHTS_FILE
    from training.checkpoint import STATE_FILE
    from training.dist_checkpoint import STATE_FILE as FSDP_STATE_FILE
    from training.run_dir import LOCK_FILE
    assert LOCK_FILE == RUN_LOCK and set(CHECKPOINT_NAMES) == {LATEST, BEST}
    assert {WEIGHTS_FILE, STATE_FILE, FSDP_STATE_FILE} <= set(MODEL_FILES)


def test_expand_path_expands_the_home_folder_only(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert expand_path("~/runs/x", "out_dir") == "/home/someone/runs/x"
    assert expand_path("~", "out_dir") == "/home/someone"
    assert expand_path("runs/~x/y", "out_dir") == "runs/~x/y" and expand_path("./~", "out_dir") == "./~"
    with pytest.raises(UserError, match="out_dir holds a NUL character"):
        expand_path("a\x00b", "out_dir")


@given(raw=st.binary(min_size=1, max_size=24).filter(lambda b: b"\x00" not in b and not b.startswith(b"~")))
def test_a_path_is_read_when_it_is_utf8_and_refused_in_one_line_when_it_is_not(raw):
    # what a command line receives for those bytes (POSIX: the file system encoding with surrogateescape)
    text = os.fsdecode(raw)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(UserError, match="is not valid UTF-8") as e:
            expand_path(text, "out_dir")
        assert "\n" not in str(e.value)
        str(e.value).encode("utf-8")  # the message itself can be printed
    else:
        assert expand_path(text, "out_dir") == text


def test_sample_and_train_refuse_a_path_that_is_not_utf8_in_one_line(tmp_path):
    from tests.helpers import assert_one_line_error, run_cli
    bad = os.fsdecode(bytes(tmp_path) + b"/r\xff")
    assert_one_line_error(run_cli(["sample.py", "--ckpt", bad]), "sample.py", "--ckpt", "is not valid UTF-8")
    assert_one_line_error(run_cli(["train.py", "configs/tiny.yaml", f"out_dir={bad}"]), "train.py",
                          "'out_dir'", "is not valid UTF-8")
    assert not os.path.exists(bad)


# --- the real command lines, in this process, on a real run ---------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, trained) -> Path:
    """A folder holding `run` (a tiny trained run), `hf` (a folder convert.py wrote), `theirs` (a model folder
    convert.py did not write) and `empty`."""
    import convert
    root = tmp_path_factory.mktemp("workspace")
    shutil.copytree(trained[0], root / "run")
    with contextlib.redirect_stdout(io.StringIO()):
        assert convert.main(["to-hf", str(root / "run"), str(root / "hf")]) == 0
    (root / "theirs").mkdir()
    (root / "theirs" / "config.json").write_text("{}\n")
    (root / "empty").mkdir()
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under root: a file by its sha256, a link by its target."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "folder"
    return out


def remove_new(root: Path, before: dict[str, str]) -> None:
    """Delete what is under root now and was not before (deepest first): the layout as it was, for the next
    example (files that were rewritten keep their new content)."""
    for key in sorted(set(snapshot(root)) - set(before), key=lambda k: -k.count("/")):
        path = root / key
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def run_main(main, argv: list[str]) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, stderr.getvalue()


TARGETS = st.sampled_from(["run", "run/latest", "run/best", "run/latest/x", "run/new", "run/attn", "hf", "hf/sub",
                           "theirs", "empty", "fresh", "fresh/deeper"])


def under(key: str, target: str) -> bool:
    return key == target or key.startswith(target + "/")


def on_the_way(key: str, target: str) -> bool:
    """key is target, inside it, or a folder above it (made to hold it)."""
    return under(key, target) or target.startswith(key + "/")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(target=TARGETS, source=st.sampled_from(["run", "run/best", "run/latest"]), force=st.booleans())
def test_convert_never_writes_into_a_run_or_over_its_source(workspace, target, source, force):
    """to-hf (from-hf checks its OUT_DIR with the same check_out_dir: the layout test above and the bad-input
    matrix cover it)."""
    import convert
    before = snapshot(workspace)
    code, stderr = run_main(convert.main, ["to-hf", str(workspace / source), str(workspace / target),
                                           *(["--force"] if force else [])])
    after = snapshot(workspace)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code in (0, 2), stderr[-2000:]
    allowed = (not target.startswith(("run", "hf/")) and target not in (source, "theirs")
               and (target != "hf" or force))
    assert (code == 0) == allowed, (target, source, force, stderr)
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("convert.py: error: "), stderr
        assert after == before
    else:
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert all(on_the_way(k, target) for k in changed), changed
        assert (workspace / target / CONVERT_MARK).is_file() and (workspace / target / "model.safetensors").is_file()
        remove_new(workspace, before)
    assert {k: v for k, v in after.items() if under(k, "run")} == {k: v for k, v in before.items() if under(k, "run")}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(target=TARGETS, ckpt=st.sampled_from(["run", "run/best", "run/latest"]))
def test_sample_dumps_only_outside_runs_and_model_folders(workspace, target, ckpt):
    import sample
    before = snapshot(workspace)
    code, stderr = run_main(sample.main, ["--ckpt", str(workspace / ckpt), "--dump-attn", "0",
                                          "--dump-dir", str(workspace / target), "--max-new-tokens", "1"])
    after = snapshot(workspace)
    inside = target.startswith(("run", "hf"))  # the run, its checkpoints, and the folder convert.py wrote
    assert code == (2 if inside else 0), stderr[-2000:]
    if inside:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "--dump-dir" in lines[0] and "a reader never writes into one" in lines[0]
        assert after == before
    else:
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed and all(on_the_way(k, target) for k in changed), changed
        assert (workspace / target / "attention.html").is_file()
        remove_new(workspace, before)


def test_a_refused_path_is_shown_cut_to_a_bounded_length():
    """A long path in a refusal is cut: a NUL path to its first 60 characters (as a repr), one that is not
    UTF-8 to the first 80 characters of its ascii()."""
    long = "/runs/" + "x" * 100
    with pytest.raises(UserError) as e:
        expand_path(long + "\x00", "out_dir")
    assert str(e.value) == (f"out_dir holds a NUL character ({long[:60]!r}), which no path can hold: give a real "
                            f"path")
    bad = long + "\udcff"
    with pytest.raises(UserError) as e:
        expand_path(bad, "out_dir")
    assert str(e.value).startswith(f"out_dir {ascii(bad)[:80]} is not valid UTF-8: ")
    assert ascii(bad)[:81] not in str(e.value)

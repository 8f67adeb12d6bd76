"""common/path_kind.py: the one rule for what is at a path, against os.stat's own answer, on generated trees,
and through the readers that apply it (a config read from a FIFO, a corpus refused as a device)."""
from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.config_io import load_yaml
from common.errors import UserError
from common.path_kind import path_kind

KINDS = ["file", "directory", "fifo", "missing", "below_a_file", "link_to_file", "dangling_link", "loop"]


def _make(root: Path, kind: str) -> Path:
    path = root / kind
    if kind in ("file", "below_a_file"):
        path.write_text("x")
        return path / "child" if kind == "below_a_file" else path
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_file":
        (root / "target").write_text("x")
        path.symlink_to(root / "target")
    elif kind == "dangling_link":
        path.symlink_to(root / "nothing")
    elif kind == "loop":
        path.symlink_to(path)
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS))
def test_the_kind_is_what_stat_says(tmp_path, kind):
    root = tmp_path / str(len(list(tmp_path.iterdir())))
    root.mkdir()
    path = _make(root, kind)
    found = path_kind(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        assert (found.kind, found.says) == ("missing", "does not exist")
        return
    except OSError:
        assert found.kind == "unusable" and found.says.startswith("cannot be looked up (")
        return
    expected = "file" if stat.S_ISREG(mode) else "directory" if stat.S_ISDIR(mode) else "stream"
    assert found.kind == expected
    if stat.S_ISFIFO(mode):
        assert found.says.startswith("is a FIFO")


def test_devices_nul_and_permission_are_each_said_as_they_are(monkeypatch):
    assert (path_kind("/dev/zero").kind, path_kind("/dev/zero").says) == ("stream", "is a character device")
    assert path_kind("a\0b").kind == "unusable"

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(os, "stat", denied)
    assert path_kind("/x/y").kind == "denied" and "Permission denied" in path_kind("/x/y").says


def test_a_config_is_read_from_a_fifo_and_a_device_is_refused_by_its_size(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("train:\n  max_iters: 3\n"))
    writer.start()
    assert load_yaml(fifo) == {"train": {"max_iters": 3}}
    writer.join()
    with pytest.raises(UserError, match="config file '/dev/zero' is larger than 1 MB"):
        load_yaml("/dev/zero")
    with pytest.raises(UserError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_a_corpus_must_be_a_regular_file(tmp_path):
    from data.sources import list_text_files
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    for path, says in (("/dev/zero", "is a character device, not a regular file"),
                       (str(fifo), "is a FIFO (a pipe, such as a shell's <(...)), not a regular file"),
                       (str(tmp_path / "nothing.txt"), "does not exist")):
        with pytest.raises(UserError, match=re.escape(f"data.path '{path}' {says}")):
            list_text_files([path])

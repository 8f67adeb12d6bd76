"""`python -m data.prepare CONFIG [overrides]` as a user runs it: output, exit status 2, one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_prepare(tmp_path: Path, config: str | None, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "data.prepare"]
    if config is not None:
        path = tmp_path / "run.yaml"
        path.write_text(config, encoding="utf-8")
        argv.append(str(path))
    env = dict(os.environ, ATTNGPT_DATA_DIR=str(tmp_path / "data"))
    return subprocess.run([*argv, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("data.prepare: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_prepares_the_data_section_and_reports_counts(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello there, general.\n" * 50, encoding="utf-8")
    config = f"model:\n  block_size: 16\n  n_layer: 99\ntrain:\n  anything: goes\ndata:\n  source: text\n  path: {corpus}\n"
    result = run_prepare(tmp_path, config, "data.val_fraction=0.2", "train.max_iters=5", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "train:     880 tokens in 1 shard (train_00000.bin)" in result.stdout
    assert "val:       220 tokens in 1 shard (val_00000.bin)" in result.stdout
    again = run_prepare(tmp_path, config, "data.val_fraction=0.2", "--quiet")
    assert again.stdout.startswith("reused ")


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_prepare(tmp_path, None, str(tmp_path / "absent.yaml"))
    assert_one_line_error(result, "absent.yaml", "not found")


def test_unknown_key_and_bad_tokenizer(tmp_path: Path) -> None:
    assert_one_line_error(run_prepare(tmp_path, "data:\n  tokenizr: gpt2\n"), "data.tokenizr", "tokenizer")
    assert_one_line_error(run_prepare(tmp_path, "data: {}\n", "data.tokenizer=gtp2"), "did you mean 'gpt2'")


def test_missing_text_path(tmp_path: Path) -> None:
    result = run_prepare(tmp_path, f"data:\n  source: text\n  path: {tmp_path / 'nope.txt'}\n")
    assert_one_line_error(result, "nope.txt", "does not exist")


def test_non_utf8_file(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"na\xefve text\n" * 10)
    result = run_prepare(tmp_path, f"data:\n  source: text\n  path: {tmp_path / 'latin1.txt'}\n", "--quiet")
    assert_one_line_error(result, "latin1.txt", "not UTF-8", "offset 2")


def test_block_size_longer_than_val(tmp_path: Path) -> None:
    (tmp_path / "small.txt").write_text("tiny corpus.\n" * 10, encoding="utf-8")
    config = f"model:\n  block_size: 64\ndata:\n  source: text\n  path: {tmp_path / 'small.txt'}\n"
    assert_one_line_error(run_prepare(tmp_path, config, "--quiet"), "val split has 13 tokens", "block_size 64")


@pytest.mark.parametrize("value", ["-3", "big"])
def test_bad_block_size(tmp_path: Path, value: str) -> None:
    assert_one_line_error(run_prepare(tmp_path, f"model:\n  block_size: {value}\n"), "model.block_size")

"""The one printer (common/console.py) through the real command lines: a reader that closes the pipe early
(`| head`) ends sample.py and data.prepare quietly with 141 and lets a training run finish with 0; a full
device (`>/dev/full`) is one line naming stdout, or a warning while the run goes on; never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, fresh_copy, prepared_shakespeare_dir

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
TRAIN = ["train.py", TINY, "train.max_iters=2", "eval.interval=2", "attn.enabled=false", "train.peak_flops=1e12"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def _env(data_dir: Path) -> dict[str, str]:
    return {**os.environ, "ATTNGPT_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def _read_then_close(args: list[str], data_dir: Path, first_bytes: int) -> tuple[int, bytes, str]:
    """Run a command, read `first_bytes` of its stdout and close the pipe, as `| head -c N` does."""
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=_env(data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    head = proc.stdout.read(first_bytes)
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    return proc.wait(timeout=180), head, err


def _to_dev_full(args: list[str], data_dir: Path) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=_env(data_dir), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=180)


def test_sample_ends_quietly_with_141_when_its_reader_closes_the_pipe(trained, tmp_path, data_dir):
    run, _ = fresh_copy(trained, tmp_path)
    code, head, err = _read_then_close(["sample.py", "--ckpt", str(run), "--prompt", "ROMEO:",
                                        "--max-new-tokens", "5000"], data_dir, 10)
    assert head.startswith(b"ROMEO:") and len(head) == 10
    assert code == 141 and "Traceback" not in err and "Error" not in err, err[-2000:]


def test_a_run_whose_reader_closed_the_pipe_finishes_its_training_and_exits_0(tmp_path, data_dir):
    code, head, err = _read_then_close([*TRAIN, f"out_dir={tmp_path / 'run'}"], data_dir, 8)
    assert head == b"# config"
    assert code == 0 and "Traceback" not in err and "error" not in err, err[-2000:]
    assert (tmp_path / "run" / "latest" / "model.safetensors").is_file()


def test_a_full_stdout_is_one_line_for_sample_and_prepare_and_a_warning_for_a_run(trained, tmp_path, data_dir):
    run, _ = fresh_copy(trained, tmp_path)
    for args, prog in ((["sample.py", "--ckpt", str(run), "--max-new-tokens", "5"], "sample.py"),
                       (["-m", "data.prepare", TINY], "data.prepare")):
        proc = _to_dev_full(args, data_dir)
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[")]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert lines == [f"{prog}: error: cannot write to stdout (the disk is full: No space left on device): free "
                         f"space where it goes, or send it elsewhere"], proc.stderr[-2000:]
    proc = _to_dev_full([*TRAIN, f"out_dir={tmp_path / 'run2'}"], data_dir)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("train.py: warning: cannot write to stdout (the disk is full") == 1
    assert (tmp_path / "run2" / "latest" / "model.safetensors").is_file()


def test_a_config_given_as_a_process_substitution_is_read(tmp_path, data_dir):
    proc = subprocess.run(["bash", "-c", f"'{sys.executable}' -m data.prepare <(cat '{TINY}') --quiet"], cwd=REPO,
                          env=_env(data_dir), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.startswith("reused tinyshakespeare"), proc.stderr[-2000:]

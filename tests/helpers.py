"""Shared by the training, sampling and reliability tests: tiny run configs on tinyshakespeare; and by the data
tests: token files written by hand."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.device import torch_version

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny.yaml"
SHAKESPEARE_SOURCES = [REPO / "data" / "cache" / "tinyshakespeare" / "input.txt",
                       REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]

# the runs of the FSDP tests (tests/training/conftest.py's `uninterrupted`, test_parallel_fsdp.py, test_dist_checkpoint.py):
# tiny.yaml for 6 steps, each logged, evals every 2, no dropout (so one process and two compare step by step)
TINY_SIX_STEPS = ["configs/tiny.yaml", "train.max_iters=6", "train.log_interval=1", "eval.interval=2", "eval.iters=2",
                  "model.dropout=0.0", "train.peak_flops=1e12"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]

# FSDP2 runs on a CPU from PyTorch 2.6 on; before, it creates CUDA streams (training/parallel.py refuses it)
needs_cpu_fsdp = pytest.mark.skipif(torch_version() < (2, 6), reason="FSDP2 on a CPU needs PyTorch >= 2.6")


class Plant:
    """A pickle payload whose unpickling would create the `marker` file: proof that code ran. `how`:
    "system" runs a shell command (os.system), anything else opens the file for writing (builtins.open)."""

    def __init__(self, marker: Path, how: str):
        self.marker, self.how = str(marker), how

    def __reduce__(self):
        if self.how == "system":
            return (os.system, (f"touch '{self.marker}'",))
        return (open, (self.marker, "w"))


def shakespeare_data_dir(root: Path) -> Path:
    """A data folder holding tinyshakespeare/input.txt (the test skips when no copy is on this machine)."""
    target = root / "tinyshakespeare" / "input.txt"
    if not target.is_file():
        source = next((p for p in SHAKESPEARE_SOURCES if p.is_file()), None)
        if source is None:
            pytest.skip("tinyshakespeare input.txt is not on this machine (bash .ci/run places it)")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    return root


def prepared_shakespeare_dir(root: Path) -> Path:
    """shakespeare_data_dir with tiny.yaml's data already prepared, so no command line (or a kill during
    one) spends its time preparing it."""
    root = shakespeare_data_dir(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(root))
        from data.prepare import prepare_data
        from training.config import load_run_config
        prepare_data(load_run_config(TINY).data, quiet=True)
    return root


def tiny_config(out_dir: Path, *overrides: str):
    """configs/tiny.yaml into out_dir; the peak FLOP/s is given, so no run spends its start measuring it."""
    from training.config import load_run_config
    return load_run_config(TINY, [f"out_dir={out_dir}", "train.peak_flops=1e12", *overrides])


def fresh_copy(trained: tuple[Path, object], tmp_path: Path) -> tuple[Path, object]:
    """A private copy of the `trained` fixture's out_dir (conftest.py), and its model."""
    out, model = trained
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    return copy, model


def write_bin(path: Path, tokens: np.ndarray) -> Path:
    """`tokens` as a flat token file (a shard, or a split's older train.bin / val.bin), in their own dtype."""
    tokens.tofile(path)
    return path


def run_cli(args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 180, cwd: Path | None = None,
            **kwargs) -> subprocess.CompletedProcess:
    """Run a project command line (`train.py`, `sample.py`, `-m data.prepare`) like a user would: from the
    repository, or from `cwd` (scripts are then found in the repository, and `-m` modules through PYTHONPATH)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    if cwd is not None:
        args = [str(REPO / a) if a.endswith(".py") and not os.path.isabs(a) else a for a in args[:1]] + args[1:]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def run_benchmark(script: Path, args: list[str], results: Path | None, env_extra: dict[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a benchmarks/ script with `args` as its command line would, except that what it saves goes to `results`
    (a temporary RESULTS.md) instead of benchmarks/RESULTS.md."""
    code = (f"import runpy, sys; sys.path.insert(0, {str(script.parent)!r}); import _report; "
            f"_report.RESULTS = __import__('pathlib').Path({str(results)!r}); sys.argv = {[str(script), *args]!r}; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    return run_cli(["-c", code], env_extra=env_extra, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, prog: str, *fragments: str) -> None:
    """Exit status 2, one line on stderr starting with 'prog: error:', no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def kill_tree(pid: int, timeout: float = 30) -> None:
    """SIGKILL `pid` and every process below it, as a power cut would, and wait until none runs. torchrun
    starts each worker in a session of its own: killing torchrun's process group would leave the workers
    running (and writing into the run's folder)."""
    import signal
    import time

    def children(p: int) -> list[int]:
        found: list[int] = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return found

    tree, todo = [], [pid]
    while todo:  # freeze each process first, so that none starts another while we look
        p = todo.pop()
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        tree.append(p)
        todo += children(p)
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def running(p: int) -> bool:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is done
        except (OSError, IndexError):
            return False

    deadline = time.monotonic() + timeout
    while any(running(p) for p in tree):
        assert time.monotonic() < deadline, f"processes {tree} outlived SIGKILL"
        time.sleep(0.02)


def default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A test run launched in the background (`cmd &`
    in a script, nohup) ignores SIGINT, every child inherits that, and Python then installs no Ctrl-C handler:
    the signal these tests send would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

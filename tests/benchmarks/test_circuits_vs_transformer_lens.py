"""benchmarks/circuits_vs_transformer_lens.py: TransformerLens is not a project dependency, so the script must
say so in one line and exit 0 where it is missing (the project's venv), and agree with it where it is installed
(a venv of its own: the script's header)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "circuits_vs_transformer_lens.py"


def run(*code_or_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_without_transformer_lens_it_says_so_in_one_line_and_exits_0():
    hidden = (f"import runpy, sys; sys.modules['transformer_lens'] = None; sys.path.insert(0, {str(SCRIPT.parent)!r}); "
              f"sys.argv = [{str(SCRIPT)!r}, '--quick']; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    done = run("-c", hidden)  # the import fails as it does where the package is missing
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "transformer_lens is not installed" in done.stdout


def test_quick_run_agrees_with_transformer_lens():
    pytest.importorskip("transformer_lens", reason="TransformerLens is installed only in a venv of its own")
    done = run(str(SCRIPT), "--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "within the tolerance" in done.stdout

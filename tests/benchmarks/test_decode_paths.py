"""benchmarks/decode_paths.py on a tiny shape (no speed is asserted): a row per round and their median, each ratio
from the cells it divides; the two paths checked equal before timing, and a disagreement stops the script; by
default it appends one section to RESULTS.md; bad input gets one line and exit 2."""
from __future__ import annotations

import re
import sys

import pytest
import torch

from tests.helpers import REPO, assert_one_line_error, run_benchmark, run_cli

SCRIPT = REPO / "benchmarks" / "decode_paths.py"
QUICK = ["--shape", "small", "--prompt", "3", "--new-tokens", "6", "--threads", "1"]
sys.path.insert(0, str(SCRIPT.parent))
from sample_vs_hf import SHAPES  # noqa: E402  (benchmarks/ on the path first)

ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def test_each_round_times_both_paths_and_save_appends_a_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    done = run_benchmark(SCRIPT, ["--rounds", "2", *QUICK], results, env_extra=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d+|median) \| ([\d.]+) \| ([\d.]+) \| \**([\d.]+)\** \|$", done.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "2", "median"]
    for _, flat, modules, ratio in rows:
        assert float(ratio) == pytest.approx(float(modules) / float(flat), rel=0.01, abs=0.002)
    saved = results.read_text()
    assert saved.count("## The flat decode step against the modules") == 1
    assert "- Command: `python benchmarks/decode_paths.py" in saved and "| median |" in saved


def test_the_check_compares_one_step_both_ways_from_the_same_cache(monkeypatch):
    import decode_paths
    from model import GPT
    from model.decode import EagerDecodeStep
    model = GPT(SHAPES["small"]).eval()
    prompt = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(0))
    assert decode_paths.same_logits(model, prompt)
    original = EagerDecodeStep.__call__
    monkeypatch.setattr(EagerDecodeStep, "__call__", lambda self, *a: original(self, *a) + 1e-3)
    assert not decode_paths.same_logits(model, prompt)


@pytest.mark.parametrize("flags", [["--rounds", "0"], ["--threads", "0"], ["--new-tokens", "1"], ["--prompt", "0"],
                                   ["--prompt", "1000", "--new-tokens", "100"]])
def test_bad_input_gets_one_line_and_exit_2(flags):
    assert_one_line_error(run_cli([str(SCRIPT), *QUICK, *flags, "--no-save"], env_extra=ONE_THREAD), "decode_paths")

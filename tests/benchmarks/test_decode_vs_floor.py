"""benchmarks/decode_vs_floor.py on a tiny shape (no speed is asserted): a row per round and their median, each
ratio the floor pass over the decode step; by default it appends one section to RESULTS.md; bad input gets one
line and exit 2."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import torch

from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "decode_vs_floor.py"
QUICK = ["--shape", "small", "--prompt", "3", "--new-tokens", "6", "--threads", "1"]


def run(python_args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *python_args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_each_round_sets_its_floor_pass_against_its_decode_step_and_save_appends_a_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    code = (f"import runpy, sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import _report; "
            f"_report.RESULTS = __import__('pathlib').Path({str(results)!r}); "
            f"sys.argv = [{str(SCRIPT)!r}, '--rounds', '2', " + ", ".join(repr(a) for a in QUICK)
            + f"]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    done = run(["-c", code])
    assert done.returncode == 0, done.stderr[-3000:]
    number = r"([\d.]+)"
    rows = re.findall(rf"^\| (\d+|median) \| {number} \| {number} \| \**{number}\** \| {number} \| (-?[\d.]+) \| "
                      rf"(-?[\d.]+) \|$", done.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "2", "median"]
    for _, step, floor, ratio, rest, in_step, in_step_ratio in rows[:2]:
        assert float(step) > 0 and float(floor) > 0 and float(rest) > 0
        assert abs(float(floor) / float(step) - float(ratio)) < 0.002 + 0.01 * float(ratio)
        # the matmuls in a step: the step less the rest, then over the floor pass; each cell rounded to 0.01
        assert abs(float(step) - float(rest) - float(in_step)) <= 0.0151
        if float(floor) >= 0.01:  # a floor shown as 0.00 bounds no ratio
            ends = [(float(in_step) + a) / (float(floor) + b) for a in (-0.005, 0.005) for b in (-0.005, 0.005)]
            assert min(ends) - 0.0051 <= float(in_step_ratio) <= max(ends) + 0.0051
    saved = results.read_text()
    assert saved.count("## A decode step against the matmul floor, token by token") == 1
    assert "- Command: `python benchmarks/decode_vs_floor.py" in saved and "| median |" in saved


def test_the_floor_pass_runs_once_per_token_on_the_models_own_matmul_modules():
    sys.path.insert(0, str(SCRIPT.parent))
    import decode_vs_floor
    import _limits
    from model import GPT
    model = GPT(decode_vs_floor.SHAPES["small"]).eval()
    calls = []
    for m in _limits.matmul_modules(model)[:-1]:
        m.module.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    prompt = torch.zeros(1, 3, dtype=torch.long)
    step_s, floor_s = decode_vs_floor.one_round(model, prompt, 5)
    assert step_s > 0 and floor_s > 0
    per_pass = len(_limits.matmul_modules(model)) - 1
    # the prefill (3 positions); a decode step after each of the 5 tokens (generate runs one for the last token
    # too, its logits unused) and a floor pass after each: every block matmul once in each
    assert calls.count(3) == per_pass and calls.count(1) == (5 + 5) * per_pass


def test_the_rest_of_a_step_runs_no_matmul_module_and_puts_every_one_back():
    """matmuls_left_out swaps every matmul slot (the LM head included) for zeros of its output shape and puts the
    very modules back; a generation inside it calls none of them."""
    sys.path.insert(0, str(SCRIPT.parent))
    import decode_vs_floor
    from model import GPT
    model = GPT(decode_vs_floor.SHAPES["small"]).eval()
    modules = [getattr(parent, attr) for _, parent, attr in model.matmul_slots()]
    calls = []
    for module in modules:
        module.register_forward_hook(lambda module, args, out: calls.append(module))
    x = torch.randn(1, 1, modules[-1].in_features)
    with decode_vs_floor.matmuls_left_out(model):
        stand_ins = [getattr(parent, attr) for _, parent, attr in model.matmul_slots()]
        assert all(isinstance(m, decode_vs_floor.NoMatmul) for m in stand_ins)
        out = stand_ins[-1](x)
        assert out.shape == (1, 1, modules[-1].out_features) and not bool(out.any())
    assert [getattr(parent, attr) for _, parent, attr in model.matmul_slots()] == modules
    assert decode_vs_floor.rest_of_step(model, torch.zeros(1, 3, dtype=torch.long), 5) > 0
    assert calls == []
    assert [getattr(parent, attr) for _, parent, attr in model.matmul_slots()] == modules


def test_bad_input_gets_one_line_and_exit_2():
    for bad in (["--new-tokens", "2"], ["--rounds", "0"], ["--prompt", "2000"]):
        done = run([str(SCRIPT), *bad])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("decode_vs_floor: error:")

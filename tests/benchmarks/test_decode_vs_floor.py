"""benchmarks/decode_vs_floor.py on a tiny shape (no speed is asserted): a row per round and their median, each
ratio from the cells it divides, the stretches between the matmuls by kind; the timing wrappers and the step
split on their own; by default it appends one section to RESULTS.md; bad input gets one line and exit 2."""
from __future__ import annotations

import re
import subprocess
import sys

import torch

from tests.helpers import REPO, run_benchmark, run_cli

SCRIPT = REPO / "benchmarks" / "decode_vs_floor.py"
QUICK = ["--shape", "small", "--prompt", "3", "--new-tokens", "6", "--threads", "1"]
sys.path.insert(0, str(SCRIPT.parent))
from sample_vs_hf import SHAPES  # noqa: E402  (benchmarks/ on the path first)

SHAPES_SMALL_LAYERS = SHAPES["small"].n_layer


def run(python_args: list[str]) -> subprocess.CompletedProcess:
    return run_cli(python_args, env_extra={"OMP_NUM_THREADS": "1"}, timeout=300)


def test_each_round_sets_its_floor_pass_against_its_decode_step_and_save_appends_a_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    done = run_benchmark(SCRIPT, ["--rounds", "2", *QUICK], results, env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    number = r"([\d.]+)"
    rows = re.findall(rf"^\| (\d+|median) \| {number} \| {number} \| \**{number}\** \| {number} \| {number} \| "
                      rf"{number} \| {number} \| \**{number}\** \|$", done.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "2", "median"]
    for _, step, floor, ratio, matmuls, matmul_ratio, between, left_out, between_ratio in rows[:2]:
        assert min(float(step), float(floor), float(matmuls), float(between), float(left_out)) > 0
        # each ratio from the cells it divides, within their rounding to 0.01 ms (and its own to 0.001 / 0.01)
        for num, den, shown, digits in ((floor, step, ratio, 0.0005), (matmuls, floor, matmul_ratio, 0.005),
                                        (between, left_out, between_ratio, 0.005)):
            if float(den) >= 0.02:  # a cell shown as 0.01 bounds no ratio
                ends = [(float(num) + a) / (float(den) + b) for a in (-0.005, 0.005) for b in (-0.005, 0.005)]
                assert min(ends) - digits - 1e-9 <= float(shown) <= max(ends) + digits + 1e-9
    stretches = re.findall(rf"^\| (attn\.\w+|mlp\.\w+|lm_head) \| {number} \| {number} \| {number} \|$",
                           done.stdout, re.M)
    assert [s[0] for s in stretches] == ["attn.qkv_proj", "attn.out_proj", "mlp.fc_in", "mlp.fc_out", "lm_head"]
    assert all(float(real) > 0 and float(left) > 0 for _, real, left, _ in stretches)
    saved = results.read_text()
    assert saved.count("## A decode step against the matmul floor, token by token") == 1
    assert "- Command: `python benchmarks/decode_vs_floor.py" in saved and "| median |" in saved


def test_quantize_decodes_the_quantized_model_and_says_so():
    done = run([str(SCRIPT), *QUICK, "--rounds", "1", "--dtype", "float32", "--quantize", "int8", "--no-save"])
    assert done.returncode == 0, done.stderr[-3000:]
    described = re.search(r"^- small in float32, --quantize int8, batch 1, .*; int8 \(int8 weights, activations as "
                          r"two int8 digits.*in (\d+) block matmuls", done.stdout, re.M)
    assert described and int(described[1]) == 4 * SHAPES_SMALL_LAYERS, done.stdout[-2000:]
    plain = run([str(SCRIPT), *QUICK, "--rounds", "1", "--no-save"])
    assert plain.returncode == 0 and "--quantize" not in plain.stdout and "int8" not in plain.stdout


def test_the_floor_pass_runs_once_per_token_on_the_models_own_matmul_modules():
    import decode_vs_floor
    import _limits
    from model import GPT
    model = GPT(SHAPES["small"]).eval()
    calls = []
    for m in _limits.matmul_modules(model)[:-1]:
        m.module.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    prompt = torch.zeros(1, 3, dtype=torch.long)
    step_s, floor_s = decode_vs_floor.one_round(model, prompt, 5)
    assert step_s > 0 and floor_s > 0
    per_pass = len(_limits.matmul_modules(model)) - 1
    # the prefill (3 positions), which gives the first token; a decode step for each of the other 4 (none after
    # the last token) and a floor pass after each of the 5: every block matmul once in each
    assert calls.count(3) == per_pass and calls.count(1) == (4 + 5) * per_pass


def test_the_matmuls_left_out_runs_no_matmul_module_and_puts_every_one_back():
    """matmuls_left_out swaps every matmul slot (the LM head included) for zeros of its output shape and puts the
    very modules back; a generation inside it calls none of them."""
    import decode_vs_floor
    from model import GPT
    model = GPT(SHAPES["small"]).eval()
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
        split = decode_vs_floor.timed_generation(model, torch.zeros(1, 3, dtype=torch.long), 5)
        assert split.step > 0 and split.matmuls > 0
    assert calls == []
    assert [getattr(parent, attr) for _, parent, attr in model.matmul_slots()] == modules


def test_every_matmul_call_is_timed_in_slot_order_and_the_methods_are_put_back():
    """matmul_calls_timed records each block matmul's forward and the head (GPT.logits) once per pass, in
    GPT.matmul_slots order, the numbers unchanged, the modules' types kept; after it, nothing is shadowed, and
    a method already shadowed on an instance before is shadowed by that one again."""
    import decode_vs_floor
    from model import GPT
    model = GPT(SHAPES["small"]).eval()
    idx = torch.tensor([[3, 1, 4, 1]])
    with torch.no_grad():
        expected = model(idx)[0]
    slots = model.matmul_slots()
    types = [type(getattr(parent, attr)) for _, parent, attr in slots]
    first = getattr(slots[0][1], slots[0][2])
    first.forward = first.forward  # an instance-level forward already there: restored, not dropped
    before = first.__dict__["forward"]
    marks = []
    with torch.no_grad(), decode_vs_floor.matmul_calls_timed(model, marks):
        got = model(idx)[0]
        model(idx[:, :2])
        assert [type(getattr(parent, attr)) for _, parent, attr in slots] == types
    assert torch.equal(got, expected)
    assert [index for index, _, _ in marks] == list(range(len(slots))) * 2
    assert all(start <= end for _, start, end in marks)
    assert first.__dict__["forward"] is before
    assert "logits" not in model.__dict__
    assert all("forward" not in getattr(parent, attr).__dict__ for _, parent, attr in slots[1:-1])


def test_a_step_is_split_into_its_matmuls_and_the_stretches_after_each_kind():
    """split_steps on made-up marks: two slots ("a", then the head "h"), a prefill, then three decode steps; each
    step from its first call to the next one's, its matmuls summed, each stretch credited to the call before."""
    import decode_vs_floor
    marks = [(0, 0.0, 1.0), (1, 2.0, 3.0)]  # the prefill: not a step
    for t in (10.0, 20.0, 31.0):  # steps start at 10, 20, 31: a: 1 s, 2 s gap, h: 3 s, then the rest to the next
        marks += [(0, t, t + 1.0), (1, t + 3.0, t + 6.0)]
    split = decode_vs_floor.split_steps(marks, ["a", "h"])
    # two whole steps (10 -> 20 and 20 -> 31): the third has no next first call to end it
    assert split.step == (10.0 + 11.0) / 2 and split.matmuls == 4.0
    assert split.between == {"a": 2.0, "h": (4.0 + 5.0) / 2}
    for broken in (marks[:5], marks[:2] + [(1, 10.0, 11.0), (0, 12.0, 13.0)] * 3):
        try:
            decode_vs_floor.split_steps(broken, ["a", "h"])
        except ValueError as e:
            assert "matmul calls" in str(e)
        else:
            raise AssertionError("marks out of slot order or too few steps must be refused")


def test_bad_input_gets_one_line_and_exit_2():
    for bad in (["--new-tokens", "2"], ["--rounds", "0"], ["--prompt", "2000"]):
        done = run([str(SCRIPT), *bad])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("decode_vs_floor: error:")

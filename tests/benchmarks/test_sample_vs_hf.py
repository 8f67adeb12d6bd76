"""benchmarks/sample_vs_hf.py and its decode-step limits (benchmarks/_limits.py): the bytes a step reads against a
count from the config's dimensions, the fractions as stated, a bandwidth that is a number, and the script end to end
on the smallest shape. Speed is never asserted."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from model import GPT, ModelConfig
from model.generate import generate
from tests.helpers import REPO, run_benchmark

sys.path.insert(0, str(REPO / "benchmarks"))
import _limits  # noqa: E402  (benchmarks/ is not a package)
import sample_vs_hf  # noqa: E402

SCRIPT = REPO / "benchmarks" / "sample_vs_hf.py"
GPT2_LIKE = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, d_model=32, pos="learned", norm="layernorm",
                 mlp="gelu", bias=True, attn_impl="sdpa")
LLAMA_LIKE = dict(vocab_size=50, block_size=64, n_layer=3, n_head=4, n_kv_head=2, d_model=32, pos="rope",
                  norm="rmsnorm", mlp="swiglu", mlp_hidden=48, tie_embeddings=False, attn_impl="sdpa")


def counted_by_hand(kw: dict, element_size: int, context: float) -> tuple[int, int, float]:
    """(matmul weight bytes, other weight bytes, KV cache bytes) of one decode step, from the dimensions alone."""
    d, layers, heads, vocab = kw["d_model"], kw["n_layer"], kw["n_head"], kw["vocab_size"]
    kv_heads, head_dim, bias = kw.get("n_kv_head", heads), d // heads, int(kw.get("bias", False))
    hidden = kw.get("mlp_hidden") or 4 * d
    mlp_in = 2 * hidden if kw["mlp"] == "swiglu" else hidden  # SwiGLU's gate and up in one matrix
    qkv_out = (heads + 2 * kv_heads) * head_dim
    per_block = (d * qkv_out + bias * qkv_out + heads * head_dim * d + bias * d
                 + d * mlp_in + bias * mlp_in + hidden * d + bias * d)
    matmuls = layers * per_block + vocab * d  # the LM head has no bias
    norm = 2 * d if kw["norm"] == "layernorm" and bias else d
    rows = 2 * d if kw["pos"] == "learned" else d  # one token row (+ one position row)
    other = (2 * layers + 1) * norm + rows
    kv = 2 * layers * kv_heads * head_dim * context * element_size
    return matmuls * element_size, other * element_size, kv


@pytest.mark.parametrize("kw, dtype", [(GPT2_LIKE, torch.float32), (LLAMA_LIKE, torch.bfloat16)],
                         ids=["gpt2-float32", "llama-bfloat16"])
def test_bytes_per_token_is_the_count_from_the_config(kw, dtype):
    model = GPT(ModelConfig(**kw)).to(dtype)
    context = _limits.mean_decode_context(prompt_tokens=5, new_tokens=4)
    counted = _limits.decode_bytes_per_token(model, context, cache_element_size=dtype.itemsize)
    matmuls, other, kv = counted_by_hand(kw, dtype.itemsize, context)
    assert (counted.matmul_weights, counted.other_weights, counted.kv_cache) == (matmuls, other, kv)
    assert counted.total == matmuls + other + kv


def test_the_mean_context_is_what_generate_attends_over():
    model = GPT(ModelConfig(**LLAMA_LIKE)).eval()
    attended = []  # slots of each one-token decode step: the width of its attention mask

    def record(attn, args):
        x, mask = args[0], args[2]
        if x.shape[1] == 1:
            attended.append(mask.shape[-1])
    model.blocks[0].attn.register_forward_pre_hook(record)
    generate(model, torch.zeros(1, 5, dtype=torch.long), 4, temperature=0.0)
    # steps over 6, 7 and 8 slots give tokens 2-4; none runs after the 4th
    assert attended == [6, 7, 8]
    assert sum(attended) / len(attended) == _limits.mean_decode_context(5, 4) == 5 + 2


class Int8Linear(torch.nn.Module):
    """A stand-in for a quantized replacement of nn.Linear: int8 weight and float32 scales, as buffers, and the
    in_features / out_features every replacement keeps."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", torch.zeros(linear.weight.shape, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(linear.out_features))

    def forward(self, x):
        return (x @ self.weight_int8.t().float()) * self.scale


def test_a_replaced_matmul_module_counts_what_it_stores():
    model = GPT(ModelConfig(**GPT2_LIKE))
    before = _limits.decode_bytes_per_token(model, 1.0, 4).matmul_weights
    fc_in = model.blocks[0].mlp.fc_in  # (4d, d) float32 weight and (4d,) bias
    model.blocks[0].mlp.fc_in = Int8Linear(fc_in)
    after = _limits.decode_bytes_per_token(model, 1.0, 4).matmul_weights
    assert before - after == fc_in.weight.nbytes + fc_in.bias.nbytes - (fc_in.weight.numel() + 4 * fc_in.out_features)


def test_fractions_are_tokens_per_s_over_each_limit():
    # bound: 10 GB/s / 100 MB per token = 100 tok/s; floor: 1 / 0.004 s = 250 tok/s
    assert _limits.fractions_reached(50.0, 10e9, 100e6, 0.004) == pytest.approx((50.0, 20.0))
    measured = sample_vs_hf.Measured(
        shape="small", n_new=4, rate={"attngpt": 50.0, "attngpt-compiled": 80.0, "hf": 25.0}, agreement="yes",
        compile_s=1.0, mean_context=34.5, bytes_per_token=_limits.DecodeBytes(90_000_000, 0, 10e6), floor_s=0.004,
        linear_floor_s=0.005, pack_note=None, cli_rate=40.0, cli_floor_s=0.002, cli_paired_floor=9.5)
    cells = [c.strip() for c in sample_vs_hf.limits_row(measured, 10e9).strip("|").split("|")]
    header = [c.strip() for c in sample_vs_hf.LIMITS_HEADER[0].strip("|").split("|")]
    row = dict(zip(header, cells, strict=True))
    assert row["bandwidth bound tok/s"] == "100.0" and row["matmul floor tok/s"] == "250.0"
    assert [row[f"{v} % of bound"] for v in ("attngpt", "compiled", "HF")] == ["50.0%", "80.0%", "25.0%"]
    assert [row[f"{v} % of floor"] for v in ("attngpt", "compiled", "HF")] == ["20.0%", "32.0%", "10.0%"]
    # F.linear floor: 1 / 0.005 s = 200 tok/s, of which attngpt's 50 is 25%
    assert row["F.linear floor tok/s"] == "200.0" and row["attngpt % of F.linear floor"] == "25.0%"
    cli_cells = [c.strip() for c in sample_vs_hf.cli_row(measured, 10e9).strip("|").split("|")]
    cli = dict(zip([c.strip() for c in sample_vs_hf.CLI_HEADER[0].strip("|").split("|")], cli_cells, strict=True))
    assert cli["sample.py tok/s"] == "40.0" and cli["sample.py / HF generate"] == "1.60x"
    # sample.py's matmul floor is the one timed between its processes: 1 / 0.002 s = 500 tok/s, of which 40 is 8%
    assert [cli["% of F.linear floor"], cli["% of matmul floor"], cli["% of bandwidth bound"]] == ["20.0%", "8.0%",
                                                                                                 "40.0%"]
    assert cli["% of matmul floor, paired"] == "9.5%"  # computed in measure, from each process and its floor


def test_bandwidth_of_a_small_buffer_is_a_positive_number():
    bandwidth = _limits.memory_bandwidth(torch.device("cpu"), n_bytes=1 << 20, reps=2)
    assert math.isfinite(bandwidth) and bandwidth > 0


def test_the_default_buffer_is_several_last_level_caches(tmp_path):
    for index, (level, size) in enumerate([(1, "32K"), (2, "1024K"), (3, "96M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert _limits.last_level_cache_bytes(tmp_path) == 96 * 2**20
    assert _limits.last_level_cache_bytes(tmp_path / "missing") is None
    assert _limits.bandwidth_buffer(torch.device("cpu"))[0] >= _limits.MIN_BANDWIDTH_BUFFER


def test_the_matmul_floor_runs_the_models_own_modules():
    model = GPT(ModelConfig(**LLAMA_LIKE)).eval()
    called = []
    for m in _limits.matmul_modules(model)[:-1]:
        m.module.register_forward_hook(lambda module, args, out, name=m.name: called.append((name, args[0].shape)))
    seconds = _limits.matmul_floor_seconds(model, rounds=1, min_round_seconds=0.0)
    assert math.isfinite(seconds) and seconds > 0
    widths = {m.name: m.in_features for m in _limits.matmul_modules(model)}
    assert {name for name, _ in called} == set(widths) - {"lm_head"}
    assert all(shape == (1, 1, widths[name]) for name, shape in called)
    assert "_head_columns" in model.__dict__  # the LM head went through GPT.logits, as a CPU decode runs it


def test_agreeing_prefix_counts_new_tokens_up_to_the_first_difference():
    a = torch.tensor([[7, 7, 1, 2, 3, 4]])
    assert sample_vs_hf.agreeing_prefix(a, a.clone(), 2) == 4
    assert sample_vs_hf.agreeing_prefix(a, torch.tensor([[7, 7, 1, 2, 9, 4]]), 2) == 2


def run_script(*args: str, results=None) -> subprocess.CompletedProcess:
    """The script on the small shape, 4 new tokens, 1 round, with `args`; `results`: where --save appends (a
    temporary RESULTS.md; without it, --no-save)."""
    argv = [str(SCRIPT), "--shapes", "small", "--new-tokens", "4", "--rounds", "1", *args]
    if results is None:
        argv.append("--no-save")
    return run_benchmark(SCRIPT, argv[1:], results, timeout=600)


def limits_rows(text: str, through_sample_py: bool = False) -> tuple[str, str]:
    """(the speed row, the limits row) of the small shape's 4 new tokens in printed or saved text (and a third,
    sample.py's own, with --through-sample-py)."""
    rows = [line for line in text.splitlines() if line.startswith("| small | 4 |")]
    assert len(rows) == (3 if through_sample_py else 2), text
    assert sample_vs_hf.LIMITS_HEADER[0] in text
    # each variant's percent of the bandwidth bound and of the matmul floor, and attngpt's of F.linear's floor
    assert rows[1].count("%") == 7
    if through_sample_py:
        assert sample_vs_hf.CLI_HEADER[0] in text and rows[2].count("%") == 4
    return rows[0], rows[1]


@pytest.mark.slow
def test_the_script_prints_the_limits_beside_the_speeds():
    done = run_script("--through-sample-py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Memory bandwidth" in done.stdout and "avx512_bf16" in done.stdout
    speed, _ = limits_rows(done.stdout, through_sample_py=True)
    assert speed.endswith("| yes |")  # float32: the same greedy tokens
    cli = [line for line in done.stdout.splitlines() if line.startswith("| small | 4 |")][2]
    cells = dict(zip([c.strip() for c in sample_vs_hf.CLI_HEADER[0].strip("|").split("|")],
                     [c.strip() for c in cli.strip("|").split("|")], strict=True))
    # one round: one process and the one floor after it, so the paired median is the plain one
    assert cells["% of matmul floor, paired"] == cells["% of matmul floor"]


@pytest.mark.slow
def test_a_bfloat16_run_saves_the_limits_with_the_cpu_flags(tmp_path):
    results = tmp_path / "RESULTS.md"
    done = run_script("--dtype", "bfloat16", results=results)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = results.read_text()
    assert "bfloat16 on cpu" in saved and "Memory bandwidth" in saved
    machine = next(line for line in saved.splitlines() if line.startswith("- Machine: "))
    assert all(flag in machine for flag in ("avx512_bf16", "amx_bf16", "amx_tile"))
    limits_rows(saved)

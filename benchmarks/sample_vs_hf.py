"""Sampling speed against Hugging Face `generate`, with identical weights: tokens/s at batch 1, greedy.

The transformers model is built from the attngpt one in memory (pretrained.hf.transformers_model.to_transformers:
GPT2LMHeadModel or LlamaForCausalLM), so both run the same weights and must produce the same greedy tokens
(checked, and printed). Variants, timed in interleaved rounds (each round runs every variant once, starting one
variant later each round), median over rounds:
  attngpt          model.generate.generate: prefill, then one eager step per token through the KV cache
  attngpt-compiled the same with compile=True: the one-token decode step compiled (on a CPU one graph over
                   the written cache prefix; on a GPU a CUDA graph over the static cache); its one-time
                   compile happens in the warm-up and is reported apart
  hf               transformers' generate(do_sample=False, use_cache=True) with its default dynamic cache
tok/s = new tokens / wall time of the whole call (prefill included), as a user waits for it.
Same greedy tokens: "yes", or how many new tokens agree before the first that differs. In bfloat16 the two
implementations round differently (other summation orders, other fusions), and random weights give near-tied
logits, so greedy tokens may part after a few steps there; float32 runs must agree.

The second table sets the speeds against the limits of one decode step, measured in the same run (benchmarks/
_limits.py), for the shape, dtype and device of the run:
  bytes/token      what one decode step reads: every matmul module's parameters and buffers as they are stored
                   (each block's qkv, out, MLP in and out, the LM head; at the run's dtype, or whatever a quantized
                   or prepacked replacement module holds), the norms and one embedding row, plus the KV cache at
                   the generation's mean context (2 x n_layer x n_kv_head x head_dim x context x cache element
                   size; context = prompt + new tokens / 2 slots). HF reads the same weights and cache.
  bandwidth bound  memory bandwidth / bytes per token. Bandwidth: the best of 10 timed streaming reads (a sum)
                   of a buffer of 4x the last-level cache (at least 256 MiB; 2 GiB on CUDA), on the run's
                   threads; measured once, before the first shape. At batch 1 each weight is used once per
                   token, so a decode step cannot beat this while its weights come from memory. It can exceed it
                   when they do not: the small shape's 2.3 MB of float32 weights stay in the last-level cache and
                   are read from there at several times DRAM's rate (gpt2 6 x 384 in bfloat16, 60 MB, is twice a
                   32 MiB L3). One thread draws less than the machine's all-core bandwidth: --threads matters.
  matmul floor     1 / the time of the model's own matmul modules alone at batch 1 (the same module objects,
                   so the same kernels, called back to back on a (1, 1, in_features) input of the model's dtype,
                   the LM head through GPT.logits as decode runs it; best of 5). What a decode step would take
                   with no attention, norms, activations, sampling or per-op overhead. A variant falls short of
                   it by all of those and by the prefill, which tok/s includes (short generations most); it can
                   exceed it only where its matmuls are not these modules' kernels: HF's GPT-2 multiplies by
                   Conv1D (x @ W, the weight stored in by out), compiled code may fuse or choose other kernels.
  % of bound / floor  a variant's tok/s over that limit, in percent.
  paired           (--through-sample-py) each sample.py process's tok/s over the floor timed right after it,
                   the median of those: drift between minutes moves both sides of a pair alike.
On a CPU the machine line's CPU flags (avx512_bf16, amx_bf16, amx_tile) say whether bfloat16 matmuls have
native instructions: without them a bfloat16 step may be compute-bound, far below its bandwidth bound.

Shapes (--shapes): gpt2 = GPT-2 architecture (learned positions, LayerNorm, GELU, biases, tied) and llama =
Llama architecture (RoPE, RMSNorm, SwiGLU, GQA 6/2, untied), both 6 layers x 384 wide, vocabulary 50304,
block 1024; gpt2-124m = GPT-2 small itself; gpt2-124m-narrow = its 12 layers, 12 heads and vocabulary at width
96 (a decode step of the same ops with 1/64 of the block weights); small = the default run's model
(configs/small.yaml: 3 layers x 128, GQA 4/2, block 256) over 65 characters, compared as a LlamaForCausalLM.

    python benchmarks/sample_vs_hf.py [--shapes gpt2,llama] [--new-tokens 128,992] [--prompt 32] [--rounds 3]
        [--threads 1] [--device cpu|cuda] [--dtype float32|bfloat16] [--no-save]
    python benchmarks/sample_vs_hf.py --shapes gpt2-124m --new-tokens 128 --threads 2 --rounds 3 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

import torch

import _limits
import _report
from common.device import resolve_device
from common.errors import ArgumentParser, UserError, user_errors_exit
from common.huge_pages import restart_in_huge_pages
from model import GPT, ModelConfig
from model.decode_attention import use_decode_attention
from model.generate import decode_cache_dtype, generate
from model.packed import pack_linears
from native.build import decode_attention_library
from pretrained.hf.transformers_model import to_transformers
from training.config import load_run_config

COMMON = dict(vocab_size=50304, block_size=1024, attn_impl="sdpa")
SHAPES = {
    "gpt2": ModelConfig(**COMMON, n_layer=6, n_head=6, d_model=384, pos="learned", norm="layernorm", mlp="gelu",
                        bias=True),
    "llama": ModelConfig(**COMMON, n_layer=6, n_head=6, n_kv_head=2, d_model=384, pos="rope", norm="rmsnorm",
                         mlp="swiglu", tie_embeddings=False),
    "gpt2-124m": ModelConfig(**COMMON, n_layer=12, n_head=12, d_model=768, pos="learned", norm="layernorm",
                             mlp="gelu", bias=True),
    # GPT-2 small's ops at 1/8 of its width: the same 12 layers, 12 heads and vocabulary, so a decode step runs the
    # same ops, but its block matmuls stream 1/64 of the bytes (head_dim 8): what a step costs besides its weights
    "gpt2-124m-narrow": ModelConfig(**COMMON, n_layer=12, n_head=12, d_model=96, pos="learned", norm="layernorm",
                                    mlp="gelu", bias=True),
    # the default run's model: configs/small.yaml's shape over tinyshakespeare's 65 characters
    "small": dataclasses.replace(load_run_config(_report.REPO / "configs" / "small.yaml", []).model, vocab_size=65),
}
VARIANTS = ("attngpt", "attngpt-compiled", "hf")


def build(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> tuple[GPT, torch.nn.Module]:
    torch.manual_seed(0)
    ours = GPT(config).eval()
    theirs = to_transformers(ours, attn_implementation="sdpa").eval()
    return ours.to(device=device, dtype=dtype), theirs.to(device=device, dtype=dtype)


def runner(name: str, ours: GPT, theirs: torch.nn.Module, prompt: torch.Tensor, n_new: int):
    """A no-argument function that runs one generation of variant `name` and returns its tokens (1, T0 + n_new)."""
    if name == "hf":
        mask = torch.ones_like(prompt)

        def run_hf() -> torch.Tensor:
            with torch.no_grad():
                return theirs.generate(prompt, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                                       do_sample=False, use_cache=True, pad_token_id=0)
        return run_hf
    compiled = name == "attngpt-compiled"
    return lambda: generate(ours, prompt, n_new, temperature=0.0, compile=compiled)


CLI_RATE = re.compile(r"\[(\d+) tokens x 1 in [0-9.]+s: ([0-9.]+) tokens/s")  # sample.py's speed line


def sample_py_rates(ours: GPT, prompt: torch.Tensor, n_new: int, runs: dict[str, list[str]], rounds: int,
                    after_each: Callable[[dict[str, list[float]]], object] = lambda rates: None
                    ) -> dict[str, list[float]]:
    """tokens/s of `python sample.py` as a user runs it on these weights (greedy, its own speed line), one
    process per run: `runs` names each run's own sample.py flags (--dtype, --quantize), and every round runs
    each once, in turn (one later each round), `after_each` called after each round with the rates so far. The
    model is saved to a temporary folder with a tokenizer of its vocabulary (GPT-2's BPE for 50304 tokens, else
    characters), the prompt the text of the prompt's ids; sample.py decodes on the model's device. Returns
    {run name: tokens/s of each round}."""
    from data.tokenizer import CharTokenizer, TiktokenTokenizer
    from pretrained.checkpoint import save_model
    vocab = ours.config.vocab_size
    tokenizer = TiktokenTokenizer("gpt2") if vocab >= 50257 else CharTokenizer("".join(chr(33 + i) for i in range(vocab)))
    text = tokenizer.decode([int(t) % min(vocab, 50257) for t in prompt[0].tolist()])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    # what each run's speed line must name: a run that is not what was asked measures nothing
    quantized = {name: flags[flags.index("--quantize") + 1] for name, flags in runs.items() if "--quantize" in flags}
    device = str(ours.tok_emb.weight.device)
    with tempfile.TemporaryDirectory() as folder:
        save_model(ours, folder, extra={"tokenizer": tokenizer.to_json()})
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                done = subprocess.run([sys.executable, str(_report.REPO / "sample.py"), "--ckpt", folder, "--prompt",
                                       text, "--temperature", "0", "--max-new-tokens", str(n_new), "--device", device,
                                       *runs[name]],
                                      capture_output=True, text=True, cwd=_report.REPO,
                                      env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
                found = CLI_RATE.search(done.stderr)
                if done.returncode != 0 or found is None:
                    raise UserError(f"sample.py failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
                speed_line = done.stderr[found.start():].split("\n", 1)[0]
                if name in quantized and f", --quantize {quantized[name]}," not in speed_line:
                    raise UserError(f"sample.py {' '.join(runs[name])} did not say it quantized: {speed_line}")
                rates[name].append(float(found.group(2)))
            after_each(rates)
    return rates


@dataclasses.dataclass
class Measured:
    """One shape and length of a run: its speeds and the limits they are set against."""
    shape: str
    n_new: int
    rate: dict[str, float]  # variant -> tokens/s, median over the rounds
    agreement: str  # "yes", or how many new greedy tokens agree with HF's before the first that differs
    compile_s: float  # the first compiled call (compile + generation)
    mean_context: float  # cache slots a decode step attends over, on average
    bytes_per_token: _limits.DecodeBytes  # what one decode step reads
    # seconds of one pass of the model's matmuls alone, on its own kernels (_limits.matmul_floor_seconds): the median
    # of one timing after each round, so that the fractions set a speed against the floor of the same spell of a
    # shared machine (both drifted by 20% between minutes on a 2-core cloud CPU)
    floor_s: float
    linear_floor_s: float  # the same with torch's F.linear on the weights as stored, before any packing
    pack_note: str | None  # what model.packed.pack_linears timed and chose
    cli_rate: float | None = None  # sample.py as a user runs it, median tokens/s (--through-sample-py)
    cli_floor_s: float | None = None  # the floor timed after each sample.py process, median
    # each sample.py process's tok/s against the floor timed right after it, median of those percents: drift between
    # minutes moves both sides of a pair alike, where the medians above may come from different minutes
    cli_paired_floor: float | None = None


def agreeing_prefix(a: torch.Tensor, b: torch.Tensor, prompt_tokens: int) -> int:
    """How many new tokens two generations (1, T0 + n) share before the first that differs."""
    differs = (a[0, prompt_tokens:] != b[0, prompt_tokens:]).nonzero()
    return int(differs[0]) if len(differs) else a.shape[1] - prompt_tokens


def measure(shape: str, n_new: int, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Measured:
    """Time the variants of one shape and length (interleaved rounds), and the limits of its decode step."""
    ours, theirs = build(SHAPES[shape], device, dtype)
    linear_floor_s = _limits.matmul_floor_seconds(ours)  # torch's F.linear on the weights as stored
    pack_note = None
    if device.type == "cpu":  # as sample.py does: the matmul weights prepared, attention by measurement
        pack_note = (f"{pack_linears(ours, rows_copy=True)}; "
                     f"{use_decode_attention(ours, decode_attention_library(), 1, args.prompt + n_new)}")
    prompt = torch.randint(0, SHAPES[shape].vocab_size, (1, args.prompt),
                           generator=torch.Generator().manual_seed(1)).to(device)
    runs = {name: runner(name, ours, theirs, prompt, n_new) for name in VARIANTS}
    compile_s, _ = _report.timed(runs["attngpt-compiled"], device)  # warm-up: compiles the decode step
    outputs = {name: run() for name, run in runs.items()}  # warm-up of every variant
    agree = min(agreeing_prefix(out, outputs["hf"], args.prompt) for out in outputs.values())
    agreement = "yes" if agree == n_new else f"NO: first {agree} of {n_new} agree"
    # the step's limits, measured here between the warm-ups and the rounds, on the same machine state
    mean_context = _limits.mean_decode_context(args.prompt, n_new)
    # the dtype eager generate() keeps its cache in (the model's, or float32 where the CPU attends faster so)
    cache_element_size = decode_cache_dtype(ours, 1, args.prompt + n_new).itemsize
    bytes_per_token = _limits.decode_bytes_per_token(ours, mean_context, cache_element_size)
    floors: list[float] = []
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            seconds[name].append(_report.timed(runs[name], device)[0])
        floors.append(_limits.matmul_floor_seconds(ours))
        print(f"  {shape} {n_new} new tokens, round {r + 1}: "
              + ", ".join(f"{n} {n_new / seconds[n][-1]:.1f} tok/s" for n in VARIANTS), flush=True)
    rate = {name: n_new / statistics.median(s) for name, s in seconds.items()}
    cli_rate = cli_floor_s = cli_paired = None
    if args.through_sample_py:
        cli_floors: list[float] = []
        rates = sample_py_rates(ours, prompt, n_new, {"cli": ["--dtype", str(dtype).removeprefix("torch.")]},
                                args.rounds, after_each=lambda _: cli_floors.append(_limits.matmul_floor_seconds(ours)))
        cli_rate = statistics.median(rates["cli"])
        cli_floor_s = statistics.median(cli_floors)
        cli_paired = statistics.median(100 * rate * floor for rate, floor in zip(rates["cli"], cli_floors, strict=True))
    return Measured(shape, n_new, rate, agreement, compile_s, mean_context, bytes_per_token, statistics.median(floors),
                    linear_floor_s, pack_note, cli_rate, cli_floor_s, cli_paired)


SPEED_HEADER = ["| shape | new tokens | attngpt tok/s | attngpt compiled tok/s | HF generate tok/s | attngpt / HF "
                "| compiled / HF | same greedy tokens |", "|---|---:|---:|---:|---:|---:|---:|---|"]
LIMITS_HEADER = ["| shape | new tokens | mean context | bytes/token: weights + KV cache | bandwidth bound tok/s "
                 "| F.linear floor tok/s | matmul floor tok/s | attngpt % of bound | compiled % of bound | HF % of bound "
                 "| attngpt % of F.linear floor | attngpt % of floor | compiled % of floor | HF % of floor |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]


def speed_row(m: Measured) -> str:
    rate = m.rate
    return (f"| {m.shape} | {m.n_new} | {rate['attngpt']:.1f} | {rate['attngpt-compiled']:.1f} | {rate['hf']:.1f} | "
            f"{rate['attngpt'] / rate['hf']:.2f}x | {rate['attngpt-compiled'] / rate['hf']:.2f}x | {m.agreement} |")


CLI_HEADER = ["| shape | new tokens | sample.py tok/s | sample.py / HF generate | % of F.linear floor | % of matmul floor "
              "| % of matmul floor, paired | % of bandwidth bound |", "|---|---:|---:|---:|---:|---:|---:|---:|"]


def cli_row(m: Measured, bandwidth: float) -> str:
    """sample.py as a user runs it, against HF generate of the same run and the limits."""
    total = m.bytes_per_token.total
    bound, floor = _limits.fractions_reached(m.cli_rate, bandwidth, total, m.cli_floor_s)
    linear = _limits.fractions_reached(m.cli_rate, bandwidth, total, m.linear_floor_s)[1]
    return (f"| {m.shape} | {m.n_new} | {m.cli_rate:.1f} | {m.cli_rate / m.rate['hf']:.2f}x | {linear:.1f}% | "
            f"{floor:.1f}% | {m.cli_paired_floor:.1f}% | {bound:.1f}% |")


def limits_row(m: Measured, bandwidth: float) -> str:
    """The limits of one shape and length, and the percent of each that every variant reached."""
    b = m.bytes_per_token
    reached = {name: _limits.fractions_reached(m.rate[name], bandwidth, b.total, m.floor_s) for name in VARIANTS}
    of_linear_floor = _limits.fractions_reached(m.rate["attngpt"], bandwidth, b.total, m.linear_floor_s)[1]
    weights_mb = (b.matmul_weights + b.other_weights) / 1e6
    return (f"| {m.shape} | {m.n_new} | {m.mean_context:g} | {b.total / 1e6:.3f} MB: {weights_mb:.3f} + "
            f"{b.kv_cache / 1e6:.3f} | {bandwidth / b.total:.1f} | {1 / m.linear_floor_s:.1f} | {1 / m.floor_s:.1f} | "
            + " | ".join(f"{reached[name][0]:.1f}%" for name in VARIANTS) + f" | {of_linear_floor:.1f}% | "
            + " | ".join(f"{reached[name][1]:.1f}%" for name in VARIANTS) + " |")


def main() -> None:
    parser = ArgumentParser(prog="sample_vs_hf", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="gpt2,llama", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--new-tokens", default="128,992", help="comma-separated generation lengths")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on a CPU (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--through-sample-py", action="store_true",
                        help="also run `python sample.py` on the same weights, --rounds processes, and report its own "
                             "tokens/s line (on --device: a fresh process, its first tokens included)")
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("sample_vs_hf"):
        shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
        if not shapes or any(s not in SHAPES for s in shapes):
            raise UserError(f"--shapes {args.shapes!r}: use names from {', '.join(SHAPES)}")
        try:
            lengths = [int(n) for n in args.new_tokens.split(",") if n.strip()]
        except ValueError:
            raise UserError(f"--new-tokens {args.new_tokens!r}: comma-separated integers, e.g. 128,992") from None
        block = min(SHAPES[s].block_size for s in shapes)
        if not lengths or any(n < 1 or args.prompt + n > block for n in lengths) or args.prompt < 1:
            raise UserError(f"--prompt and --new-tokens must be >= 1, with prompt + new tokens <= {block} "
                            f"(the block size of --shapes {args.shapes})")
        if args.rounds < 1 or args.threads < 1:
            raise UserError("--rounds and --threads must be >= 1")
        device = resolve_device(args.device, setting="--device ")
        dtype = getattr(torch, args.dtype)
        if device.type == "cpu":
            torch.set_num_threads(args.threads)
        import transformers

        machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()], gpu=device)
        print(machine_line, flush=True)
        buffer_bytes, buffer_why = _limits.bandwidth_buffer(device)
        threads = torch.get_num_threads()  # the bandwidth the run's threads can draw, not the machine's all-core one
        bandwidth = _limits.memory_bandwidth(device, buffer_bytes)
        bandwidth_note = (f"Memory bandwidth {bandwidth / 1e9:.1f} GB/s: a streaming read (sum) of "
                          f"{buffer_bytes / 2**20:g} MiB ({buffer_why}) on {device.type}"
                          + (f" with {threads} thread{'s' if threads > 1 else ''}" if device.type == "cpu" else "")
                          + ", best of 10, measured once at the start.")
        print(bandwidth_note, flush=True)
        measured = [measure(shape, n_new, args, device, dtype) for shape in shapes for n_new in lengths]
        speed = [*SPEED_HEADER, *(speed_row(m) for m in measured)]
        limits = [*LIMITS_HEADER, *(limits_row(m, bandwidth) for m in measured)]
        notes = [f"transformers {transformers.__version__}, attn_implementation sdpa, default dynamic cache; "
                 f"{args.dtype} on {device.type}; prompt {args.prompt} tokens; greedy; batch 1; "
                 f"{args.rounds} interleaved rounds, median; tok/s includes the prefill.",
                 "Matmul weights (model.packed.pack_linears, as sample.py decides): "
                 + "; ".join(f"{m.shape}/{m.n_new}: {m.pack_note}" for m in measured),
                 "First compiled call (compile + generation, excluded from the timing): "
                 + ", ".join(f"{m.shape}/{m.n_new}: {m.compile_s:.1f} s" for m in measured),
                 bandwidth_note,
                 "Limits (module docstring): bytes/token = every matmul weight, norm and embedding row as stored "
                 f"({args.dtype}) + the KV cache at the mean context; bandwidth bound = bandwidth / bytes per "
                 "token; F.linear floor = 1 / the time of torch's F.linear over the weights as stored, alone, at batch 1; "
                 "matmul floor = the same over the model's own matmul modules (on the kernel sample.py's "
                 "pack_linears chose; LM head as its decode runs it), best of 5, timed after each round (after each sample.py "
                 "process for sample.py's row) and the median taken; % = a variant's tok/s over the limit."]
        cli = [*CLI_HEADER, *(cli_row(m, bandwidth) for m in measured)] if any(
            m.cli_rate is not None for m in measured) else []
        if cli:
            notes.append("sample.py: `python sample.py --ckpt TMP --prompt TEXT --temperature 0 --max-new-tokens N "
                         f"--dtype {args.dtype} --device {device}` on the same weights, one process per round, its "
                         "own tokens/s line "
                         "(generation only, prefill included), median; % of matmul floor, paired: each "
                         "process's tok/s over the floor timed right after it, the median of those.")
        tables = ["", *speed, "", *limits, *([""] + cli if cli else [])]
        print("\n".join(["", *notes, *tables]))
        _report.save(args, "Sampling vs Hugging Face generate, identical weights", machine_line, "sample_vs_hf.py",
                     *[f"- {n}" for n in notes], *tables, "")


if __name__ == "__main__":
    restart_in_huge_pages("sample_vs_hf")  # as sample.py runs: both sides and the floors on the same pages
    main()

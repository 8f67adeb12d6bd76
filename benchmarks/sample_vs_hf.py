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

Shapes (--shapes): gpt2 = GPT-2 architecture (learned positions, LayerNorm, GELU, biases, tied) and llama =
Llama architecture (RoPE, RMSNorm, SwiGLU, GQA 6/2, untied), both 6 layers x 384 wide, vocabulary 50304,
block 1024; gpt2-124m = GPT-2 small itself; small = the default run's model (configs/small.yaml: 3 layers x
128, GQA 4/2, block 256) over 65 characters, compared as a LlamaForCausalLM.

    python benchmarks/sample_vs_hf.py [--shapes gpt2,llama] [--new-tokens 128,992] [--prompt 32] [--rounds 3]
        [--threads 1] [--device cpu|cuda] [--dtype float32|bfloat16] [--no-save]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

import _report
from common.device import resolve_device
from common.errors import ArgumentParser, UserError, user_errors_exit
from model import GPT, ModelConfig
from model.generate import generate
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


def measure(shape: str, n_new: int, args: argparse.Namespace, device: torch.device,
            dtype: torch.dtype) -> tuple[str, float]:
    """(the table row, compile seconds) of one shape and length."""
    ours, theirs = build(SHAPES[shape], device, dtype)
    prompt = torch.randint(0, SHAPES[shape].vocab_size, (1, args.prompt),
                           generator=torch.Generator().manual_seed(1)).to(device)
    runs = {name: runner(name, ours, theirs, prompt, n_new) for name in VARIANTS}
    compile_s, _ = _report.timed(runs["attngpt-compiled"], device)  # warm-up: compiles the decode step
    outputs = {name: run() for name, run in runs.items()}  # warm-up of every variant
    same = all(torch.equal(outputs["hf"], out) for out in outputs.values())
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            seconds[name].append(_report.timed(runs[name], device)[0])
        print(f"  {shape} {n_new} new tokens, round {r + 1}: "
              + ", ".join(f"{n} {n_new / seconds[n][-1]:.1f} tok/s" for n in VARIANTS), flush=True)
    rate = {name: n_new / statistics.median(s) for name, s in seconds.items()}
    row = (f"| {shape} | {n_new} | {rate['attngpt']:.1f} | {rate['attngpt-compiled']:.1f} | {rate['hf']:.1f} | "
           f"{rate['attngpt'] / rate['hf']:.2f}x | {rate['attngpt-compiled'] / rate['hf']:.2f}x | "
           f"{'yes' if same else 'NO'} |")
    return row, compile_s


def main() -> None:
    parser = ArgumentParser(prog="sample_vs_hf", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="gpt2,llama", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--new-tokens", default="128,992", help="comma-separated generation lengths")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on a CPU (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
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
        table = ["| shape | new tokens | attngpt tok/s | attngpt compiled tok/s | HF generate tok/s | attngpt / HF "
                 "| compiled / HF | same greedy tokens |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        compile_notes = []
        for shape in shapes:
            for n_new in lengths:
                row, compile_s = measure(shape, n_new, args, device, dtype)
                table.append(row)
                compile_notes.append(f"{shape}/{n_new}: {compile_s:.1f} s")
        notes = [f"transformers {transformers.__version__}, attn_implementation sdpa, default dynamic cache; "
                 f"{args.dtype} on {device.type}; prompt {args.prompt} tokens; greedy; batch 1; "
                 f"{args.rounds} interleaved rounds, median; tok/s includes the prefill.",
                 "First compiled call (compile + generation, excluded from the timing): " + ", ".join(compile_notes)]
        print("\n".join(["", *notes, "", *table]))
        _report.save(args, "Sampling vs Hugging Face generate, identical weights", machine_line, "sample_vs_hf.py",
                     *[f"- {n}" for n in notes], "", *table, "")


if __name__ == "__main__":
    main()

"""The model the token-by-token decode benchmarks run (decode_vs_floor.py, decode_paths.py), and the flags that choose
it: random weights of one of sample_vs_hf.py's SHAPES in --dtype on the CPU, batch 1, quantized (--quantize) or with
its matmul weights packed as sample.py leaves them (model.packed.pack_linears, timed), and a seeded prompt."""
from __future__ import annotations

import argparse

import torch

import _report
from common.errors import UserError
from native.build import decode_attention_library, int8_matvec_library
from model import GPT
from model.decode_attention import use_decode_attention
from model.packed import pack_linears
from model.quantize import QUANTIZE_MODES, quantize_int8
from sample_vs_hf import SHAPES


def add_flags(parser: argparse.ArgumentParser, new_tokens: int, new_tokens_help: str, rounds: int) -> None:
    """--shape, --dtype, --quantize, --new-tokens, --prompt, --rounds, --threads (defaults: new_tokens, rounds)."""
    parser.add_argument("--shape", default="gpt2-124m", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                        help="quantize the model first, as sample.py --quantize does (the LM head by measurement)")
    parser.add_argument("--new-tokens", type=int, default=new_tokens, help=new_tokens_help)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=rounds, help="generations (medians over them reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")


def check_flags(args: argparse.Namespace, least_new_tokens: int) -> None:
    """UserError for flags outside their ranges: at least `least_new_tokens` new tokens and one prompt token, within
    the shape's block size; at least one round and one thread."""
    block_size = SHAPES[args.shape].block_size
    if args.new_tokens < least_new_tokens or args.prompt < 1 or args.prompt + args.new_tokens > block_size:
        raise UserError(f"--new-tokens must be >= {least_new_tokens} and --prompt >= 1, with prompt + new tokens <= "
                        f"{block_size} (the block size of {args.shape})")
    if args.rounds < 1 or args.threads < 1:
        raise UserError("--rounds and --threads must be >= 1")


def start(args: argparse.Namespace, least_new_tokens: int) -> str:
    """Check the flags (check_flags), set the threads, print the machine line and return it."""
    check_flags(args, least_new_tokens)
    torch.set_num_threads(args.threads)
    machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()])
    print(machine_line, flush=True)
    return machine_line


def build(args: argparse.Namespace) -> tuple[GPT, str, torch.Tensor]:
    """(the model in eval mode, a line saying how its matmul weights run, the prompt (1, --prompt)), seeded."""
    config = SHAPES[args.shape]
    torch.manual_seed(0)
    model = GPT(config).eval().to(getattr(torch, args.dtype))
    quantized = ""
    if args.quantize:  # as sample.py quantizes: for int8 the kernel of single rows by measurement
        quantized = f"{quantize_int8(model, args.quantize, int8_kernel=int8_matvec_library())}; "
    weights = quantized + (pack_linears(model, rows_copy=True) or "matmul weights as they were (nothing to prepare)")
    weights += f"; {use_decode_attention(model, decode_attention_library(), 1, args.prompt + args.new_tokens)}"
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    return model, weights, prompt

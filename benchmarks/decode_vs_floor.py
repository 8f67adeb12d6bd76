"""A decode step against the matmul floor, token by token: how much of each step is not its matmuls.

model.generate.generate decodes random weights of one of sample_vs_hf.py's SHAPES in --dtype on the CPU, batch 1,
greedy, with the matmul weights as sample.py leaves them (model.packed.pack_linears, timed). After every drawn
token, inside on_token, one pass of the model's own matmul modules alone is timed (_limits.matmul_pass: each
block's four, then the LM head as decode runs it, on one token's input). So decode steps and floor passes
alternate one for one: a slow spell of a shared machine falls on both, and their ratio holds where absolute
speeds drift by 20-30% between minutes. A decode step is the time from one token to the next less the floor pass
between them (the prefill is not one); the first floor pass, a warm-up, is left out.

Per round (one generation): the median decode step, the median floor pass and their ratio (the share of a step
its matmuls alone would take); then the medians over the rounds.

Each round then generates once more with every matmul module swapped for a stand-in returning zeros of its output
shape (NoMatmul, timing only): what is left of a step is the rest of it, the norms, attention over the cache, the
cache writes, the sampling and every op's dispatch. The decode step less that rest is what the matmuls take inside
a step, set against the floor pass (the same matmuls back to back): above 1, the matmuls run slower between the
other ops than back to back, and the ops between them are not all that keeps a step from its floor.

    python benchmarks/decode_vs_floor.py [--shape gpt2-124m] [--dtype bfloat16] [--new-tokens 128] [--prompt 32]
        [--rounds 3] [--threads 2] [--no-save]
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

import _limits
import _report
from common.errors import ArgumentParser, UserError, user_errors_exit
from model import GPT
from model.generate import decode_cache_dtype, generate
from model.packed import pack_linears
from sample_vs_hf import SHAPES


def one_round(model: GPT, prompt: torch.Tensor, n_new: int) -> tuple[float, float]:
    """(median decode step, median floor pass), seconds, over one generation of n_new tokens after `prompt`."""
    floor_pass = _limits.matmul_pass(model)
    steps, floors = [], []
    last_end = None  # when the previous floor pass ended: the next decode step starts there

    def on_token(token: torch.Tensor) -> None:
        nonlocal last_end
        arrived = time.perf_counter()
        if last_end is not None:
            steps.append(arrived - last_end)
        floor_pass()  # on_token runs without grad, as the decode step does
        last_end = time.perf_counter()
        floors.append(last_end - arrived)

    generate(model, prompt, n_new, temperature=0.0, on_token=on_token)
    return statistics.median(steps), statistics.median(floors[1:])


class NoMatmul(torch.nn.Module):
    """Timing only: stands in for a matmul module of in_features -> out_features and returns zeros (..., out_features)
    in its input's dtype, made once per shape, so that a decode step runs everything but its matmuls."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._zeros: dict[tuple, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (*x.shape[:-1], x.dtype)
        if key not in self._zeros:
            self._zeros[key] = x.new_zeros(*x.shape[:-1], self.out_features)
        return self._zeros[key]


@contextlib.contextmanager
def matmuls_left_out(model: GPT):
    """Every matmul module of `model` (GPT.matmul_slots, the LM head included) replaced by a NoMatmul for the
    duration, then put back."""
    kept = [(parent, attr, getattr(parent, attr)) for _, parent, attr in model.matmul_slots()]
    try:
        for parent, attr, module in kept:
            setattr(parent, attr, NoMatmul(module.in_features, module.out_features))
        yield
    finally:
        for parent, attr, module in kept:
            setattr(parent, attr, module)


def rest_of_step(model: GPT, prompt: torch.Tensor, n_new: int) -> float:
    """The median decode step, seconds, of one generation of n_new tokens with the matmuls left out
    (matmuls_left_out): token to token, the prefill not one of them."""
    arrivals = []
    with matmuls_left_out(model):
        generate(model, prompt, n_new, temperature=0.0, on_token=lambda token: arrivals.append(time.perf_counter()))
    return statistics.median(b - a for a, b in zip(arrivals, arrivals[1:]))


def main() -> None:
    parser = ArgumentParser(prog="decode_vs_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="gpt2-124m", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=3, help="generations (medians over them reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("decode_vs_floor"):
        config = SHAPES[args.shape]
        if args.new_tokens < 3 or args.prompt < 1 or args.prompt + args.new_tokens > config.block_size:
            raise UserError(f"--new-tokens must be >= 3 and --prompt >= 1, with prompt + new tokens <= "
                            f"{config.block_size} (the block size of {args.shape})")
        if args.rounds < 1 or args.threads < 1:
            raise UserError("--rounds and --threads must be >= 1")
        torch.set_num_threads(args.threads)
        dtype = getattr(torch, args.dtype)
        machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()])
        print(machine_line, flush=True)
        torch.manual_seed(0)
        model = GPT(config).eval().to(dtype)
        packing = pack_linears(model) or "matmul weights left to F.linear (no oneDNN)"
        prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
        cache = decode_cache_dtype(model, 1, args.prompt + args.new_tokens)
        rows = []
        for r in range(args.rounds):
            step_s, floor_s = one_round(model, prompt, args.new_tokens)
            rest_s = rest_of_step(model, prompt, args.new_tokens)
            rows.append((step_s, floor_s, rest_s))
            print(f"  round {r + 1}: decode step {step_s * 1e3:.2f} ms, floor pass {floor_s * 1e3:.2f} ms, "
                  f"ratio {floor_s / step_s:.3f}; without its matmuls {rest_s * 1e3:.2f} ms", flush=True)

        def cells(step_s: float, floor_s: float, rest_s: float, ratio: float, bold: str = "") -> str:
            # the matmuls inside a step: the step less the rest of it, against the same matmuls back to back
            return (f"{step_s * 1e3:.2f} | {floor_s * 1e3:.2f} | {bold}{ratio:.3f}{bold} | {rest_s * 1e3:.2f} | "
                    f"{(step_s - rest_s) * 1e3:.2f} | {(step_s - rest_s) / floor_s:.2f}")
        medians = [statistics.median(x) for x in zip(*rows)]
        lines = [f"- {args.shape} in {args.dtype}, batch 1, greedy, prompt {args.prompt}, {args.new_tokens} new "
                 f"tokens, KV cache in {str(cache).removeprefix('torch.')}; {packing}.",
                 "- decode step = token to token less the floor pass between them; floor pass = the model's matmul "
                 "modules alone on one token (_limits.matmul_pass), timed after every token; rest of a step = a "
                 "decode step of the same generation with every matmul module returning zeros (NoMatmul); "
                 "matmuls in a step = decode step - rest; medians per round.",
                 "", "| round | decode step ms | floor pass ms | floor / step | rest of a step ms | matmuls in a step "
                 "ms | in a step / floor |", "|---:|---:|---:|---:|---:|---:|---:|",
                 *(f"| {i + 1} | {cells(s, f, rest, f / s)} |" for i, (s, f, rest) in enumerate(rows)),
                 f"| median | {cells(*medians, statistics.median(f / s for s, f, _ in rows), bold='**')} |"]
        print("\n".join(lines))
        _report.save(args, "A decode step against the matmul floor, token by token", machine_line,
                     "decode_vs_floor.py", *lines)


if __name__ == "__main__":
    main()

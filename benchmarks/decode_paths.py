"""The flat decode step (model/decode.py) against the modules' forward, token by token in one generation.

The two compute the same logits bit for bit, so one greedy generation can take them in turn: even decode steps
through EagerDecodeStep (what generate runs on a CPU), odd ones through the modules (model(token, input_pos=...)),
each step timed on its own. A slow spell of a shared machine falls on both alike, where separate runs drift by
10-30% from minute to minute. Per round (one generation of --new-tokens steps after a --prompt-token prefill): the
median step of each path; then the medians over the rounds and their ratio. Before any timing, one step from the
same cache contents is run both ways and its logits compared: the script stops if they differ.

Random weights of one of sample_vs_hf.py's SHAPES in --dtype on the CPU, batch 1, the matmul weights as sample.py
leaves them (model.packed.pack_linears, timed), or --quantize'd first as sample.py does; the KV cache in the dtype
generate picks (model.generate.decode_cache_dtype).

    python benchmarks/decode_paths.py [--shape gpt2-124m] [--dtype bfloat16] [--quantize int8] [--new-tokens 240]
        [--prompt 32] [--rounds 5] [--threads 2] [--no-save]
"""
from __future__ import annotations

import statistics
import time

import torch

import _decode_model
import _report
from common.errors import ArgumentParser, user_errors_exit
from common.huge_pages import restart_in_huge_pages
from model import GPT
from model.decode import EagerDecodeStep
from model.generate import decode_cache_dtype


@torch.inference_mode()
def one_round(model: GPT, prompt: torch.Tensor, n_steps: int) -> tuple[float, float]:
    """(median flat step, median module step), seconds, over one greedy generation of n_steps decode steps after
    `prompt` (B = 1), the two paths taking turns."""
    n_prompt = prompt.shape[1]
    max_len = n_prompt + n_steps
    model.setup_kv_cache(1, max_len, dtype=decode_cache_dtype(model, 1, max_len))
    try:
        flat = EagerDecodeStep(model)
        logits = model(prompt, input_pos=torch.arange(n_prompt), last_only=True)[0]
        seconds: dict[str, list[float]] = {"flat": [], "modules": []}
        for i in range(n_steps):
            token = logits[:, -1].max(dim=-1).indices[:, None]  # (1, 1), greedy
            pos = n_prompt + i
            path = "flat" if i % 2 == 0 else "modules"
            start = time.perf_counter()
            logits = flat(token, pos) if path == "flat" else model(token, input_pos=torch.tensor([pos]))[0]
            seconds[path].append(time.perf_counter() - start)
    finally:
        model.clear_kv_cache()
    return statistics.median(seconds["flat"]), statistics.median(seconds["modules"])


def same_logits(model: GPT, prompt: torch.Tensor) -> bool:
    """Whether one decode step after `prompt` gives the same logits on both paths (from the same cache)."""
    n_prompt = prompt.shape[1]
    out = []
    with torch.inference_mode():
        for path in ("flat", "modules"):
            model.setup_kv_cache(1, n_prompt + 1, dtype=decode_cache_dtype(model, 1, n_prompt + 1))
            try:
                model(prompt[:, :-1], input_pos=torch.arange(n_prompt - 1))
                token, pos = prompt[:, -1:], n_prompt - 1
                out.append(EagerDecodeStep(model)(token, pos) if path == "flat"
                           else model(token, input_pos=torch.tensor([pos]))[0])
            finally:
                model.clear_kv_cache()
    return torch.equal(out[0], out[1])


def main() -> None:
    parser = ArgumentParser(prog="decode_paths", description=__doc__.splitlines()[0])
    _decode_model.add_flags(parser, new_tokens=240, new_tokens_help="decode steps a round, the paths in turn",
                            rounds=5)
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("decode_paths"):
        machine_line = _decode_model.start(args, least_new_tokens=2)
        model, weights, prompt = _decode_model.build(args)
        if not same_logits(model, prompt):
            raise RuntimeError("the flat step and the modules gave different logits: nothing to compare")
        rows = []
        for r in range(args.rounds):
            flat_s, modules_s = one_round(model, prompt, args.new_tokens)
            rows.append((flat_s, modules_s))
            print(f"  round {r + 1}: flat {flat_s * 1e3:.3f} ms, modules {modules_s * 1e3:.3f} ms a step, "
                  f"{modules_s / flat_s:.3f}x", flush=True)
        flat_med, modules_med = (statistics.median(x) for x in zip(*rows))
        quantize_flag = f", --quantize {args.quantize}" if args.quantize else ""
        lines = [f"- {args.shape} in {args.dtype}{quantize_flag}, batch 1, greedy, prompt {args.prompt}, "
                 f"{args.new_tokens} decode steps a round, the two paths in turn; {weights}.",
                 "- flat = model.decode.EagerDecodeStep; modules = model(token, input_pos=...); the same logits bit "
                 "for bit (checked); per round the median step of each, then medians over the rounds.",
                 "", "| round | flat ms/step | modules ms/step | modules / flat |", "|---:|---:|---:|---:|",
                 *(f"| {i + 1} | {f * 1e3:.3f} | {m * 1e3:.3f} | {m / f:.3f} |" for i, (f, m) in enumerate(rows)),
                 f"| median | {flat_med * 1e3:.3f} | {modules_med * 1e3:.3f} | **{modules_med / flat_med:.3f}** |"]
        print("\n".join(lines))
        _report.save(args, "The flat decode step against the modules, token by token", machine_line,
                     "decode_paths.py", *lines)


if __name__ == "__main__":
    restart_in_huge_pages("decode_paths")  # as sample.py runs
    main()

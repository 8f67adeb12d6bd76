"""Per-head ablation (insight.ablation.ablation_dloss) at GPT-2 small's shape, against the naive way.

Why: ablation_dloss removes each of the 144 heads of a 12 x 12 model in turn and measures the loss; done
naively that is 144 full forward passes, each ending in the 50257-column LM head over every position.
ablation_dloss re-runs only the layers from the ablated one on (the residual stream below it is unchanged)
and ablates a layer's heads side by side in one batch. This times it, and the naive way in the same run:
one full forward pass per head (GPT.forward with a HeadPatch on the head's layer), for --naive-heads heads
spread over the layers (per-head cost does not depend on the layer), scaled to all heads. The two must
agree on those heads' delta loss (checked to 1e-5, printed). Random weights (GPT-2 initialisation), float32,
batch 1, random tokens.

    python benchmarks/ablation_speed.py [--tokens 256] [--threads 2] [--mode zero] [--attn-impl manual]
                                        [--heads-per-pass N] [--naive-heads 24] [--bf16] [--rounds 1] [--no-save]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import _report
from common.errors import ArgumentParser, UserError, user_errors_exit
from insight.ablation import ablation_dloss
from model import GPT, ModelConfig
from model.gpt import HeadPatch


def gpt2_small(block_size: int, attn_impl: str) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50257, block_size=block_size, n_layer=12, n_head=12, d_model=768,
                         bias=True, attn_impl=attn_impl)
    return GPT(config).eval()


@torch.no_grad()
def naive_dloss(model: GPT, idx: torch.Tensor, heads: list[tuple[int, int]], mode: str) -> dict[tuple[int, int], float]:
    """delta loss of each (layer, head) by one full forward pass with that head patched."""
    n_head = model.config.n_head
    inputs, targets = idx[:, :-1], idx[:, 1:]
    intact = float(model(inputs, targets)[1])
    means = {}
    if mode == "mean":
        found = {}
        hooks = [block.attn.out_proj.register_forward_pre_hook(
            lambda m, a, layer=layer: found.__setitem__(layer, a[0])) for layer, block in enumerate(model.blocks)]
        model(idx)  # ablation_dloss averages over all T positions of idx
        for hook in hooks:
            hook.remove()
        means = {layer: y.view(*y.shape[:2], n_head, -1).transpose(1, 2).mean(dim=(0, 2), keepdim=True)
                 for layer, y in found.items()}
    out = {}
    for layer, head in heads:
        keep = torch.ones(1, n_head, dtype=torch.bool)
        keep[0, head] = False
        attn = model.blocks[layer].attn
        attn.head_patch = HeadPatch(keep, means.get(layer))
        try:
            out[layer, head] = float(model(inputs, targets)[1]) - intact
        finally:
            attn.head_patch = None
    return out


def main() -> None:
    parser = ArgumentParser(prog="ablation_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="sequence length (block_size)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--attn-impl", choices=("manual", "sdpa"), default="manual")
    parser.add_argument("--heads-per-pass", type=int, default=None,
                        help="ablation_dloss's heads_per_pass (default: all of a layer's heads)")
    parser.add_argument("--naive-heads", type=int, default=24,
                        help="heads timed the naive way, spread over the layers, scaled to all 144 (0: skip)")
    parser.add_argument("--bf16", action="store_true",
                        help="also time ablation_dloss on a bfloat16 copy of the model, and its largest deviation "
                             "from the float32 result")
    parser.add_argument("--rounds", type=int, default=1, help="timed calls of ablation_dloss (median reported)")
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("ablation_speed"):
        if args.tokens < 2 or args.threads < 1 or args.rounds < 1 or not 0 <= args.naive_heads <= 144:
            raise UserError("--tokens must be >= 2, --threads and --rounds >= 1, --naive-heads in 0..144")
        torch.set_num_threads(args.threads)
        run(args)


def run(args: argparse.Namespace) -> None:
    machine = _report.machine(torch_threads=True)  # with the load average before the run
    model = gpt2_small(args.tokens, args.attn_impl)
    idx = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    n_layer, n_head = model.config.n_layer, model.config.n_head
    with torch.no_grad():
        model(idx)  # warm-up: first-call dispatch, allocator
    calls = [_report.timed(lambda: ablation_dloss(model, idx, args.mode, heads_per_pass=args.heads_per_pass))
             for _ in range(args.rounds)]
    fast, dloss = statistics.median(seconds for seconds, _ in calls), calls[-1][1]
    rows = ["| method | heads timed | seconds (measured) | seconds for all 144 heads | vs naive |",
            "|---|---:|---:|---:|---:|"]
    naive_all = None
    agreement = ""
    if args.naive_heads:
        # spread over layers and heads: layer k % n_layer, head (k * 5) % n_head
        heads = [(k % n_layer, (k * 5) % n_head) for k in range(args.naive_heads)]
        naive_s, naive = _report.timed(lambda: naive_dloss(model, idx, heads, args.mode))
        naive_all = naive_s * (n_layer * n_head) / len(heads)
        worst = max(abs(naive[h] - dloss[h]) for h in heads)
        agreement = f"largest |delta loss difference| over the naive heads: {worst:.2e} nats"
        rows.append(f"| naive: full forward per head | {len(heads)} | {naive_s:.1f} | {naive_all:.1f} | 1.00x |")
    ratio = f"{naive_all / fast:.2f}x" if naive_all else "-"
    rows.append(f"| ablation_dloss (from the ablated layer, heads batched) | 144 | {fast:.1f} | {fast:.1f} | {ratio} |")
    if args.bf16:
        half = gpt2_small(args.tokens, args.attn_impl).to(torch.bfloat16)
        bf16_s, dloss_bf16 = _report.timed(lambda: ablation_dloss(half, idx, args.mode,
                                                                  heads_per_pass=args.heads_per_pass))
        ratio_bf16 = f"{naive_all / bf16_s:.2f}x" if naive_all else "-"
        deviation = np.abs(dloss_bf16 - dloss).max()
        rows.append(f"| the same, model in bfloat16 (largest deviation from float32: {deviation:.2e} nats) | 144 | "
                    f"{bf16_s:.1f} | {bf16_s:.1f} | {ratio_bf16} |")
    print("\n".join(rows))
    if agreement:
        print(agreement)
    load_after = " ".join(_report.load_average().split()[-3:])
    print(f"delta loss range: {np.min(dloss):.4f} .. {np.max(dloss):.4f} nats; {machine}; "
          f"load average after the run {load_after}")
    _report.save(args, "Head ablation at GPT-2 small's shape", f"{machine}; {_report.cpu_bf16_support()}",
                 "ablation_speed.py",
                 f"- 12 layers x 12 heads, d_model 768, vocab 50257, {args.tokens} tokens, batch 1, random weights, "
                 f"float32, attn_impl {args.attn_impl}, mode {args.mode}; ablation_dloss median of {args.rounds} "
                 f"call(s) after a warm-up; the naive row times {args.naive_heads} heads and scales to 144.",
                 f"- Load average after the run: {load_after}" + (f"; {agreement}" if agreement else ""), "", *rows)


if __name__ == "__main__":
    main()

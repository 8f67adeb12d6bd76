"""One AdamW step, three implementations: fused kernel, multi-tensor (foreach), and the per-parameter loop.

Why: a small model's training step on a CPU is bound by per-op overhead, and the optimizer step is one
of its fixed costs. training/optim.py builds AdamW with the fused kernel where the device has one (CUDA,
and CPU since torch 2.4) and falls back to foreach; this measures what that choice buys, on the
parameters of two attngpt models (the groups training.optim.build_optimizers makes: weight decay on
2-D weights only). Gradients are random and fixed; each timing is the median over --rounds rounds of
--steps steps, the implementations interleaved round by round.

    python benchmarks/optimizer_step.py [--steps 100] [--rounds 5] [--threads N] [--no-save]
"""
from __future__ import annotations

import argparse

import torch

import _report
from common.errors import ArgumentParser, UserError, user_errors_exit
from model import GPT, ModelConfig

# (name, ModelConfig): a 4 x 128 model with GQA (once small.yaml's shape) and nanoGPT's shakespeare-char GPU shape
SHAPES = (
    ("4 x 128, GQA 4/2 (ModelConfig defaults: GELU, LayerNorm, learned positions)",
     ModelConfig(vocab_size=65, block_size=128, n_layer=4, n_head=4, n_kv_head=2, d_model=128)),
    ("6 x 384, MHA 6",
     ModelConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, d_model=384)),
)
IMPLEMENTATIONS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}


def optimizers_for(model: GPT) -> dict[str, torch.optim.AdamW]:
    """One AdamW per implementation, each over its own copy of the model's parameters and fixed gradients."""
    out = {}
    for name, kwargs in IMPLEMENTATIONS.items():
        params = [p.detach().clone().requires_grad_() for p in model.parameters()]
        gen = torch.Generator().manual_seed(0)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        out[name] = torch.optim.AdamW(groups, lr=1e-3, **kwargs)
    return out


def main() -> None:
    parser = ArgumentParser(prog="optimizer_step", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median is reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("optimizer_step"):
        if args.steps < 1 or args.rounds < 1:
            raise UserError("--steps and --rounds must be >= 1")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        run(args)


def run(args: argparse.Namespace) -> None:
    rows = ["| model | parameters | tensors | implementation | ms/step (median) | vs for-loop |", "|---|---:|---:|---|---:|---:|"]
    for label, cfg in SHAPES:
        torch.manual_seed(0)
        model = GPT(cfg)
        steps = {name: opt.step for name, opt in optimizers_for(model).items()}
        median = _report.interleaved(steps, args.rounds, args.steps, warmup=5)  # warm-up: state, first-call dispatch
        for name in steps:
            rows.append(f"| {label} | {model.num_params():,} | {len(list(model.parameters()))} | {name} | "
                        f"{1e3 * median[name]:.2f} | {median['for-loop'] / median[name]:.1f}x |")
    print("\n".join(rows))
    _report.save(args, "AdamW step: fused vs foreach vs for-loop", _report.machine(torch_threads=True),
                 "optimizer_step.py", f"- One `optimizer.step()` over the model's parameters (two groups, decay on "
                 f"2-D weights), fixed random gradients; median over {args.rounds} interleaved rounds of {args.steps} "
                 "steps.", "", *rows)


if __name__ == "__main__":
    main()

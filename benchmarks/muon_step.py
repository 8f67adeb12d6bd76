"""Muon's cost on a CPU: the optimizer step alone, three ways, and whole training steps with AdamW vs Muon.

Why: Muon orthogonalises every matrix's update with five Newton-Schulz steps (matmuls), a fixed cost per
step that AdamW does not have; at small.yaml's 4,096 tokens a step that cost decides whether Muon's better
loss per step is also better loss per second. Measured on the model of a config (default configs/small.yaml):
- optimizer step over the blocks' matrices, gradients random and fixed: training/muon.py (all matrices of one
  shape in one batched iteration, float32); the same one matrix at a time; torch.optim.Muon where this torch
  has it (torch >= 2.9: iterates in bfloat16 always, and orthogonalises fused q|k|v whole);
- a whole training step (forward, backward, clip, optimizer step) with the config's AdamW and with Muon, on
  one fixed batch, the model compiled when --compile.
Each timing is the median over --rounds rounds, the candidates interleaved round by round.

    python benchmarks/muon_step.py [CONFIG] [--steps 20] [--rounds 5] [--compile] [--no-save]
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

import _report
from common.errors import ArgumentParser, UserError, user_errors_exit
from model import GPT
from training.config import load_run_config
from training.muon import orthogonalize_parts
from training.optim import build_optimizers
from training.runtime import Runtime
from training.step import accumulate_gradients, apply_gradients


def optimizer_steps(model: GPT, cfg) -> dict[str, Callable[[], None]]:
    """name -> one optimizer step over the model's Muon matrices (fixed random gradients)."""
    muon = build_optimizers(model, cfg.train).optimizers[0]
    gen = torch.Generator().manual_seed(0)
    for group in muon.param_groups:
        for p in group["params"]:
            p.grad = torch.randn(p.shape, generator=gen)
    groups = [(g["splits"], p) for g in muon.param_groups for p in g["params"]]

    def one_at_a_time() -> None:
        with torch.no_grad():
            for splits, p in groups:
                p.add_(orthogonalize_parts([p.grad], [splits], 5, torch.float32)[0], alpha=-1e-6)

    steps = {"training/muon.py (batched by shape, float32)": muon.step,
             "the same, one matrix at a time": one_at_a_time}
    if hasattr(torch.optim, "Muon"):
        steps["torch.optim.Muon (bfloat16 iteration)"] = torch.optim.Muon(
            [p for _, p in groups], lr=cfg.train.muon_lr).step
    return steps


def training_steps(cfg, compile_model: bool) -> dict[str, Callable[[], None]]:
    """'adamw' / 'muon' -> one training step of a fresh copy of the config's model on one fixed batch."""
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=None)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.model.block_size), generator=gen)
    out = {}
    for name in ("adamw", "muon"):
        cfg.train.optimizer = name
        torch.manual_seed(0)
        model = GPT(cfg.model)
        optimizers = build_optimizers(model, cfg.train)
        runner = torch.compile(model) if compile_model else model
        one_batch = dataclasses.replace(cfg.train, grad_accum=1)  # one micro-batch a step, whatever the config says

        def step(runner=runner, model=model, optimizers=optimizers) -> None:
            loss, norm = accumulate_gradients(runner, model, lambda: (x, x), rt, one_batch, None, optimizers)
            loss.item(), norm.item()
            apply_gradients(optimizers)
        out[name] = step
    return out


def timed(candidates: dict[str, Callable[[], None]], steps: int, rounds: int) -> dict[str, float]:
    """name -> median ms per call over `rounds` interleaved rounds of `steps` calls (after 2 warm-up calls)."""
    return {name: 1e3 * s for name, s in _report.interleaved(candidates, rounds, steps, warmup=2).items()}


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default="configs/small.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="compile the model for the training steps")
    _report.save_flags(parser)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        raise UserError("--steps and --rounds must be >= 1")
    cfg = load_run_config(args.config, [])
    if "vocab_size" not in cfg.model_set and cfg.data.tokenizer == "char":  # a run takes it from the tokenizer
        cfg.model = dataclasses.replace(cfg.model, vocab_size=65)  # tinyshakespeare's characters
    shape = (f"{cfg.model.n_layer} x {cfg.model.d_model}, {cfg.model.n_head}/{cfg.model.n_kv_head} heads, "
             f"{cfg.model.mlp}, vocab {cfg.model.vocab_size}, batch {cfg.train.batch_size} x block "
             f"{cfg.model.block_size}")
    opt_ms = timed(optimizer_steps(GPT(cfg.model), cfg), args.steps, args.rounds)
    train_ms = timed(training_steps(cfg, args.compile), max(1, args.steps // 4), args.rounds)
    table = ["| what | ms median | vs training/muon.py |", "|---|---:|---:|"]
    base = next(iter(opt_ms.values()))
    table += [f"| optimizer step: {name} | {ms:.1f} | {ms / base:.2f}x |" for name, ms in opt_ms.items()]
    table += ["", "| training step (forward, backward, clip, optimizer) | ms median | vs AdamW |", "|---|---:|---:|"]
    table += [f"| {name}{' (compiled model)' if args.compile else ''} | {ms:.1f} | "
              f"{ms / train_ms['adamw']:.2f}x |" for name, ms in train_ms.items()]
    print(f"model: {shape}")
    print("\n".join(table))
    _report.save(args, "Muon's cost per step, cpu",
                 _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()]), "muon_step.py",
                 f"- Model: {args.config}: {shape}. Optimizer step over the blocks' matrices with fixed random "
                 f"gradients ({args.steps} steps a round); training steps on one fixed batch "
                 f"({max(1, args.steps // 4)} a round); {args.rounds} interleaved rounds, median.", "", *table)

if __name__ == "__main__":
    with user_errors_exit("muon_step.py"):
        main()

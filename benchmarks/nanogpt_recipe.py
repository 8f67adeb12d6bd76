"""nanoGPT's CPU recipe, run end to end on this machine: how good a val loss it reaches, and how long it takes.

The wall-clock of this run is the budget `quality_vs_time.py --vs-nanogpt` gives attngpt's small.yaml: "the
same minutes on the same machine". It trains benchmarks/nanogpt_reference.py's model the way nanoGPT's
train.py does with its README's CPU command line (config/train_shakespeare_char.py, --device=cpu
--compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
--n_embd=128 --dropout=0.0, here with --max_iters=N --lr_decay_iters=N, default N = 6000):
  - batches: uniform random offsets into the memmapped train.bin / val.bin (torch.randint, like its get_batch);
  - an eval of 20 batches per split at every 250th iteration, iteration 0 included (its estimate_loss);
  - a checkpoint (model + optimizer, torch.save) whenever val improves, after iteration 0;
  - lr from its get_lr; the loss read back (.item()) every iteration (log_interval=1).
The data is attngpt's char-level tinyshakespeare (the same characters, vocabulary and 90/10 split as
nanoGPT's data/shakespeare_char/prepare.py).

    python benchmarks/nanogpt_recipe.py [--iters 6000] [--threads N] [--no-save]
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import _report
from common.errors import ArgumentParser, user_errors_exit
from nanogpt_reference import CPU_RECIPE, NANOGPT_CPU, NanoGPT, nanogpt_lr, train_step

SEED = 1337


@dataclass
class RecipeResult:
    iters: int
    seconds: float  # wall-clock of the loop, evals and checkpoints included
    evals: list[tuple[int, float, float, float]] = field(default_factory=list)  # (iter, seconds, train, val)

    @property
    def final_val(self) -> float:
        return self.evals[-1][3]


def prepared_bins() -> tuple[Path, Path, np.dtype]:
    """tinyshakespeare, char-level, prepared by attngpt's data pipeline (reused when already prepared)."""
    from data.prepare import prepare_data
    from training.config import load_run_config
    prepared = prepare_data(load_run_config(_report.REPO / "configs" / "small.yaml").data, quiet=True)
    (train_bin,), (val_bin,) = prepared.split_paths("train"), prepared.split_paths("val")  # one shard each
    return train_bin, val_bin, prepared.dtype


def run_recipe(iters: int = 6000) -> RecipeResult:
    train_bin, val_bin, dtype = prepared_bins()
    shape, r = NANOGPT_CPU, CPU_RECIPE
    torch.manual_seed(SEED)
    model = NanoGPT(shape)
    optimizer = model.configure_optimizer(r["lr"], r["weight_decay"], (r["beta1"], r["beta2"]))

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(train_bin if split == "train" else val_bin, dtype=dtype, mode="r")
        ix = torch.randint(len(data) - shape.block_size, (shape.batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + shape.block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + shape.block_size].astype(np.int64)) for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split in ("train", "val"):
            out[split] = sum(model(*get_batch(split))[1].item() for _ in range(r["eval_iters"])) / r["eval_iters"]
        model.train()
        return out

    result = RecipeResult(iters=iters, seconds=0.0)
    best_val = float("inf")
    with tempfile.TemporaryDirectory(prefix="nanogpt-recipe-") as ckpt_dir:
        t0 = time.perf_counter()
        for it in range(iters + 1):  # nanoGPT runs iterations 0..max_iters and evaluates the last one
            for group in optimizer.param_groups:
                group["lr"] = nanogpt_lr(it, iters, r["lr"], r["min_lr"], r["warmup_iters"])
            if it % r["eval_interval"] == 0 or it == iters:
                losses = estimate_loss()
                if losses["val"] < best_val and it > 0:
                    best_val = losses["val"]
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": it},
                               Path(ckpt_dir) / "ckpt.pt")
                elapsed = time.perf_counter() - t0
                result.evals.append((it, elapsed, losses["train"], losses["val"]))
                print(f"nanoGPT recipe: iter {it}, {elapsed:.1f} s, train {losses['train']:.4f}, val "
                      f"{losses['val']:.4f}", flush=True)
            if it == iters:
                break
            train_step(model, optimizer, *get_batch("train"), r["grad_clip"])
        result.seconds = time.perf_counter() - t0
    return result


def recipe_table(result: RecipeResult) -> list[str]:
    table = ["| iter | seconds | train loss | val loss |", "|---:|---:|---:|---:|"]
    table += [f"| {it} | {s:.1f} | {tr:.4f} | {va:.4f} |" for it, s, tr, va in result.evals]
    return table


def main() -> None:
    parser = ArgumentParser(prog="nanogpt_recipe", description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=6000, help="max_iters = lr_decay_iters (default 6000)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default torch's)")
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("nanogpt_recipe"):
        if args.iters < 1:
            parser.error(f"--iters {args.iters}: must be >= 1")
        if args.threads:
            torch.set_num_threads(args.threads)
        machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()])
        result = run_recipe(args.iters)
        table = recipe_table(result)
        summary = f"{args.iters} iterations in {result.seconds:.1f} s, final val loss {result.final_val:.4f}"
        print("\n".join(["", machine_line, summary, "", *table]))
        _report.save(args, "nanoGPT's CPU recipe on this machine", machine_line, "nanogpt_recipe.py",
                     f"- {summary}; seconds = wall-clock from the first iteration, evals and checkpoints included.",
                     "", *table, "")


if __name__ == "__main__":
    main()

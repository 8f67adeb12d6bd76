"""Train a GPT: `python train.py configs/small.yaml [section.key=value ...]`.

A thin command line over training.trainer.train; every bad input becomes one line and exit status 2.
Under `torchrun --nproc_per_node=N train.py CONFIG` each process runs this same script (DDP).
"""
from __future__ import annotations

import os
import sys

from common.errors import ArgumentParser, user_errors_exit
from model.checkpoint import CheckpointError

EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143, "requested": 0}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="train.py", description="Train a GPT from a YAML config.",
        epilog="example: python train.py configs/small.yaml train.max_iters=200 wandb.mode=disabled")
    parser.add_argument("config", help="path to a YAML config, e.g. configs/small.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: section.key=value")
    args = parser.parse_args(argv)

    with user_errors_exit("train.py", also=(CheckpointError,)):
        from training.config import config_to_yaml, load_run_config
        from training.trainer import train

        cfg = load_run_config(args.config, args.overrides)
        is_main = int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 prints
        if is_main:
            print(f"# config {args.config} {' '.join(args.overrides)}\n{config_to_yaml(cfg)}", end="", flush=True)
        result = train(cfg)
        if result.interrupted:
            return EXIT_INTERRUPTED[result.interrupted]
        if is_main:
            print(f"done: {result.step} steps, best val loss {result.best_val:.4f}; checkpoints in "
                  f"{result.out_dir}/best and {result.out_dir}/latest. Sample with: "
                  f"python sample.py --ckpt {result.out_dir} --prompt \"...\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())

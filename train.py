"""Train a GPT: `python train.py configs/small.yaml [section.key=value ...]`.

A thin command line over training.trainer.train; every bad input becomes one line and exit status 2.
Under `torchrun --nproc_per_node=N train.py CONFIG` each process runs this same script (DDP).
"""
from __future__ import annotations

import os
import shlex
import signal
import sys

from common import console
from common.errors import ArgumentParser, exit_now, out_of_memory, user_errors_exit

EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143, "requested": 0}


class Terminated(BaseException):
    """SIGTERM outside the training loop (which handles it itself: finish the step, save, exit 143).
    A BaseException, like KeyboardInterrupt: no `except Exception` on the way (wandb's start-up) swallows it."""


def _raise_terminated(signum, frame):
    raise Terminated


def main(argv: list[str] | None = None, exit_at_once_when_interrupted: bool = False) -> int:
    """The command line. exit_at_once_when_interrupted (the script itself): Ctrl-C or SIGTERM before the
    training loop ends the process at once (os._exit), skipping exit hooks: wandb's would otherwise wait for
    a server that does not answer (wandb.init_timeout, 90 s) before the process could exit. Nothing of ours
    needs them there: no checkpoint is being written outside the loop."""
    # a closed or full stdout or stderr does not stop a run: out_dir keeps what it prints
    console.install("train.py", goes_on="the run goes on; its out_dir keeps config.yaml and metrics.jsonl")
    parser = ArgumentParser(prog="train.py", description="Train a GPT from a YAML config.", epilog="example: "
                            "python train.py configs/small.yaml train.max_iters=200 wandb.mode=disabled")
    parser.add_argument("config", help="path to a YAML config, e.g. configs/small.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: section.key=value")
    args = parser.parse_args(argv)

    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        previous = None
    try:
        return _main(args)
    except Terminated:
        print("train.py: terminated (SIGTERM) outside the training loop; checkpoints on disk are intact",
              file=sys.stderr)
        return _interrupted(EXIT_INTERRUPTED["SIGTERM"], exit_at_once_when_interrupted)
    except SystemExit as e:  # user_errors_exit: Ctrl-C outside the loop (its line printed) -> 130
        if e.code == EXIT_INTERRUPTED["SIGINT"]:
            return _interrupted(e.code, exit_at_once_when_interrupted)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupted(code: int, at_once: bool) -> int:
    if at_once:
        exit_now(code)
    return code


def _main(args) -> int:
    with user_errors_exit("train.py"):  # the config first: a typo is reported before torch's seconds of import
        from training.config import config_to_yaml, load_run_config
        cfg = load_run_config(args.config, args.overrides)
    from pretrained.checkpoint import CheckpointError  # imports torch: after the SIGTERM handler is in place

    with user_errors_exit("train.py", also=(CheckpointError,)):
        from training.runtime import distributed_env
        from training.trainer import train

        is_main = distributed_env().rank == 0  # under torchrun only rank 0 prints
        if is_main:
            print(f"# config {args.config} {' '.join(args.overrides)}\n{config_to_yaml(cfg)}", end="", flush=True)
        try:
            result = train(cfg)
        except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            error = out_of_memory(e, cfg.device, "lower train.batch_size (raise train.grad_accum to keep the batch), "
                                                 "model.block_size or the model's size")
            if error is None:
                raise
            raise error from None
        if result.interrupted:
            return EXIT_INTERRUPTED[result.interrupted]
        if is_main:
            share = 100 * result.attn_seconds / max(result.train_seconds, 1e-9)
            print(f"done: {result.step} steps in {result.train_seconds:.0f}s (attention snapshots {result.attn_seconds:.1f}s, "
                  f"{share:.1f}%), best val loss {result.best_val:.4f}; checkpoints in "
                  f"{result.out_dir}/best and {result.out_dir}/latest. Sample with: "
                  f"python sample.py --ckpt {shlex.quote(str(result.out_dir))} --prompt \"...\"")
    return 0


if __name__ == "__main__":
    code = main(exit_at_once_when_interrupted=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # a torchrun process has finished and left its process group (training/runtime.teardown_runtime); it ends
        # here without the interpreter's finalization, where objects still holding the group (DDP's reducer)
        # would destroy gloo's threads unjoined: under load a finished run once aborted there ("terminate
        # called without an active exception", SIGABRT) and torchrun reported the whole run failed
        exit_now(code)
    sys.exit(code)

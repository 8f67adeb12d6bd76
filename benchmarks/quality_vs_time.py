"""Quality against wall-clock: val loss at each eval of a training run, with the seconds it took to get there.

Runs `training.trainer.train` on a config (default configs/small.yaml, ~5 minutes on a 2-core CPU) with any
`key=value` overrides, then reads `out_dir/metrics.jsonl`: one row per eval (step, time_s, tokens seen,
train loss, val loss). time_s is the trainer's own clock in every metrics row: seconds since train() began
(before the data is loaded or prepared, the model built and `auto` times dtype and compile) to the row's
writing (for an eval row: the eval's end), with that preparation, timing and compile, the earlier evals,
checkpoint saves and attention snapshots included: the wall-clock a user waits for that val loss.

    python benchmarks/quality_vs_time.py [CONFIG] [key=value ...] [--out-dir DIR] [--keep] [--threads N]
        [--metrics FILE] [--note TEXT] [--no-save] [--vs-nanogpt [ITERS]]

--vs-nanogpt first runs nanoGPT's CPU recipe for ITERS iterations (default 6000; benchmarks/nanogpt_recipe.py)
on this machine, then trains CONFIG, and reports CONFIG's val loss at its last eval within the wall-clock the
recipe took, against the recipe's own final val loss: equal minutes, equal machine.

By default W&B is off (wandb.mode=disabled) and the run goes to a fresh temporary out_dir, deleted at the
end (--keep keeps it); --out-dir DIR trains into DIR instead (it must not hold a checkpoint yet:
train.resume=never, so the clock starts at step 0). Overrides on the command line come last and win.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import _report
from common.errors import ArgumentParser, UserError, user_errors_exit

DEFAULT_CONFIG = "configs/small.yaml"
BENCH_OVERRIDES = ["wandb.mode=disabled", "train.resume=never"]  # before the user's, which win


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"no metrics file at '{path}': give the metrics.jsonl of a training run's out_dir")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise UserError(f"'{path}' line {n} is not JSON") from None
    return rows


def eval_table(rows: list[dict], tokens_per_step: int | None) -> tuple[list[str], list[str]]:
    """(markdown table, notes) with one row per eval row (those holding "val/loss")."""
    notes = []
    times = [r.get("time_s") for r in rows if "time_s" in r]
    if not times:
        notes.append("metrics.jsonl has no time_s field (a trainer from before it was added): time column n/a.")
    elif any(b < a for a, b in zip(times, times[1:])):
        notes.append("time_s goes backwards in this file: it holds more than one run or a resumed run (each "
                     "process restarts the clock); times are per process.")
    last_train: dict[int, float] = {}  # step -> train/loss of that step's progress row
    last_rate: float | None = None
    table = ["| step | time_s | tokens seen | train loss (that step) | train loss (eval batches) | val loss | "
             "tokens/s (last logged) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        step = r.get("step")
        if "train/loss" in r:
            last_train[step] = r["train/loss"]
        if "tokens_per_s" in r:
            last_rate = r["tokens_per_s"]
        if "val/loss" in r:
            time_s = f"{r['time_s']:.1f}" if "time_s" in r else "n/a"
            tokens = f"{step * tokens_per_step:,}" if tokens_per_step else "n/a"
            train_step = f"{last_train[step]:.4f}" if step in last_train else "-"
            train_eval = f"{r['train/eval_loss']:.4f}" if "train/eval_loss" in r else "-"
            rate = f"{last_rate:,.0f}" if last_rate is not None else "-"
            table.append(f"| {step} | {time_s} | {tokens} | {train_step} | {train_eval} | {r['val/loss']:.4f} | {rate} |")
    if len(table) == 2:
        notes.append("no eval rows (val/loss) in metrics.jsonl: the run stopped before its first eval.")
    return table, notes


def config_line(cfg) -> str:
    m, t = cfg.model, cfg.train
    return (f"Config: model {m.n_layer} layers, {m.n_head} heads ({m.n_kv_head} kv), d_model {m.d_model}, block "
            f"{m.block_size}, {m.mlp}/{m.norm}/{m.pos}, attn_impl {m.attn_impl}; device {cfg.device}, dtype "
            f"{cfg.dtype}; batch {t.batch_size} x grad_accum {t.grad_accum}, max_iters {t.max_iters}, lr {t.lr}, "
            f"optimizer {t.optimizer}, compile {t.compile}; eval every {cfg.eval.interval} steps on "
            f"{cfg.eval.iters} batches; attention snapshots {'on' if cfg.attn.enabled else 'off'}; "
            f"data {cfg.data.source}/{cfg.data.tokenizer}.")


def main() -> None:
    parser = ArgumentParser(prog="quality_vs_time", description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help=f"YAML config (default {DEFAULT_CONFIG})")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, section.key=value (as train.py takes)")
    parser.add_argument("--out-dir", default=None, help="train into this folder, kept (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary out_dir (its path is printed)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default torch's)")
    parser.add_argument("--metrics", default=None, metavar="FILE",
                        help="read this metrics.jsonl instead of training (config and overrides then only "
                             "describe it; its out_dir's config.yaml is used when present)")
    parser.add_argument("--note", action="append", default=[], help="a line to add to the saved section "
                                                                    "(e.g. how the metrics were made); repeatable")
    _report.save_flags(parser)
    parser.add_argument("--vs-nanogpt", type=int, nargs="?", const=6000, default=None, metavar="ITERS",
                        help="first time nanoGPT's CPU recipe (ITERS iterations, default 6000) and compare at "
                             "its wall-clock")
    args, unknown = parser.parse_known_args()
    if "=" in args.config and not Path(args.config).is_file():  # overrides without a config: the default config
        args.overrides.insert(0, args.config)
        args.config = DEFAULT_CONFIG
    args.overrides += [u for u in unknown if "=" in u and not u.startswith("-")]  # overrides after --flags
    stray = [u for u in unknown if u not in args.overrides]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")

    with user_errors_exit("quality_vs_time"):
        import torch

        from training.config import load_run_config

        if args.threads:
            torch.set_num_threads(args.threads)
        machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support()])
        temp_dir = None
        summary = []
        recipe = None
        if args.vs_nanogpt is not None:
            from nanogpt_recipe import recipe_table, run_recipe
            print(f"nanoGPT's CPU recipe, {args.vs_nanogpt} iterations, for the time budget", flush=True)
            recipe = run_recipe(args.vs_nanogpt)
        if args.metrics:
            metrics = Path(args.metrics)
            saved = metrics.parent / "config.yaml"
            cfg = load_run_config(saved if saved.is_file() else args.config, [] if saved.is_file() else args.overrides)
            summary.append(f"Read from `{metrics}` (no training in this command); config "
                           f"{'from ' + str(saved) if saved.is_file() else args.config}.")
        else:
            from training.trainer import train

            if args.out_dir is None:
                temp_dir = tempfile.mkdtemp(prefix="attngpt-quality-")
            cfg = load_run_config(args.config, [*BENCH_OVERRIDES, f"out_dir={args.out_dir or temp_dir}",
                                                *args.overrides])
            print(f"training {args.config} into {cfg.out_dir}", flush=True)
            t0 = time.perf_counter()
            try:
                result = train(cfg)
            except BaseException:
                if temp_dir is not None and not args.keep:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                raise
            wall = time.perf_counter() - t0
            metrics = Path(cfg.out_dir) / "metrics.jsonl"
            summary.append(f"train(): {result.step} steps, {result.train_seconds:.1f} s in its loop (of which "
                           f"{result.attn_seconds:.1f} s attention snapshots), {wall:.1f} s in all with data "
                           f"loading and setup; best val loss {result.best_val:.4f}"
                           + (f"; stopped early ({result.interrupted})" if result.interrupted else "") + ".")

        rows = read_metrics(metrics)
        tokens_per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.block_size
        table, notes = eval_table(rows, tokens_per_step)
        if temp_dir is not None:
            if args.keep:
                notes.append(f"out_dir kept: {temp_dir}")
            else:
                shutil.rmtree(temp_dir, ignore_errors=True)
        lines = [config_line(cfg), *summary, *notes, *args.note]
        extra_tables: list[str] = []
        if recipe is not None:
            lines.append(versus_line(rows, recipe))
            extra_tables = ["", f"nanoGPT's CPU recipe ({recipe.iters} iterations, benchmarks/nanogpt_recipe.py):",
                            "", *recipe_table(recipe)]
        print("\n".join(["", machine_line, *lines, "", *table, *extra_tables]))
        title = f"{args.config}" if not args.metrics else f"{metrics} ({cfg.device}, {cfg.dtype})"
        _report.save(args, f"Val loss vs wall-clock, {title}", machine_line, "quality_vs_time.py",
                     *[f"- {line}" for line in lines],
                     "- time_s: the trainer's clock in metrics.jsonl, seconds from train()'s start (before the "
                     "data's loading, the model's build, auto's timing and compile) to the eval's end, all of those, "
                     "the earlier evals, checkpoint saves and attention snapshots included. tokens "
                     f"seen = step x {tokens_per_step:,} tokens/step.", "", *table, *extra_tables, "")


def versus_line(rows: list[dict], recipe) -> str:
    """The config's val loss at its last eval within the recipe's wall-clock, against the recipe's final one."""
    within = [r for r in rows if "val/loss" in r and r.get("time_s", float("inf")) <= recipe.seconds]
    ours = (f"val loss {within[-1]['val/loss']:.4f} at {within[-1]['time_s']:.1f} s (step {within[-1]['step']})"
            if within else "no eval within that time")
    return (f"Equal wall-clock: nanoGPT's CPU recipe took {recipe.seconds:.1f} s for {recipe.iters} iterations, "
            f"final val loss {recipe.final_val:.4f}; this config within {recipe.seconds:.1f} s: {ours}.")


if __name__ == "__main__":
    main()

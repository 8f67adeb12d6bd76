"""Planted bugs: each one alone, in a scratch copy of the tree, and the tests that must catch it (a developer
tool, never run by CI; docs/testing.md holds its last results).

Each entry replaces one exact piece of code with a realistic slip (a flag ignored, a boundary moved by one,
a default changed) and names the tests that must now fail. The script copies the tracked files to a scratch
folder, plants one bug at a time there, runs those tests with `-x`, and prints a Markdown table: "caught"
when they failed, "MISSED" when they all passed. The working tree is never modified.

    python tools/planted_bugs.py                 # all of them (~5 minutes on 2 cores)
    python tools/planted_bugs.py --only seed     # the ones whose id contains "seed"
    python tools/planted_bugs.py --only eval- gamma-    # ... "eval-" or "gamma-"
    python tools/planted_bugs.py --check         # runs nothing: each plant's code is in its file, once, and
                                                 # the test files it names exist (after code or tests move)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.helpers, when run as a script


@dataclass
class Plant:
    id: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


SAMPLE = "tests/cli/test_sample_settings.py"
TRAIN = "tests/training/test_config_settings.py"
STEP = "tests/training/test_step.py"
MODEL = "tests/model/test_config_settings.py"
ATTN = "tests/training/test_attn_monitor_settings.py"
EVAL_DDP = "tests/training/test_parallel_ddp_in_process.py"
RESUME_DATA = "tests/training/test_resume_data.py"
CHOICE = "tests/pretrained/test_checkpoint_choice.py"
MAPS = "tests/insight/test_stats_edges.py"
WINDOW = "tests/insight/test_explorer_window.py"
SAMPLE_OUT = "tests/cli/test_sample_output.py"

PLANTS = [
    Plant("sample-seed", "sample.py ignores --seed", "sample.py",
          "manual_seed(args.seed)", "manual_seed(0)", (SAMPLE,)),
    Plant("sample-temperature", "sample.py ignores --temperature", "sample.py",
          "temperature=args.temperature,", "temperature=0.8,", (SAMPLE,)),
    Plant("sample-top-k", "sample.py ignores --top-k", "sample.py", "top_k=args.top_k,", "top_k=None,", (SAMPLE,)),
    Plant("sample-top-p", "sample.py ignores --top-p", "sample.py", "top_p=args.top_p,", "top_p=None,", (SAMPLE,)),
    Plant("sample-no-kv-cache", "sample.py ignores --no-kv-cache", "sample.py",
          "use_kv_cache=not args.no_kv_cache,", "use_kv_cache=True,", (SAMPLE,)),
    Plant("lr-cosine-offset", "the cosine decay offset by one step", "training/optim.py",
          "progress = (step - self.warmup_iters)", "progress = (step + 1 - self.warmup_iters)", (TRAIN,)),
    Plant("lr-warmup-boundary", "warmup `<=` for `<`", "training/optim.py",
          "if step < self.warmup_iters:", "if step <= self.warmup_iters:", (TRAIN,)),
    Plant("lr-decay-iters", "train.lr_decay_iters ignored", "training/optim.py",
          "decay_iters = cfg.lr_decay_iters or cfg.max_iters", "decay_iters = cfg.max_iters", (TRAIN,)),
    Plant("lr-min-default", "another default min_lr (lr/20 for lr/10)", "training/optim.py",
          "else cfg.lr / 10)", "else cfg.lr / 20)", (TRAIN,)),
    Plant("best-worse", "best/ overwritten by a worse eval", "training/trainer.py",
          'improved = losses["val"] < result.best_val', "improved = True", (TRAIN,)),
    Plant("eval-split", "the val loss computed on the train split", "training/evaluate.py",
          "prepared.split_files(split)", 'prepared.split_files("train")', (TRAIN,)),
    Plant("grad-clip", "train.grad_clip ignored", "training/step.py",
          "grad_clip or math.inf)", "math.inf)", (STEP,)),
    Plant("dropout-eval", "attention dropout active in eval mode", "model/gpt.py",
          "dropout_p = self.dropout_p if self.training else 0.0", "dropout_p = self.dropout_p", (MODEL,)),
    Plant("best-val-resume", "best_val reset on resume", "training/trainer.py",
          'result.step, result.best_val = state["step"], state["best_val"]', 'result.step = state["step"]', (TRAIN,)),
    Plant("seed", "the seed ignored", "training/trainer.py",
          "seed_everything(cfg.seed)", "seed_everything(1337)", (STEP,)),
    Plant("probe-split", "the attention probe taken from the train split", "training/attn_monitor.py",
          'prepared.stream("val").read(0, block_size)', 'prepared.stream("train").read(0, block_size)', (ATTN,)),
    Plant("stats-resume", "stats.csv rows duplicated after a resume", "training/attn_monitor.py",
          "        self._drop_rows_after(start_step)\n", "", (ATTN,)),
    Plant("residual-init", "the residual projections' init not scaled", "model/gpt.py",
          'std = residual_std if name.endswith(("out_proj", "fc_out")) else 0.02', "std = 0.02", (MODEL,)),
    Plant("bpe-padding", "BPE vocabularies not padded to a multiple of 64", "training/plan.py",
          "size = vocab if vocab < 1024 else 64 * math.ceil(vocab / 64)", "size = vocab", (TRAIN,)),
    Plant("generate-train-mode", "generate() does not restore train mode", "model/generate.py",
          "        model.train(was_training)\n    with torch.inference_mode(False):",
          "        model.eval()\n    with torch.inference_mode(False):", (MODEL,)),
    Plant("rope-theta", "model.rope_theta ignored", "model/gpt.py",
          "config.rope_theta), persistent=False)", "10000.0), persistent=False)", (MODEL,)),
    Plant("swap-recovery", "the recovery of an interrupted checkpoint swap skipped", "training/checkpoint.py",
          "        os.replace(old, final)  # the newest complete checkpoint", "        pass  # (planted)",
          ("tests/training/test_run_dir_lock.py",)),
    Plant("autotune-gain", "auto keeps a candidate that is not faster", "training/autotune.py",
          "MIN_GAIN = 1.05", "MIN_GAIN = 0.5", ("tests/training/test_autotune.py",)),
    Plant("autotune-compile-gain", "auto compiles when the compiled step is faster by any margin",
          "training/autotune.py", "comparisons.append(compare(pair, best))",
          "comparisons.append(dataclasses.replace(compare(pair, best), kept=min(pair, key=pair.get)))",
          ("tests/training/test_autotune.py",)),
    Plant("autotune-rounds", "auto decides on rounds that disagree", "training/autotune.py",
          "ROUND_NOISE = 1.25", "ROUND_NOISE = 1e9", ("tests/training/test_autotune_rounds.py",)),
    Plant("finite-check", "a pass outside training returns what overflowed", "model/gpt.py",
          "            self._check_finite(out, idx, input_pos, kv_len)", "            pass  # (planted)",
          ("tests/model/test_gpt_finite.py",)),
    Plant("crop-offset", "a cropped position table keeps rows 1..block_size, not 0..block_size-1",
          "pretrained/load.py",
          "positions[:block_size].clone()", "positions[1:block_size + 1].clone()", ("tests/pretrained/test_load_shorter_context.py",)),
    Plant("crop-ignored", "train.init_from trains at the source's block_size whatever model.block_size says",
          "training/plan.py", "block_size=cfg.model_set.get(CROPPABLE, source.config.block_size))",
          "block_size=source.config.block_size)", ("tests/pretrained/test_load_shorter_context.py",)),
    Plant("eval-ddp-no-mean", "under DDP each process logs its own eval loss, not the mean over processes",
          "training/evaluate.py", "if rt.ddp:", "if False:", (EVAL_DDP,)),
    Plant("eval-ddp-count", "under DDP the eval loss divided by the process count twice", "training/evaluate.py",
          "out[split] = total.item() / cfg.eval.iters", "out[split] = total.item() / (cfg.eval.iters * rt.world_size)",
          (EVAL_DDP,)),
    Plant("resume-fingerprint", "a resume compares token counts but not the data's fingerprint", "training/resume.py",
          'for k in ("train_tokens", "val_tokens", "fingerprint"))', 'for k in ("train_tokens", "val_tokens"))',
          (RESUME_DATA,)),
    Plant("fingerprint-tail", "the data fingerprint skips the end of each split", "training/resume.py",
          "        digest.update(np.ascontiguousarray(stream.read(total - n, total)).tobytes())\n", "",
          (RESUME_DATA,)),
    Plant("reader-latest-first", "a run's out_dir is read through latest/ before best/", "pretrained/checkpoint.py",
          "for name in (BEST, LATEST):", "for name in (LATEST, BEST):", (CHOICE,)),
    Plant("gamma-zero-distances", "the decay fit counts distances without weight", "insight/stats.py",
          "ok = np.isfinite(m) & (m > 0)", "ok = np.isfinite(m) & (m >= 0)", (MAPS,)),
    Plant("gamma-unmasked-x", "the decay fit's x deviations include unusable distances", "insight/stats.py",
          "dx = np.where(ok, x - x_mean[:, None], 0.0)", "dx = x - x_mean[:, None]", (MAPS,)),
    Plant("explorer-last-window", "a long input's last window of maps embedded, not its first", "insight/explorer/__init__.py",
          "weights[item, :, :W, :W]", "weights[item, :, -W:, -W:]", (WINDOW,)),
    Plant("explorer-labels-cut", "a long input's labels cut from its end", "insight/explorer/__init__.py",
          "token_label(t, max_len=16) for t in tokens[:W]]",
          "token_label(t, max_len=16) for t in tokens[-W:]]", (WINDOW,)),
    Plant("heatmap-diagonal", "the heatmaps mask the diagonal with the future", "insight/heatmap.py",
          "future = np.triu(np.ones((n, n), dtype=bool), k=1)", "future = np.triu(np.ones((n, n), dtype=bool), k=0)",
          (MAPS,)),
    Plant("heatmap-no-mask", "the heatmaps show the future", "insight/heatmap.py",
          "np.ma.masked_array(panel, mask=future)", "np.ma.masked_array(panel)", (MAPS,)),
    Plant("sample-eot-kept", "each sample printed with its end-of-text token", "sample.py",
          "generated = generated[:generated.index(tokenizer.eot)]",
          "generated = generated[:generated.index(tokenizer.eot) + 1]", (SAMPLE_OUT,)),
    Plant("sample-eot-in-prompt", "each sample cut at the first end-of-text of the whole row, prompt included",
          "sample.py", "generated = generated[:generated.index(tokenizer.eot)]",
          "generated = row[:row.index(tokenizer.eot)][len(ids):]", (SAMPLE_OUT,)),
    Plant("sample-first-row", "every sample cut where the first one ended", "sample.py",
          "            if tokenizer.eot is not None and tokenizer.eot in generated:\n"
          "                generated = generated[:generated.index(tokenizer.eot)]",
          "            first = out[0, len(ids):].tolist()\n"
          "            if tokenizer.eot is not None and tokenizer.eot in first:\n"
          "                generated = generated[:first.index(tokenizer.eot)]", (SAMPLE_OUT,)),
    Plant("sample-stream-eot", "a single sample streams past its end-of-text", "sample.py",
          "        if token == self.tokenizer.eot:\n            self.stopped = True\n            return\n", "",
          (SAMPLE_OUT,)),
]


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    from tests.helpers import SHAKESPEARE_SOURCES  # the corpus the tests train on (they skip without it)
    corpus = next((p for p in SHAKESPEARE_SOURCES if p.is_file()), None)
    if corpus is not None:
        target = dest / "data" / "cache" / "tinyshakespeare" / "input.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(corpus, target)


def run_plant(tree: Path, plant: Plant) -> tuple[str, float]:
    path = tree / plant.file
    original = path.read_text(encoding="utf-8")
    if original.count(plant.old) != 1:
        return f"not planted: the code to replace occurs {original.count(plant.old)} times", 0.0
    path.write_text(original.replace(plant.old, plant.new), encoding="utf-8")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                               *plant.tests], cwd=tree, capture_output=True, text=True,
                              env={**os.environ, "WANDB_MODE": "disabled", "PYTHONDONTWRITEBYTECODE": "1"})
    finally:
        path.write_text(original, encoding="utf-8")
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in proc.stdout.splitlines()
              if line.startswith(("FAILED", "ERROR"))]
    seconds = time.perf_counter() - t0
    if proc.returncode == 0 and " skipped" in proc.stdout.splitlines()[-1]:
        return "not run: tests skipped (" + proc.stdout.splitlines()[-1].strip() + ")", seconds
    return (f"caught by `{failed[0].removeprefix('tests/')}`" if proc.returncode != 0 and failed
            else "MISSED" if proc.returncode == 0 else f"error (pytest exit {proc.returncode})"), seconds


def check(plants: list[Plant]) -> int:
    """What can go stale without a run: the code a plant replaces (it must occur exactly once in its file, in this
    tree) and the test files it names. One line per problem; 0 when there is none."""
    problems = []
    for plant in plants:
        path = REPO / plant.file
        count = path.read_text(encoding="utf-8").count(plant.old) if path.is_file() else None
        if count is None:
            problems.append(f"{plant.id}: {plant.file} does not exist")
        elif count != 1:
            problems.append(f"{plant.id}: the code to replace occurs {count} times in {plant.file}")
        problems += [f"{plant.id}: test file {test} does not exist" for test in plant.tests
                     if not (REPO / test.split("::")[0]).is_file()]
    print("\n".join(problems) or f"{len(plants)} plants: every file holds its code once, every test file exists")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[""], metavar="TEXT",
                        help="plant only the bugs whose id contains one of these")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: check that each plant's code and test files are where it says")
    args = parser.parse_args()
    plants = [p for p in PLANTS if any(text in p.id for text in args.only)]
    if args.check:
        return check(plants)
    rows, missed = [], 0
    with tempfile.TemporaryDirectory(prefix="planted-") as scratch:
        tree = Path(scratch)
        copy_tree(tree)
        for plant in plants:
            verdict, seconds = run_plant(tree, plant)
            missed += not verdict.startswith("caught")
            rows.append(f"| `{plant.id}` | {plant.what} | `{plant.file}` | {verdict} |")
            print(rows[-1], f"({seconds:.0f} s)", file=sys.stderr, flush=True)
    print("| bug | what | where | result |\n|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{len(plants) - missed} of {len(plants)} caught.")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

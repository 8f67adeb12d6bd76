"""GPT-2 BPE tokenization throughput of the prepare pipeline: 1 process vs datasets.map(num_proc=N).

Why: `data.num_proc` only pays off when encoding outweighs starting worker processes; this measures
where that is on a given machine. It times `data.pipeline.write_bins` — the same scan, datasets.map
encode and bin copy that `python -m data.prepare` runs — on tinyshakespeare (optionally repeated to
make a bigger corpus), plus tiktoken alone on the whole text as a baseline.

    python benchmarks/tokenize_throughput.py [--repeat 1] [--trials 3] [--num-proc 1 2] [--no-save]

Prints a table and appends a dated section (machine, versions, command, results) to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]  # the repository (data/, ...) and benchmarks/ (_report)
_SHARED = REPO.parent / "shared"
if "TIKTOKEN_CACHE_DIR" not in os.environ and (_SHARED / "tiktoken_cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED / "tiktoken_cache")

import _report  # noqa: E402
from common.errors import user_errors_exit  # noqa: E402
from data.config import DataConfig  # noqa: E402
from data.pipeline import datasets_progress, write_bins  # noqa: E402
from data.sources import ensure_tinyshakespeare, load_rows, resolve_corpus, tinyshakespeare_path  # noqa: E402
from data.tokenizer import TiktokenTokenizer  # noqa: E402



def shakespeare_text() -> str:
    """tinyshakespeare from the data folder, else the offline copy in ../shared, else downloaded."""
    shared = _SHARED / "data" / "tinyshakespeare" / "input.txt"
    path = tinyshakespeare_path() if tinyshakespeare_path().is_file() or not shared.is_file() else shared
    if not path.is_file():
        path = ensure_tinyshakespeare()
    return path.read_text(encoding="utf-8")


def machine() -> str:
    return _report.machine(versions=("tiktoken", "datasets"))


def time_pipeline(corpus_file: Path, num_proc: int, trials: int, scratch: Path) -> list[float]:
    """Seconds for write_bins (scan + map encode + bin copy), `trials` times, with fresh output each time."""
    cfg = DataConfig(source="text", path=str(corpus_file), tokenizer="gpt2", num_proc=num_proc)
    corpus = resolve_corpus(cfg, quiet=True)
    rows = load_rows(corpus, scratch / "hf")  # reading the text into Arrow is not part of the timing
    seconds = []
    for trial in range(trials):
        work = scratch / f"np{num_proc}-{trial}"
        work.mkdir()
        start = time.perf_counter()
        write_bins(corpus, rows, "gpt2", cfg.val_fraction, work, num_proc=num_proc, quiet=True)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="tokenize_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="concatenate tinyshakespeare this many times")
    parser.add_argument("--trials", type=int, default=3, help="runs per setting (the median is reported)")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--no-save", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with user_errors_exit("tokenize_throughput"), datasets_progress(False):
        text = shakespeare_text() * max(args.repeat, 1)
        megabytes = len(text.encode("utf-8")) / 1e6
        tok = TiktokenTokenizer("gpt2")
        start = time.perf_counter()
        n_tokens = len(tok.encode(text))
        baseline = time.perf_counter() - start
        rows = [("tiktoken encode_ordinary, whole text, 1 thread", baseline)]
        with tempfile.TemporaryDirectory(prefix="attngpt-bench-") as tmp:
            corpus_file = Path(tmp) / "corpus.txt"
            corpus_file.write_text(text, encoding="utf-8")
            for n in args.num_proc:
                seconds = time_pipeline(corpus_file, n, args.trials, Path(tmp))
                rows.append((f"prepare pipeline (datasets.map), num_proc={n}", statistics.median(seconds)))
    header = f"| what | seconds (median of {args.trials}) | MB/s | speedup vs num_proc={args.num_proc[0]} |"
    table = [header, "|---|---:|---:|---:|"]
    reference = rows[1][1]
    for name, seconds in rows:
        speedup = f"{reference / seconds:.2f}x" if name.startswith("prepare") else "-"
        table.append(f"| {name} | {seconds:.3f} | {megabytes / seconds:.2f} | {speedup} |")
    command = _report.command("tokenize_throughput.py")
    corpus_line = f"Corpus: tinyshakespeare x{max(args.repeat, 1)} = {megabytes:.2f} MB, {n_tokens:,} GPT-2 tokens."
    print(corpus_line)
    print("\n".join(table))
    if args.no_save:
        return
    when = _report.timestamp()
    section = [f"## Tokenization throughput, GPT-2 BPE ({when})", "", f"- Machine: {machine()}",
               f"- Command: `{command}`", f"- {corpus_line}",
               "- Pipeline time = scan + datasets.map encode + bin copy (`data.pipeline.write_bins`), including "
               "worker start-up; loading the text into Arrow is excluded.", "", *table, ""]
    print(f"appended to {_report.append_section(section)}")


if __name__ == "__main__":
    main()

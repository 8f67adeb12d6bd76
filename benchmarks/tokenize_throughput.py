"""GPT-2 BPE throughput of preparing a document corpus: 1 process vs num_proc worker processes.

Why: `data.num_proc` splits a corpus across processes by its own files (data/sharded.py); this measures
what that buys on a given machine, and how much memory each worker needs. It generates a multi-file
JSON-lines corpus (documents cut from tinyshakespeare, each with its own header, at least --mb MB of
text in --files files), then times `data.sharded.encode_documents_sharded` — the same parts, workers,
split and shard writes that `python -m data.prepare` runs on a streamed hub corpus — once per process
count and trial, each in a fresh subprocess (so one setting's memory does not count against another).
Peak RSS is per encoding process (VmHWM): the worker's own with num_proc > 1, the whole process with
num_proc = 1. tiktoken alone on a sample, document by document, is the baseline of what encoding costs.
A control measures what the machine allows: the same pure-Python loop in 1 process, then in N processes
at once (interleaved with the trials); on a shared machine another session's busy process takes its
share of the cores whatever its nice value (Linux autogroup scheduling), and the control shows it.

    python benchmarks/tokenize_throughput.py [--mb 200] [--files 16] [--num-proc 1 2] [--trials 2] [--no-save]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report
from common.errors import user_errors_exit

_SHARED = _report.REPO.parent / "shared"
if "TIKTOKEN_CACHE_DIR" not in os.environ and (_SHARED / "tiktoken_cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED / "tiktoken_cache")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

SAMPLE_MB = 8  # text encoded by tiktoken alone for the baseline row
CONTROL_LOOP = 20_000_000  # iterations of the control's pure-Python loop (~2 s on one core)


def shakespeare_text() -> str:
    """tinyshakespeare from the data folder, else the offline copy in ../shared, else downloaded."""
    from data.sources import ensure_tinyshakespeare, tinyshakespeare_path

    shared = _SHARED / "data" / "tinyshakespeare" / "input.txt"
    path = tinyshakespeare_path() if tinyshakespeare_path().is_file() or not shared.is_file() else shared
    if not path.is_file():
        path = ensure_tinyshakespeare()
    return path.read_text(encoding="utf-8")


def generate_corpus(folder: Path, megabytes: float, n_files: int) -> tuple[list[Path], int, int]:
    """n_files JSON-lines files of documents (1-8K characters cut from tinyshakespeare at varying offsets,
    each under its own header) holding at least `megabytes` MB of text. Returns (files, documents, bytes)."""
    source = shakespeare_text()
    per_file = -(-int(megabytes * 1e6) // n_files)
    files, n_docs, total = [], 0, 0
    for f in range(n_files):
        path = folder / f"docs_{f:03d}.jsonl"
        written = 0
        with open(path, "w", encoding="utf-8") as out:
            while written < per_file:
                start = (n_docs * 7919) % (len(source) - 8192)
                text = f"Document {n_docs} of file {f}.\n" + source[start:start + 1024 + (n_docs * 613) % 7168]
                out.write(json.dumps({"text": text}) + "\n")
                written += len(text.encode("utf-8"))
                n_docs += 1
        files.append(path)
        total += written
    return files, n_docs, total


def measure(files: list[Path], num_proc: int, scratch: Path) -> dict:
    """In this process: encode the corpus with num_proc processes; seconds, tokens and peak RSS."""
    from data.config import DataConfig
    from data.pipeline import EncodeSettings, datasets_progress
    from data.sharded import encode_documents_sharded
    from data.sources import load_rows, resolve_corpus

    cfg = DataConfig(source="hub", name="json", data_files=[str(f) for f in files], streaming=True,
                     tokenizer="gpt2", num_proc=num_proc)
    with datasets_progress(False):
        corpus = resolve_corpus(cfg, quiet=True)
        rows = load_rows(corpus, scratch / "hf", num_proc)
        settings = EncodeSettings("gpt2", cfg.val_fraction, num_proc, quiet=True)
        seconds, result = _report.timed(lambda: encode_documents_sharded(corpus, rows, scratch / "hf", "benchmark",
                                                                         scratch / "out", settings))
    return {"num_proc": num_proc, "seconds": seconds, "parts": result.parts,
            "tokens": result.counts.tokens["train"] + result.counts.tokens["val"],
            "peak_worker_rss_mb": result.peak_worker_rss_mb}


def run_measure(files: list[Path], num_proc: int, scratch: Path) -> dict:
    """`measure` in a fresh subprocess."""
    scratch.mkdir(parents=True)
    argv = [sys.executable, __file__, "--measure", str(num_proc), "--scratch", str(scratch), *map(str, files)]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"measuring num_proc={num_proc} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _busy_loop(_: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(CONTROL_LOOP):
        total += i
    return time.perf_counter() - start


def parallel_control(num_proc: int) -> float:
    """Throughput of num_proc processes each running the same loop at once, relative to one process alone
    (num_proc x: every process had a core of its own; 1.0x: they shared one)."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(num_proc) as pool:
        pool.map(_busy_loop, range(num_proc))  # start-up, not timed
        alone = pool.apply(_busy_loop, (0,))
        together, _ = _report.timed(lambda: pool.map(_busy_loop, range(num_proc), chunksize=1))
    return num_proc * alone / together


def tiktoken_baseline(files: list[Path]) -> float:
    """MB/s of tiktoken encode_ordinary, document by document, over the first SAMPLE_MB MB."""
    from data.tokenizer import TiktokenTokenizer

    tok = TiktokenTokenizer("gpt2")
    texts, size = [], 0
    with open(files[0], encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            size += len(texts[-1].encode("utf-8"))
            if size >= SAMPLE_MB * 1e6:
                break
    seconds, _ = _report.timed(lambda: [tok.encode(text) for text in texts])
    return size / 1e6 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="tokenize_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="MB of text to generate (default 200)")
    parser.add_argument("--files", type=int, default=16, help="files the corpus is split into (its parts)")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--trials", type=int, default=2, help="rounds over the process counts (interleaved)")
    _report.save_flags(parser)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # internal: one measurement
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("corpus", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        with user_errors_exit("tokenize_throughput"):
            print(json.dumps(measure(args.corpus, args.measure, args.scratch)))
        return
    load_before = _report.load_average()
    with user_errors_exit("tokenize_throughput"), tempfile.TemporaryDirectory(prefix="attngpt-tok-") as tmp:
        files, n_docs, n_bytes = generate_corpus(Path(tmp), args.mb, args.files)
        baseline_mbs = tiktoken_baseline(files)
        runs: dict[int, list[dict]] = {n: [] for n in args.num_proc}
        controls: dict[int, list[float]] = {n: [] for n in args.num_proc if n > 1}
        for trial in range(args.trials):
            for n in controls:
                controls[n].append(parallel_control(n))
                print(f"trial {trial + 1}, control: {n} busy processes at once run at {controls[n][-1]:.2f}x the "
                      f"throughput of one", flush=True)
            for n in args.num_proc:
                result = run_measure(files, n, Path(tmp) / f"np{n}-t{trial}")
                runs[n].append(result)
                print(f"trial {trial + 1}, num_proc={n}: {result['seconds']:.1f} s, "
                      f"{n_bytes / 1e6 / result['seconds']:.2f} MB/s, peak RSS/worker "
                      f"{result['peak_worker_rss_mb']:.0f} MB", flush=True)
    load_after = _report.load_average().replace("before the run", "after")
    reference = statistics.median(r["seconds"] for r in runs[args.num_proc[0]])
    table = [f"| encoding | seconds per trial | median s | MB/s | tokens/s | speedup vs num_proc={args.num_proc[0]} "
             f"| peak RSS per encoding process |", "|---|---|---:|---:|---:|---:|---:|",
             f"| tiktoken encode_ordinary alone, per document, {SAMPLE_MB} MB sample | - | - | {baseline_mbs:.2f} "
             f"| - | - | - |"]
    tokens = runs[args.num_proc[0]][0]["tokens"]
    for n, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rss = max(r["peak_worker_rss_mb"] for r in results)
        per_trial = ", ".join(f"{r['seconds']:.1f}" for r in results)
        table.append(f"| prepare (data/sharded.py), num_proc={n} | {per_trial} "
                     f"| {seconds:.1f} | {n_bytes / 1e6 / seconds:.2f} | {tokens / seconds:,.0f} | "
                     f"{reference / seconds:.2f}x | {rss:.0f} MB |")
    for n, ratios in controls.items():
        table.append(f"| control: a pure-Python loop in {n} processes at once vs 1 | "
                     f"{', '.join(f'{r:.2f}x' for r in ratios)} | - | - | - | {statistics.median(ratios):.2f}x | - |")
    assert all(r["tokens"] == tokens for rs in runs.values() for r in rs), "token counts differ between runs"
    corpus_line = (f"Corpus: generated, {args.files} JSON-lines files, {n_docs:,} documents, {n_bytes / 1e6:.1f} MB "
                   f"of text, {tokens:,} GPT-2 tokens (identical for every setting), "
                   f"{runs[args.num_proc[0]][0]['parts']} parts.")
    print(corpus_line)
    print("\n".join(table))
    machine_line = (f"{_report.machine(versions=('tiktoken', 'datasets'))}; CPU flags: "
                    f"{_report.flag_list(('sse4_2', 'avx2', 'avx512f', 'bmi2'))}; {load_before}, {load_after}")
    _report.save(args, "Tokenization throughput of a document corpus, GPT-2 BPE", machine_line,
                 "tokenize_throughput.py", f"- {corpus_line}",
                 "- Time = `encode_documents_sharded` on the streamed corpus: worker start-up, reading, encoding, "
                 "splitting into train/val shards (fsynced); each setting in a fresh subprocess, trials interleaved.",
                 "", *table, "")


if __name__ == "__main__":
    main()

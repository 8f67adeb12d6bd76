"""What the prepare fingerprint costs: hashing every byte of a local corpus file (data/sources.py: `_stats`).

Why: every `train.py` and `python -m data.prepare` start fingerprints the local corpus to know whether its
prepared shards are still its own (data/prepare.py), and since the fingerprint covers the whole content, that
cost grows with the corpus. This writes a file of random bytes (--mb, default 100 MB) into a temporary folder,
then times `_stats` on it: the first read, and --rounds more (the median), both from the page cache, which
is where a corpus that was just written or read lies (a cold read from disk is bounded by the disk instead).
For comparison, the same with hashlib's sha1 and blake2b over the same 1 MiB chunks.

    python benchmarks/fingerprint_cost.py [--mb 100] [--rounds 5] [--no-save]

Prints a table and appends a dated section (machine, CPU flags, command, results) to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the repository (data/) and benchmarks/

import _report  # noqa: E402
from data.sources import _stats  # noqa: E402

CHUNK = 1 << 20


def hash_file(path: Path, name: str) -> str:
    digest = hashlib.new(name)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def timed(fn, rounds: int) -> tuple[float, float]:
    """(seconds of the first call, median seconds of `rounds` more)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the file hashed, in MB (10**6 bytes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-save", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args(argv)
    load = _report.load_average()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.txt"
        with open(path, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1_000_000))
        rows = [("data.sources._stats (sha256, what the fingerprint uses)", *timed(lambda: _stats([path]), args.rounds))]
        for name in ("sha1", "blake2b"):
            rows.append((f"hashlib {name}, same chunks", *timed(lambda n=name: hash_file(path, n), args.rounds)))
    per_100 = 100 / args.mb
    lines = [f"## Prepare fingerprint: hashing a local corpus file whole ({_report.timestamp()})", "",
             f"- Machine: {_report.machine(extra=[load, _report.cpu_bf16_support()])}",
             f"- CPU hash flags: sha_ni {'yes' if 'sha_ni' in _report.cpu_flags() else 'no'}, "
             f"avx2 {'yes' if 'avx2' in _report.cpu_flags() else 'no'}",
             f"- Command: `{_report.command('fingerprint_cost.py', argv)}`",
             f"- A {args.mb} MB file of random bytes in a temporary folder, read from the page cache in 1 MiB chunks; "
             f"median of {args.rounds} rounds after a first one.", "",
             "| what | first call s | median s | s per 100 MB | MB/s |", "|---|---:|---:|---:|---:|"]
    for name, first, median in rows:
        lines.append(f"| {name} | {first:.3f} | {median:.3f} | {median * per_100:.3f} | {args.mb / median:,.0f} |")
    print("\n".join(lines))
    if not args.no_save:
        print(f"appended to {_report.append_section(lines)}", file=sys.stderr)


if __name__ == "__main__":
    main()

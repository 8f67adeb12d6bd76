"""Shared by the benchmark scripts: the machine line, the exact command, common flags, timing, and appending a
section to RESULTS.md (append only: earlier sections stay exactly as they are). Not a benchmark itself.

Importing it puts the repository on sys.path, so the scripts that import it first can import model/, training/...
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def cpuinfo(key: str) -> str | None:
    """The value of the first `key` line of /proc/cpuinfo, None without one (or without the file)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def flag_list(names: Iterable[str]) -> str:
    """'name yes, name no, ...': which of these CPU flags this machine has."""
    have = (cpuinfo("flags") or "").split()
    return ", ".join(f"{name} {'yes' if name in have else 'no'}" for name in names)


def cpu_bf16_support() -> str:
    """Which bf16 instructions the CPU has: what decides whether bf16 autocast is faster than fp32 on it."""
    if not cpuinfo("flags"):
        return "CPU flags unknown (no /proc/cpuinfo)"
    return "CPU flags: " + flag_list(("avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))


def load_average() -> str:
    try:
        return "load average before the run " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def package_version(name: str) -> str:
    try:
        return getattr(importlib.import_module(name), "__version__", "?")
    except ImportError:
        return "not installed"


def page_sizes() -> str:
    """'transparent huge pages M, malloc in 2 MB pages' (or '... in 4 KB pages'): whether this process's malloc
    memory, the weights' included, was asked for in 2 MB pages (common/huge_pages.py)."""
    from common.huge_pages import malloc_in_huge_pages, thp_mode

    mode = thp_mode()
    huge = malloc_in_huge_pages(os.environ, mode)
    return f"transparent huge pages {mode or 'unknown'}, malloc in {'2 MB' if huge else '4 KB'} pages"


def machine(versions: Iterable[str] = (), torch_threads: bool = False, extra: Iterable[str] = (), gpu=None) -> str:
    """'<CPU>, N cores[ (T torch threads, load average ...)]; Python X, torch Y[, pkg Z ...][; extra ...]
    [; GPU name]', the GPU's name when `gpu` is a CUDA torch.device."""
    import torch

    line = f"{cpuinfo('model name') or platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores"
    if torch_threads:
        line += f" ({torch.get_num_threads()} torch threads, {load_average()}; {page_sizes()})"
    line += f"; Python {platform.python_version()}, torch {torch.__version__}"
    line += "".join(f", {name} {package_version(name)}" for name in versions)
    gpus = [f"GPU {torch.cuda.get_device_name(gpu)}"] if gpu is not None and gpu.type == "cuda" else []
    return "; ".join([line, *extra, *gpus])


def command(script: str, argv: list[str] | None = None) -> str:
    """The exact command line that ran, as a user would type it from the repository root."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", f"benchmarks/{script}", *args])


def timestamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def timed(fn: Callable[[], object], device=None) -> tuple[float, object]:
    """(wall seconds of one call of fn(), what it returned), the torch.device `device` (if any) synchronized
    before and after."""
    if device is not None:
        from training.runtime import synchronize
        synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device is not None:
        synchronize(device)
    return time.perf_counter() - start, out


def median_seconds(fn: Callable[[], object], reps: int = 1, device=None) -> float:
    """Median wall seconds of `reps` calls of fn() (see timed)."""
    return statistics.median(timed(fn, device)[0] for _ in range(reps))


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int, calls: int = 1,
                warmup: int = 0) -> dict[str, float]:
    """name -> median seconds per call over `rounds` rounds of `calls` calls each, the candidates taking turns
    round by round (a machine's slow spell falls on all of them), after `warmup` untimed calls of each."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    per_round: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            per_round[name].append(median_seconds(lambda: [fn() for _ in range(calls)]) / calls)
    return {name: statistics.median(seconds) for name, seconds in per_round.items()}


def save_flags(parser: argparse.ArgumentParser, quick: str | None = None) -> None:
    """--no-save; and where the script has a smoke run, --quick (`quick`: its help) and --save."""
    parser.add_argument("--no-save", action="store_true", help="do not append to benchmarks/RESULTS.md")
    if quick:
        parser.add_argument("--quick", action="store_true", help=quick)
        parser.add_argument("--save", action="store_true", help="append to RESULTS.md even with --quick")


def save(args: argparse.Namespace, title: str, machine_line: str, script: str, *lines: str) -> None:
    """Append the section '## title (now)', its machine and command lines then `lines`, to RESULTS.md and say
    so, unless --no-save, or --quick without --save."""
    if args.no_save or (getattr(args, "quick", False) and not args.save):
        return
    section = [f"## {title} ({timestamp()})", "", f"- Machine: {machine_line}", f"- Command: `{command(script)}`"]
    print(f"appended to {append_section([*section, *lines])}")


def append_section(lines: list[str], results: Path | None = None) -> Path:
    """Append one section (a list of markdown lines, starting with its '## ' title) to RESULTS.md (or
    `results`), one blank line after what is there; the file is created with its title if missing."""
    results = RESULTS if results is None else results
    if not results.is_file():
        results.write_text("# Benchmark results\n", encoding="utf-8")
    tail = results.read_bytes()[-2:]
    gap = "" if tail == b"\n\n" else "\n" if tail.endswith(b"\n") else "\n\n"
    body = "\n".join(lines).rstrip("\n") + "\n"
    with results.open("a", encoding="utf-8") as f:  # append only: other sections stay as they are
        f.write(gap + body)
    return results


# Dense (no sparsity) datasheet peaks, FLOP/s: {GPU name fragment: {dtype: peak}}. The first fragment found
# in torch.cuda.get_device_name() wins, so the more specific names come first. fp32 is the CUDA-core peak
# (PyTorch's default float32 matmul precision, "highest", uses no TF32); tf32 is used when TF32 is enabled.
NOMINAL_PEAKS = (
    ("H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H200 NVL", {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12}),
    ("H100", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),
    ("H200", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
)


def nominal_peaks(device) -> tuple[str, dict[str, float]]:
    """(GPU name, {dtype: dense datasheet peak}); empty for CPUs and unknown GPUs."""
    if device.type != "cuda":
        return "", {}
    import torch  # only here: the other helpers serve scripts that may not need torch
    name = torch.cuda.get_device_name(device)
    for fragment, peaks in NOMINAL_PEAKS:
        if fragment in name:
            peaks = dict(peaks)
            if torch.backends.cuda.matmul.allow_tf32:
                peaks["fp32"] = peaks["tf32"]
            return name, peaks
    return name, {}

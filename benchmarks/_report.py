"""Shared by the benchmark scripts: the machine line, the exact command, and appending a section to RESULTS.md.

Not a benchmark itself. Every script here prints its tables and appends one dated section to
benchmarks/RESULTS.md (append only: earlier sections stay exactly as they are).
"""
from __future__ import annotations

import datetime
import importlib
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
HEADER = "# Benchmark results\n"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16_support() -> str:
    """Which bf16 instructions the CPU has: what decides whether bf16 autocast is faster than fp32 on it."""
    flags = cpu_flags()
    if not flags:
        return "CPU flags unknown (no /proc/cpuinfo)"
    names = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return "CPU flags: " + ", ".join(f"{name} {'yes' if name in flags else 'no'}" for name in names)


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


def machine(versions: Iterable[str] = (), torch_threads: bool = False, extra: Iterable[str] = ()) -> str:
    """'<CPU>, N cores[ (T torch threads, load average ...)]; Python X, torch Y[, pkg Z ...][; extra ...]'."""
    import torch

    line = f"{cpu_model()}, {os.cpu_count()} cores"
    if torch_threads:
        line += f" ({torch.get_num_threads()} torch threads, {load_average()})"
    line += f"; Python {platform.python_version()}, torch {torch.__version__}"
    line += "".join(f", {name} {package_version(name)}" for name in versions)
    return "; ".join([line, *extra])


def command(script: str, argv: list[str] | None = None) -> str:
    """The exact command line that ran, as a user would type it from the repository root."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", f"benchmarks/{script}", *args])


def timestamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def append_section(lines: list[str], results: Path | None = None) -> Path:
    """Append one section (a list of markdown lines, starting with its '## ' title) to RESULTS.md (or
    `results`), one blank line after what is there; the file is created with its title if missing."""
    results = RESULTS if results is None else results
    if not results.is_file():
        results.write_text(HEADER, encoding="utf-8")
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

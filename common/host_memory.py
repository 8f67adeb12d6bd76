"""Freed CPU memory kept in the process for reuse, so that a training step on a CPU does not fault its
activations' pages in again every step.

glibc's malloc hands memory back to the kernel when the free space at the top of its heap grows past a trim
threshold (by default twice its mmap threshold, which adapts from 128 KiB up to 32 MiB), and serves blocks above
the mmap threshold with fresh mappings that are unmapped again when freed. A training step allocates its
activations and gradients and frees them all by its end: the freed memory went back to the kernel, and the next
step had every page of it mapped and zero-filled again. configs/small.yaml's 800 steps took 1.8 million minor
page faults and 5.2 s of system time that way; with both thresholds raised once, 153 thousand and 1.5 s, the same
losses (benchmarks/RESULTS.md). What this costs: the process keeps its peak memory until it exits, which a
training run reaches at every step anyway.

Other C libraries (musl, macOS, Windows) are left as they are: keep_freed_memory says whether it applied.
"""
from __future__ import annotations

import ctypes
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD_MAX = 32 * 2**20  # the largest mmap threshold glibc accepts on a 64-bit machine
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: free space up to 2 GiB stays in the heap


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds (module doc) for the rest of the process, once; True where they were
    set, False where the C library is not glibc's (no mallopt, or one that refuses the values)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # glibc returns 1 for a value it took; musl's mallopt is a stub that returns 0
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

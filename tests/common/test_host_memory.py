"""common/host_memory.py: with the thresholds raised, memory a process frees is reused without page faults; a
training run on a CPU raises them. Each case runs in a fresh interpreter (the setting lasts for a process)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from common.host_memory import keep_freed_memory
from tests.helpers import REPO

# 20 rounds of what a training step does to the allocator: 24 blocks of 1..24 MiB (300 MiB) allocated, written
# and all freed; prints the minor page faults of rounds 2..20 (the first round maps the memory in any case)
CYCLES = """
import resource, sys
sys.path.insert(0, {repo!r})
from common.host_memory import keep_freed_memory
applied = keep_freed_memory() if {keep} else None
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_round():
    blocks = [bytearray(size * 2**20) for size in range(1, 25)]
    for block in blocks:
        block[::4096] = bytes(len(block[::4096]))  # touch every page
    del blocks
one_round()
before = faults()
for _ in range(19):
    one_round()
print(applied, faults() - before)
"""


def faults_over_rounds(keep: bool) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", CYCLES.format(repo=str(REPO), keep=keep)], capture_output=True,
                          text=True, check=True)
    applied, faults = done.stdout.split()
    return applied, int(faults)


needs_glibc = pytest.mark.skipif(not keep_freed_memory(), reason="the C library is not glibc")


@needs_glibc
def test_freed_memory_is_reused_without_faulting_its_pages_in_again():
    applied, kept = faults_over_rounds(keep=True)
    default_applied, default = faults_over_rounds(keep=False)
    assert applied == "True" and default_applied == "None"
    pages_per_round = sum(range(1, 25)) * 2**20 // 4096  # 76,800
    assert default > 5 * pages_per_round  # glibc's defaults hand the blocks back and fault them in each round
    assert kept < pages_per_round // 4  # kept: the 19 rounds together fault in less than a quarter of one


@needs_glibc
def test_a_cpu_training_run_sets_it_up():
    probe = ("import sys; sys.path.insert(0, {repo!r}); import common.host_memory as h; "
             "from training.runtime import setup_runtime; "
             "print(h.keep_freed_memory.cache_info().currsize); setup_runtime('cpu', 'float32'); "
             "print(h.keep_freed_memory.cache_info().currsize)").format(repo=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "1"]

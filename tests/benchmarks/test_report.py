"""benchmarks/_report.py's page-size note on the machine line: 2 MB pages where the kernel gives them unasked
(`always`) or glibc's tunable asks for them under `madvise`; 4 KB otherwise, the tunable among others included."""
from __future__ import annotations

import sys

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import _report  # noqa: E402
import common.huge_pages  # noqa: E402


@pytest.mark.parametrize("mode, tunables, pages", [
    ("madvise", None, "4 KB"), ("madvise", "glibc.malloc.hugetlb=1", "2 MB"),
    ("madvise", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "2 MB"), ("madvise", "glibc.malloc.hugetlb=0", "4 KB"),
    ("never", "glibc.malloc.hugetlb=1", "4 KB"), ("always", None, "2 MB"), (None, "glibc.malloc.hugetlb=1", "4 KB")])
def test_the_machine_line_says_which_pages_malloc_gets(monkeypatch, mode, tunables, pages):
    monkeypatch.setattr(common.huge_pages, "thp_mode", lambda: mode)
    if tunables is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    assert _report.page_sizes() == f"transparent huge pages {mode or 'unknown'}, malloc in {pages} pages"

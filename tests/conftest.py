"""Test-wide environment: no test may reach the network.

Set at import time, before any test module imports `datasets` (which reads its offline flags once).
tiktoken's GPT-2 files come from ../shared/tiktoken_cache when present (CI exports TIKTOKEN_CACHE_DIR itself).
"""
from __future__ import annotations

import os
from pathlib import Path

# One intra-op thread per test process (and the command lines they start): the suite runs as two xdist
# workers on two cores, and two processes with two OpenMP threads each on two cores spin-wait on each
# other (steps 5-10x slower); the tiny test models gain nothing from a second thread anyway.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED_TIKTOKEN_CACHE = Path(__file__).resolve().parents[1].parent / "shared" / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN_CACHE)

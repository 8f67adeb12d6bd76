"""Test-wide environment: no test may reach the network.

Set at import time, before any test module imports `datasets` (which reads its offline flags once).
tiktoken's GPT-2 files come from ../shared/tiktoken_cache when present (CI exports TIKTOKEN_CACHE_DIR itself).
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED_TIKTOKEN_CACHE = Path(__file__).resolve().parents[1].parent / "shared" / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN_CACHE)

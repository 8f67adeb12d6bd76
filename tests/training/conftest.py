"""Fixtures shared by the training tests of one folder: the FSDP run through torchrun that test_parallel_fsdp.py
(training/parallel.py) and test_dist_checkpoint.py (its sharded checkpoints) both compare against. Module-scoped:
each of those modules makes its own."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import TINY_SIX_STEPS, TORCHRUN, prepared_shakespeare_dir, run_cli


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {"ATTNGPT_DATA_DIR": str(prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))),
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env) -> Path:
    """2 processes, FSDP, 6 steps; the attention monitor on (its probe is a collective under FSDP)."""
    out = tmp_path_factory.mktemp("fsdp") / "run"
    proc = run_cli([*TORCHRUN, *TINY_SIX_STEPS, f"out_dir={out}", "train.parallel=fsdp"], env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out

"""Test-wide environment: no test may reach the network.

Set at import time, before any test module imports `datasets` (which reads its offline flags once).
tiktoken's GPT-2 files come from ../shared/tiktoken_cache when present (CI exports TIKTOKEN_CACHE_DIR itself).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis draws the same examples on every run (derandomize: seeded by each test's name), keeps no
# example database between runs, and prints the reproduction blob of a failure: a verdict is the code's,
# not what one random draw happened to find. HYPOTHESIS_PROFILE=explore draws new examples each run, to
# look for failures locally. No deadline: an example's time on a shared 2-core machine is not the code's verdict
# (speed is never asserted in tests). Each test's own @settings (max_examples, deadline) still apply.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# One intra-op thread per test process (and the command lines they start): the suite runs as two xdist
# workers on two cores, and two processes with two OpenMP threads each on two cores spin-wait on each
# other (steps 5-10x slower); the tiny test models gain nothing from a second thread anyway.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED_TIKTOKEN_CACHE = Path(__file__).resolve().parents[1].parent / "shared" / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN_CACHE)


@pytest.fixture(autouse=True, scope="session")
def kernel_cache(tmp_path_factory):
    """native/build.py builds its kernels into a folder of the test session's, not into the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernels")))
        yield


def built_or_skip(library, what: str):
    """A native/ library built and loaded (library(): native/build.py's), or the test skipped where it cannot be
    (no C compiler)."""
    built = library()
    if built is None:
        pytest.skip(f"no C compiler here: the {what} cannot be built")
    return built


@pytest.fixture
def lib():
    """native/int8_matvec.c built and loaded; the test skips where it cannot be (no C compiler)."""
    from native.build import int8_matvec_library
    return built_or_skip(int8_matvec_library, "int8 kernel")


@pytest.fixture(scope="session")
def attention_lib():
    """native/decode_attention.c built and loaded; the test skips where it cannot be (no C compiler)."""
    from native.build import decode_attention_library
    return built_or_skip(decode_attention_library, "decode attention kernel")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A tiny run of 2 steps (latest/ and best/ at step 2) and its model, once per module; the module
    provides `data_dir`, a prepared tinyshakespeare folder. Tests work on tests.helpers.fresh_copy of it."""
    from tests.helpers import tiny_config
    from training.trainer import train
    out = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        result = train(tiny_config(out, "train.max_iters=2", "eval.interval=2", "attn.enabled=false"))
    return out, result.model


@pytest.fixture
def data_env(data_dir, monkeypatch):
    """Point data preparation at the module's `data_dir` and keep W&B off, for modules that train
    in-process (`pytestmark = pytest.mark.usefixtures("data_env")`)."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def environ_is_not_rebound():
    """A test (or the code under it) that rebinds os.environ to another mapping leaves its variables in
    place for every later test in the worker, out of monkeypatch's reach; fail the test that did it."""
    environ = os.environ
    yield
    assert os.environ is environ, "os.environ was rebound to another mapping during this test"

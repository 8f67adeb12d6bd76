"""Fixtures shared by the data tests: an empty data folder the preparation writes into, and a token file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import write_bin


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data folder (ATTNGPT_DATA_DIR) for the test; a module that needs another (a prepared
    tinyshakespeare: test_prepared_trust.py) defines its own data_dir."""
    folder = tmp_path / "data"
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def train_bin(tmp_path: Path) -> Path:
    """train.bin holding the ids 0..999 in order (uint16): a window's ids tell where it starts."""
    return write_bin(tmp_path / "train.bin", np.arange(1000, dtype=np.uint16))

"""Safe loading: nothing read from a checkpoint can run code. Planted pickles in train_state.pt,
model.safetensors and config.json are refused (and the payloads are shown to be live first); a truncated
or foreign training state is refused in one line."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pretrained.checkpoint import CheckpointError, load_model
from tests.helpers import Plant, fresh_copy, prepared_shakespeare_dir
from training.checkpoint import LATEST, STATE_FILE, load_train_state


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def test_planted_pickles_are_refused_and_never_run(tmp_path, trained):
    out, _ = fresh_copy(trained, tmp_path)
    marker = tmp_path / "code_ran"
    # the payloads are live: plain pickle.loads would run them
    for how in ("system", "open"):
        pickle.loads(pickle.dumps(Plant(marker, how)))
        assert marker.exists()
        marker.unlink()

    def planted(name: str, write) -> Path:
        directory = tmp_path / name
        shutil.copytree(out / LATEST, directory)
        write(directory)
        return directory

    state_cases = [
        planted("state_zip_system", lambda d: torch.save({"step": 1, "rng": Plant(marker, "system")}, d / STATE_FILE)),
        planted("state_zip_open", lambda d: torch.save([Plant(marker, "open")], d / STATE_FILE)),
        planted("state_raw_pickle", lambda d: (d / STATE_FILE).write_bytes(pickle.dumps(Plant(marker, "system"), 2))),
    ]
    for directory in state_cases:
        with pytest.raises(CheckpointError, match="refusing to load it, since unpickling it could run code"):
            load_train_state(directory)
    weights = planted("weights_pickle", lambda d: (d / "model.safetensors").write_bytes(
        pickle.dumps(Plant(marker, "system"))))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_model(weights)
    config = planted("config_pickle", lambda d: (d / "config.json").write_bytes(pickle.dumps(Plant(marker, "open"))))
    with pytest.raises(CheckpointError, match="config.json' is corrupted or not an attngpt config"):
        load_model(config)
    assert not marker.exists()


def test_a_truncated_or_foreign_training_state_is_refused_in_one_line(tmp_path, trained):
    out, _ = fresh_copy(trained, tmp_path)
    state_path = out / LATEST / STATE_FILE
    good = state_path.read_bytes()
    for payload, fragment in [(good[: len(good) // 2], "corrupted or truncated"), (b"", "corrupted or truncated"),
                              (None, "not an attngpt training state (missing or invalid: optimizer, loader, rng)")]:
        if payload is None:
            torch.save({"step": 3, "best_val": 1.0}, state_path)
        else:
            state_path.write_bytes(payload)
        with pytest.raises(CheckpointError) as e:
            load_train_state(out / LATEST)
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)

"""data/config.py: DataConfig's defaults, the values it refuses (each one line naming the key), and `path` as one
file or many. The repeated source's settings: test_config_repeated.py."""
from __future__ import annotations

import pytest

from common.config_io import from_dict
from common.errors import UserError
from data.config import DataConfig


def test_data_config_defaults_are_valid() -> None:
    cfg = from_dict(DataConfig, {}, "data.")
    assert cfg.source == "tinyshakespeare" and cfg.tokenizer == "char" and cfg.val_fraction == 0.1


@pytest.mark.parametrize("raw, message", [
    ({"val_fraction": 0}, "val_fraction"),
    ({"val_fraction": 1.5}, "val_fraction"),
    ({"tokenizer": "gtp2"}, "did you mean 'gpt2'"),
    ({"source": "tinyshakspeare"}, "did you mean 'tinyshakespeare'"),
    ({"source": "hub"}, "needs name"),
    ({"source": "text"}, "needs path"),
    ({"path": "x.txt"}, "only used with source 'text'"),
    ({"source": "text", "path": "x.txt", "name": "parquet"}, "only used with source 'hub'"),
    ({"source": "hub", "name": "parquet", "num_proc": 0}, "num_proc"),
    ({"source": "hub", "name": "parquet", "max_docs": 0}, "max_docs"),
    ({"source": "text", "path": []}, "path"),
    ({"tokenizr": "gpt2"}, "did you mean 'data.tokenizer'"),
])
def test_data_config_rejects_bad_values(raw: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        from_dict(DataConfig, raw, "data.")


def test_data_config_path_accepts_one_or_many() -> None:
    assert from_dict(DataConfig, {"source": "text", "path": "a.txt"}).text_paths() == ["a.txt"]
    assert from_dict(DataConfig, {"source": "text", "path": ["a", "b"]}).text_paths() == ["a", "b"]

"""data/workers.py, parts of a corpus run in spawned worker processes: an error in a worker reaches the caller
as the one UserError line it raised (a streamed document corpus of two files, prepared with data.num_proc=2)."""
from __future__ import annotations

import pytest

from common.config_io import from_dict
from common.errors import UserError
from data.config import DataConfig
from data.prepare import prepare_data


def test_a_worker_error_is_one_user_error(tmp_path, data_dir):
    bad = [tmp_path / "ok.jsonl", tmp_path / "bad.jsonl"]
    bad[0].write_text('{"text": "fine"}\n' * 3, encoding="utf-8")
    bad[1].write_bytes(b'{"text": "caf\xe9"}\n')
    config = from_dict(DataConfig, {"source": "hub", "name": "json", "data_files": [str(f) for f in bad],
                                    "streaming": True, "num_proc": 2}, "data.")
    with pytest.raises(UserError, match="not UTF-8"):
        prepare_data(config, quiet=True)

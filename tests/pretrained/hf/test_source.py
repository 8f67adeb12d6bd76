"""pretrained/hf/source.py, reading a Hugging Face folder: config.json parsed strictly (its JSON error named),
weights in shards listed by model.safetensors.index.json read as one file's, and damaged weights refused: a
truncated safetensors file, or only pickle files (never unpickled)."""
from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from pretrained.load import open_pretrained
from tests.hf_models import make_llama, transformers_or_skip


def test_a_config_json_that_is_not_json_is_refused_naming_the_error(tmp_path):
    from pretrained.hf.source import read_hf_config
    (tmp_path / "config.json").write_text('{"model_type": "gpt2",', encoding="utf-8")
    with pytest.raises(UserError, match=r"config.json '.*config.json' is not valid JSON: Expecting "):
        read_hf_config(tmp_path)
def test_sharded_weights_load(tmp_path):
    transformers = transformers_or_skip()
    folder = tmp_path / "sharded"
    make_llama(folder, seed=4)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "resharded", max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "resharded" / name).write_bytes((folder / name).read_bytes())
    assert (tmp_path / "resharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "resharded").glob("model-*.safetensors"))) > 2
    a = open_pretrained(str(folder)).build()
    b = open_pretrained(str(tmp_path / "resharded")).build()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_damaged_weights_are_refused(folders, tmp_path):
    folder = tmp_path / "damaged"
    folder.mkdir()
    for path in folders["gpt2"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupted or truncated"):
        open_pretrained(str(folder)).build()
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(UserError, match="no model.safetensors .* pickle files, which attngpt never loads"):
        open_pretrained(str(folder))

"""pretrained/hf/load.py, a Hugging Face folder -> an attngpt GPT: the weights beside config.json are checked
against it from their headers alone (what is missing and what is unexpected named, the list cut after three), and
a tied checkpoint that also stores lm_head.weight loads when that copy is the embedding (same logits) and is
refused when it differs."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.errors import UserError
from pretrained.hf.config_map import model_config_from_hf
from pretrained.load import open_pretrained
from tests.hf_models import make_gpt2


def test_a_weights_mismatch_names_what_is_missing_and_what_is_unexpected(tmp_path):
    from pretrained.hf.load import check_hf_weights
    from pretrained.hf.source import read_hf_config
    folder = make_gpt2(tmp_path / "gpt2", tokenizer=False)
    weights = load_file(folder / "model.safetensors")
    hf = read_hf_config(folder)
    config = model_config_from_hf(hf, str(folder / "config.json"))

    def message(state: dict) -> str:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(UserError) as e:
            check_hf_weights(folder, hf, config)
        return str(e.value)

    missing = message({k: v for k, v in weights.items() if k != "transformer.ln_f.bias"})
    assert "(missing transformer.ln_f.bias)" in missing and "unexpected" not in missing
    extra = {f"transformer.extra.{i}": torch.zeros(1) for i in range(4)}
    three = message({**weights, **dict(list(extra.items())[:3])})
    listed = "unexpected transformer.extra.0, transformer.extra.1, transformer.extra.2"
    assert f"({listed})" in three and "missing" not in three
    assert f"({listed} ...)" in message({**weights, **extra})
@pytest.mark.parametrize("name, embedding", [("gpt2", "transformer.wte.weight"),
                                             ("llama_tied", "model.embed_tokens.weight")])
def test_a_tied_checkpoint_that_also_stores_its_head_loads_if_the_copy_is_the_embedding(folders, tmp_path, name,
                                                                                        embedding):
    """Some tied checkpoints store lm_head.weight anyway: a copy equal to the embedding is accepted (same
    logits as without it); one that differs contradicts tie_word_embeddings and is refused."""
    from safetensors.torch import save_file
    reference = open_pretrained(str(folders[name])).build()
    idx = torch.randint(0, reference.config.vocab_size, (1, 24))
    for head, expect in (("copy", None), ("other", "lm_head.weight differs from the token embedding")):
        folder = tmp_path / f"{name}_{head}"
        folder.mkdir()
        for path in folders[name].iterdir():
            (folder / path.name).write_bytes(path.read_bytes())
        state = load_file(folder / "model.safetensors")
        assert "lm_head.weight" not in state  # transformers leaves a tied head out: the test adds it
        state["lm_head.weight"] = state[embedding].clone() + (0.0 if head == "copy" else 1e-3)
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        if expect:
            with pytest.raises(UserError, match=expect):
                open_pretrained(str(folder)).build()
            continue
        model = open_pretrained(str(folder)).build()
        assert model.lm_head.weight is model.tok_emb.weight
        with torch.no_grad():
            assert torch.equal(model(idx)[0], reference(idx)[0])

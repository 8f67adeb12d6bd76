"""pretrained/load.py, what pretrained/ gives back for each source, beyond the logits
(tests/pretrained/test_convert.py): the dtype a model is built in (float32 by default, the stored dtype on
request), the weights an attngpt source copies into a model already built, and where a dump of each source goes by
default. Conversions that never replace a folder unless told to: tests/pretrained/hf/test_export.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from data.tokenizer import CharTokenizer
from model import GPT, ModelConfig
from pretrained.checkpoint import save_model
from pretrained.load import DUMP_DIR, Pretrained, open_pretrained
from tests.hf_models import make_llama, transformers_or_skip

CHARS = "".join(chr(c) for c in range(32, 102))
GPT2_LIKE = ModelConfig(vocab_size=70, block_size=16, n_layer=1, n_head=2, d_model=16, pos="learned",
                        norm="layernorm", mlp="gelu", bias=True)


def test_a_bfloat16_folder_is_built_in_float32_unless_the_stored_dtype_is_asked_for(tmp_path):
    transformers_or_skip()
    folder = make_llama(tmp_path / "llama", seed=4)
    stored = load_file(folder / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in stored.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    source = open_pretrained(str(folder))
    default = source.build()
    kept = source.build(dtype=None)
    assert {p.dtype for p in default.parameters()} == {torch.float32}
    assert {p.dtype for p in kept.parameters()} == {torch.bfloat16}
    embedding = stored["model.embed_tokens.weight"].to(torch.bfloat16)
    assert torch.equal(kept.tok_emb.weight, embedding) and torch.equal(default.tok_emb.weight, embedding.float())


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_an_attngpt_source_builds_a_float32_model_to_train_without_a_random_initialisation(tmp_path, monkeypatch,
                                                                                             stored):
    torch.manual_seed(1)
    saved = GPT(GPT2_LIKE).to(stored)
    save_model(saved, tmp_path / "ckpt", extra={"tokenizer": CharTokenizer(CHARS).to_json()})
    drawn = []  # any weight initialised off the meta device: a random init drawn only to be overwritten
    real_normal = torch.nn.init.normal_
    monkeypatch.setattr(torch.nn.init, "normal_", lambda tensor, *a, **kw: drawn.append(tensor.device.type != "meta")
                        or real_normal(tensor, *a, **kw))
    model = open_pretrained(str(tmp_path / "ckpt")).build_for(GPT2_LIKE)
    assert drawn and not any(drawn)
    assert model.training and model.tok_emb.weight.dtype == torch.float32
    for (name, a), b in zip(saved.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a.float(), b), name
    _, loss = model(torch.randint(0, GPT2_LIKE.vocab_size, (2, 8)), torch.randint(0, GPT2_LIKE.vocab_size, (2, 8)))
    loss.backward()  # it trains: every weight has a gradient
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("src, expected", [("gpt2", "gpt2"), ("openai-community/gpt2", "openai-community_gpt2"),
                                           ("/models/my llama/", "models_my_llama"), ("./x", "x"), ("///", "hf"),
                                           ("..", "hf"), ("Xmodel/", "Xmodel")])
def test_a_dump_goes_to_attn_dump_and_a_hugging_face_models_into_a_folder_of_its_name(src, expected):
    hf = Pretrained(src=src, kind="hf", folder=Path("/cache"), config=GPT2_LIKE, tokenizer=None)
    assert hf.default_dump_dir() == DUMP_DIR / expected
    ours = Pretrained(src=src, kind="attngpt", folder=Path("/runs/x/best"), config=GPT2_LIKE, tokenizer=None)
    assert ours.default_dump_dir() == DUMP_DIR == Path("attn_dump")



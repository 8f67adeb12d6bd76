"""Pretrained models through the real command lines: sample.py --ckpt on a Hugging Face folder (attention
dumps included), train.py with train.init_from (an HF folder, an attngpt run on other data), convert.py.
Every case starts a Python process or trains a few steps, so they are few and tiny."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers import assert_one_line_error, run_cli
from tests.hf_models import LLAMA_TEXT, make_gpt2, make_llama, transformers_or_skip

transformers_or_skip()

from common.errors import UserError  # noqa: E402
from model.generate import generate  # noqa: E402
from pretrained.load import open_pretrained  # noqa: E402
from training.config import load_run_config  # noqa: E402
from training.trainer import train  # noqa: E402

PROMPT = "The animal didn't cross the street because it was tired"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_cli")
    text = root / "corpus.txt"
    text.write_text("\n".join(LLAMA_TEXT * 10) + "\n", encoding="utf-8")
    return {"gpt2": make_gpt2(root / "gpt2", seed=5), "llama": make_llama(root / "llama", seed=6), "text": text,
            "data": root / "data"}


def run_config(path: Path, out_dir: Path, text: Path, **train) -> Path:
    """A run config with no model: section (train.init_from gives the shape), on a small local text."""
    config = {"out_dir": str(out_dir), "device": "cpu", "dtype": "float32",
              "data": {"source": "text", "path": str(text)},
              "train": {"batch_size": 4, "max_iters": 2, "warmup_iters": 0, "log_interval": 1,
                        "peak_flops": 1e12, **train},
              "eval": {"interval": 2, "iters": 1}, "wandb": {"mode": "disabled"}, "attn": {"enabled": False}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_sample_from_an_hf_folder_with_attention_dump(folders, tmp_path, name):
    dump = tmp_path / "dump"
    proc = run_cli(["sample.py", "--ckpt", str(folders[name]), "--prompt", PROMPT, "--temperature", "0",
                    "--max-new-tokens", "12", "--dump-attn", "all", "--dump-dir", str(dump)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = open_pretrained(str(folders[name]))
    model = source.build()
    ids = source.tokenizer.prompt_ids(PROMPT)
    idx = torch.tensor([ids])
    out = generate(model, idx, 12, temperature=0.0, stop_token=source.tokenizer.eot)[0].tolist()
    assert proc.stdout == source.tokenizer.decode(out) + "\n"
    saved = np.load(dump / "attn.npz")
    maps = model.attention_maps(idx)
    for layer in range(model.config.n_layer):
        np.testing.assert_allclose(saved[f"layer_{layer}"], maps[layer][0].numpy(), atol=1e-6)
    assert list(saved["tokens"]) == source.tokenizer.token_strings(ids)
    if name == "llama":
        assert ids[0] == source.tokenizer.bos == 1 and " animal" in list(saved["tokens"])


def test_init_from_an_hf_folder_through_train_py(folders, tmp_path):
    """Two steps at a learning rate too small to move the weights: the run must end where the source began
    (a run that ignored init_from would hold random weights), with the source's tokenizer beside it."""
    config = run_config(tmp_path / "run.yaml", tmp_path / "run", folders["text"], lr=1e-9, min_lr=0.0,
                        init_from=str(folders["llama"]))
    proc = run_cli(["train.py", str(config)], env_extra={"ATTNGPT_DATA_DIR": str(folders["data"])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting from the weights of" in proc.stdout + proc.stderr
    source = open_pretrained(str(folders["llama"])).build()
    trained = open_pretrained(str(tmp_path / "run"))
    assert trained.config == source.config
    after = load_file(trained.folder / "model.safetensors")
    for name, tensor in source.state_dict().items():
        if name in after:
            assert torch.allclose(after[name], tensor, atol=1e-6), name
    assert (trained.folder / "tokenizer.json").read_bytes() == (folders["llama"] / "tokenizer.json").read_bytes()
    assert trained.tokenizer.eot == 2 and trained.tokenizer.bos == 1
    # the model shape comes from the source: a contradicting model key is refused, naming it
    bad = run_cli(["train.py", str(config), f"out_dir={tmp_path / 'other'}", "model.d_model=64"],
                  env_extra={"ATTNGPT_DATA_DIR": str(folders["data"])})
    assert_one_line_error(bad, "train.py", "model.d_model=64 contradicts train.init_from", "whose d_model is 32",
                          "remove model.d_model")


@pytest.fixture
def data_env(folders, monkeypatch):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(folders["data"]))
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_init_from_gpt2_fine_tunes_on_gpt2_bpe(folders, tmp_path, data_env):
    cfg = load_run_config(run_config(tmp_path / "ft.yaml", tmp_path / "ft", folders["text"], lr=1e-2,
                                     init_from=str(folders["gpt2"]), max_iters=3))
    result = train(cfg)
    start = open_pretrained(str(folders["gpt2"])).build()
    assert result.model.config.vocab_size == 50257 and result.model.config.bias
    assert result.model.config.norm_eps == 1e-5 and result.model.config.block_size == 64
    # three AdamW steps of lr 1e-2 move each weight by at most ~0.03 from the source's; a run that started from
    # scratch would differ by far more (the source's q/k weights are 15x GPT-2's init scale)
    moved = max((a - b).abs().max().item() for a, b in zip(result.model.state_dict().values(),
                                                             start.state_dict().values()))
    assert 0 < moved < 0.2
    spec = json.loads((tmp_path / "ft" / "latest" / "config.json").read_text())["tokenizer"]
    assert spec == {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257}


def test_init_from_an_attngpt_run_on_other_data_keeps_its_char_vocabulary(folders, tmp_path, data_env):
    first = tmp_path / "a.txt"
    first.write_text("abcdefgh ijklmnop\n" * 400, encoding="utf-8")
    base = {"model": {"block_size": 16, "n_layer": 1, "n_head": 2, "d_model": 16}}
    path = run_config(tmp_path / "a.yaml", tmp_path / "a", first)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **base}))
    train(load_run_config(path))
    second = tmp_path / "b.txt"
    second.write_text("fade a bad cab\n" * 400, encoding="utf-8")  # fewer characters than the run's vocabulary
    cfg = load_run_config(run_config(tmp_path / "b.yaml", tmp_path / "b", second, lr=1e-9, init_from=str(tmp_path / "a")))
    result = train(cfg)
    source = open_pretrained(str(tmp_path / "a"))
    assert result.model.config == source.config
    assert result.model.state_dict()["tok_emb.weight"].allclose(source.build().state_dict()["tok_emb.weight"], atol=1e-6)
    assert json.loads((tmp_path / "b" / "latest" / "config.json").read_text())["tokenizer"]["chars"] == \
        source.tokenizer.chars == "\n abcdefghijklmnop"
    third = tmp_path / "c.txt"
    third.write_text("xyz? " * 400, encoding="utf-8")
    cfg = load_run_config(run_config(tmp_path / "c.yaml", tmp_path / "c", third, init_from=str(tmp_path / "a")))
    with pytest.raises(UserError, match=r"character\(s\) the char tokenizer does not know: 'x', 'y', 'z', '\?'"):
        train(cfg)


def test_convert_cli_to_hf_and_from_hf(folders, tmp_path):
    transformers = transformers_or_skip()
    proc = run_cli(["convert.py", "from-hf", str(folders["llama"]), str(tmp_path / "attngpt")])
    assert proc.returncode == 0 and "wrote an attngpt checkpoint" in proc.stdout, proc.stderr[-2000:]
    proc = run_cli(["convert.py", "to-hf", str(tmp_path / "attngpt"), str(tmp_path / "hf")])
    assert proc.returncode == 0 and "wrote LlamaForCausalLM" in proc.stdout, proc.stderr[-2000:]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([open_pretrained(str(tmp_path / "hf")).tokenizer.prompt_ids(PROMPT)])
    ours = open_pretrained(str(tmp_path / "attngpt")).build()
    with torch.no_grad():
        assert (ours(idx)[0] - model(idx).logits).abs().max().item() <= 1e-4
    forced = run_cli(["convert.py", "to-hf", str(tmp_path / "attngpt"), str(tmp_path / "hf"), "--force"])
    assert forced.returncode == 0 and not list(tmp_path.glob(".hf.*")), forced.stderr[-2000:]

"""Fine-tuning at a shorter context: train.init_from with a model.block_size below the source's
(training/init_from.py, pretrained.load.crop_block_size). The cropped model computes exactly what the source does on
every input its window holds; a run's checkpoints hold the smaller block_size, and sample.py and
convert.py to-hf use it; a larger block_size is refused. Sources: tiny local GPT-2 and Llama folders
(tests/hf_models.py) and an attngpt checkpoint with learned positions."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.hf_models import LLAMA_TEXT, hf_logits, make_gpt2, make_llama, transformers_or_skip
from tests.helpers import run_cli

transformers = transformers_or_skip()

from common.errors import UserError  # noqa: E402
from data.tokenizer import CharTokenizer  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from pretrained.checkpoint import save_model  # noqa: E402
from model.generate import generate  # noqa: E402
from pretrained.load import crop_block_size  # noqa: E402
from pretrained.load import open_pretrained  # noqa: E402
from training.config import load_run_config  # noqa: E402
from training.trainer import train  # noqa: E402

FULL, BLOCK = 64, 16  # the sources' positions, and the context the runs here train at
PROMPT = "ROMEO: But, soft! what light through yonder window breaks? It is the east"  # > BLOCK GPT-2 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shorter_context")
    text = root / "corpus.txt"
    text.write_text("\n".join(LLAMA_TEXT * 10) + "\n", encoding="utf-8")
    chars = "".join(sorted(set(text.read_text(encoding="utf-8"))))
    torch.manual_seed(3)
    learned = GPT(ModelConfig(vocab_size=len(chars), block_size=FULL, n_layer=2, n_head=2, d_model=16,
                              pos="learned", bias=True))
    with torch.no_grad():  # positions that matter: random init gives them too little weight to show in the logits
        learned.pos_emb.weight.mul_(20)
    save_model(learned, root / "attngpt", {"tokenizer": CharTokenizer(chars).to_json()})
    return {"gpt2": make_gpt2(root / "gpt2", seed=7, n_positions=FULL),
            "llama": make_llama(root / "llama", seed=8, max_position_embeddings=FULL),
            "attngpt": root / "attngpt", "text": text, "data": root / "data"}


@pytest.mark.parametrize("name", ["gpt2", "llama", "attngpt"])
def test_a_cropped_model_computes_what_the_full_one_does_within_its_window(folders, name):
    """Every length up to the window, exactly (the same weights, the same positions); the learned table is the
    source's first BLOCK rows; a longer input is refused, not run on positions the model does not have."""
    source = open_pretrained(str(folders[name]))
    assert source.config.block_size == FULL
    full = source.build()
    cropped = source.build_for(dataclasses.replace(source.config, block_size=BLOCK)).eval()
    generator = torch.Generator().manual_seed(0)
    for length in (1, 5, BLOCK):
        idx = torch.randint(0, source.tokenizer.vocab_size, (2, length), generator=generator)
        with torch.no_grad():
            assert torch.equal(cropped(idx)[0], full(idx)[0]), length
    if name != "attngpt":  # and the source as transformers computes it
        with torch.no_grad():
            assert (cropped(idx)[0] - hf_logits(folders[name], idx)).abs().max().item() <= 1e-4
    if source.config.pos == "learned":
        assert cropped.pos_emb.weight.shape == (BLOCK, source.config.d_model)
        assert torch.equal(cropped.pos_emb.weight, full.pos_emb.weight[:BLOCK])
    else:
        assert cropped.rope_freqs.shape[0] == BLOCK and torch.equal(cropped.rope_freqs, full.rope_freqs[:BLOCK])
    with pytest.raises(ValueError, match=f"longer than block_size={BLOCK}"):
        cropped(torch.zeros(1, BLOCK + 1, dtype=torch.long))


def test_crop_block_size_keeps_the_first_rows_and_refuses_more_than_the_table():
    positions = torch.arange(12.0).reshape(6, 2)
    state = {"pos_emb.weight": positions, "tok_emb.weight": torch.ones(3, 2)}
    cropped = crop_block_size(state, 4)
    assert torch.equal(cropped["pos_emb.weight"], positions[:4]) and cropped["tok_emb.weight"] is state["tok_emb.weight"]
    assert crop_block_size(state, 6) is state and crop_block_size({"x": positions}, 2) == {"x": positions}  # RoPE
    for size in (0, 7):
        with pytest.raises(ValueError, match="the weights hold 6 positions"):
            crop_block_size(state, size)


def run_config(path: Path, folders: dict[str, Path], out_dir: Path, model: dict, **train_settings) -> Path:
    """A small fine-tuning config on the local corpus, with the `model:` keys given (block_size)."""
    config = {"out_dir": str(out_dir), "device": "cpu", "dtype": "float32",
              "model": model, "data": {"source": "text", "path": str(folders["text"])},
              "train": {"batch_size": 4, "max_iters": 2, "warmup_iters": 0, "log_interval": 1, "peak_flops": 1e12,
                        **train_settings},
              "eval": {"interval": 2, "iters": 1}, "wandb": {"mode": "disabled"}, "attn": {"enabled": False}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_init_from_gpt2_at_a_shorter_context_through_train_sample_and_convert(folders, tmp_path):
    """train.py at model.block_size 16 from a GPT-2 folder of 64 positions, at a learning rate too small to move
    the weights: the checkpoint holds block_size 16 and the source's first 16 positions, so its logits are the
    source's on inputs within the window; sample.py works in that window; convert.py to-hf writes n_positions
    16, and transformers' model from it computes what the full source does within the window."""
    run = tmp_path / "run"
    config = run_config(tmp_path / "ft.yaml", folders, run, {"block_size": BLOCK}, lr=1e-9, min_lr=0.0,
                        init_from=str(folders["gpt2"]))
    env = {"ATTNGPT_DATA_DIR": str(folders["data"])}
    proc = run_cli(["train.py", str(config)], env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"context cropped to {BLOCK} of its {FULL}" in proc.stderr
    for name in ("best", "latest"):
        assert json.loads((run / name / "config.json").read_text())["model"]["block_size"] == BLOCK
    source = open_pretrained(str(folders["gpt2"]))
    full, trained = source.build(), open_pretrained(str(run)).build()
    assert trained.config == dataclasses.replace(full.config, block_size=BLOCK)
    idx = torch.tensor([source.tokenizer.encode(PROMPT)[:BLOCK]])
    with torch.no_grad():
        assert (trained(idx)[0] - full(idx)[0]).abs().max().item() <= 1e-5

    sampled = run_cli(["sample.py", "--ckpt", str(run), "--prompt", PROMPT, "--temperature", "0",
                       "--max-new-tokens", "6"])
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert f"the model sees at most block_size={BLOCK}" in sampled.stderr  # the prompt is longer than the window
    ids = torch.tensor([source.tokenizer.prompt_ids(PROMPT)[-BLOCK:]])
    assert sampled.stdout == source.tokenizer.decode(generate(trained, ids, 6, temperature=0.0)[0].tolist()) + "\n"

    converted = run_cli(["convert.py", "to-hf", str(run), str(tmp_path / "hf")])
    assert converted.returncode == 0, converted.stderr[-2000:]
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["n_positions"] == hf_config["n_ctx"] == BLOCK
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["model_max_length"] == BLOCK
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert exported.transformer.wpe.weight.shape[0] == BLOCK
    with torch.no_grad():
        assert (exported(idx).logits - hf_logits(folders["gpt2"], idx)).abs().max().item() <= 1e-5


def test_a_cropped_run_resumes_at_its_block_size_and_refuses_another(folders, tmp_path, monkeypatch):
    """A resume reads the shape from the run's own checkpoint (block_size 16), and the same config continues
    it; a model.block_size other than the checkpoint's is refused, as any other shape change."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(folders["data"]))
    run = tmp_path / "run"
    path = run_config(tmp_path / "ft.yaml", folders, run, {"block_size": BLOCK}, init_from=str(folders["llama"]))
    first = train(load_run_config(path))
    assert first.model.config.block_size == BLOCK and first.step == 2
    resumed = train(load_run_config(path, ["train.max_iters=4"]))
    assert resumed.step == 4 and resumed.model.config.block_size == BLOCK
    with pytest.raises(UserError, match=f"different model \\(block_size {BLOCK} vs 8\\)"):
        train(load_run_config(path, ["train.max_iters=6", "model.block_size=8"]))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_block_size_longer_than_the_source_is_refused_naming_both(folders, tmp_path, monkeypatch, name):
    """Learned or RoPE, the source has no positions beyond its own: refused before any data or model is made."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(folders["data"]))
    path = run_config(tmp_path / "ft.yaml", folders, tmp_path / "run", {"block_size": FULL + 1},
                      init_from=str(folders[name]))
    with pytest.raises(UserError, match=f"model.block_size={FULL + 1} is longer than the {FULL} positions of "
                                        f"train.init_from .*set model.block_size to {FULL} or less"):
        train(load_run_config(path))
    assert not (tmp_path / "run" / "latest").exists()

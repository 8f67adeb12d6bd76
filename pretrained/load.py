"""`open_pretrained(SRC)`: what a source holds (shape, tokenizer), read without its weights; then
`.build()` for a model to sample from, `.build_for(config)` for one to train (train.init_from).

SRC, tried in this order:
    an attngpt checkpoint folder, or a run's out_dir (its best/, else latest/)
    a Hugging Face model folder (a config.json with model_type / architectures, safetensors weights)
    a hub id (`gpt2`, `openai-community/gpt2`, `TinyLlama/TinyLlama-1.1B-Chat-v1.0`): its config, weights and
    tokenizer files are fetched into the Hugging Face cache (or found there, also offline)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.json_file import read_json
from data.hf_tokenizer import tokenizer_for_hf_folder
from data.tokenizer import tokenizer_from_json
from pretrained.checkpoint import (CONFIG_FILE, MAX_CONFIG_BYTES, WEIGHTS_FILE, CheckpointError, build_model,
                                   find_checkpoint, load_checkpoint, read_config, read_weights)
from model.config import ModelConfig
from model.gpt import GPT
from pretrained.memory import check_fits_in_memory
from pretrained.hf.config_map import hf_model_type
from pretrained.hf.load import check_hf_weights, read_hf_model_config, read_hf_state
from pretrained.hf.source import download, is_hf_config, looks_like_hub_id

DUMP_DIR = Path("attn_dump")


@dataclass
class Pretrained:
    src: str  # as the user gave it
    kind: str  # "attngpt" | "hf"
    folder: Path  # the checkpoint folder or the HF model folder (in the HF cache for a hub id)
    config: ModelConfig
    tokenizer: Any  # data.tokenizer.Tokenizer
    hf_config: dict[str, Any] | None = None
    remedy: str = ""  # what a damaged source's error message advises
    path: Path | None = None  # what the user named (a run's out_dir, or the folder itself): build() reads it again

    @property
    def label(self) -> str:
        return self.src if self.kind == "hf" else str(self.folder)

    def default_dump_dir(self) -> Path:
        """Where sample.py --dump-attn writes by default: ./attn_dump, never into a run's folder (a reader never
        writes there) nor into the hub cache; for a Hugging Face model ./attn_dump/<name>."""
        if self.kind == "attngpt":
            return DUMP_DIR
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.src.strip("/")).strip("._")
        return DUMP_DIR / (name or "hf")

    def build(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = torch.float32) -> GPT:
        """The model with the source's weights, in eval mode (dtype None: as stored), refused before it is
        allocated when it cannot fit in the device's memory."""
        if self.kind == "attngpt":
            try:  # looked up again from `path`: a run may have swapped its checkpoint meanwhile
                self.folder, model, _ = load_checkpoint(self.path or self.folder, device=device)
            except CheckpointError as e:
                raise CheckpointError(f"{e}; {self.remedy}") from None
            return model if dtype is None else model.to(dtype)
        check_fits_in_memory(self.config, device, source=f"'{self.folder / CONFIG_FILE}'")
        return build_model(self.config, read_hf_state(self.folder, self.hf_config, self.config, dtype), device)

    def build_for(self, config: ModelConfig) -> GPT:
        """A GPT(config) in float32 and train mode holding the source's weights, for training: `config` is the
        source's shape (dropout and attn_impl may differ) or of a shorter block_size, its learned positions then the
        first rows of the source's (crop_block_size). Built on the meta device and given the weights, as `build`
        is: no random initialisation drawn only to be overwritten (GPT-2 small's takes ~1.6 s on a CPU)."""
        if self.kind == "attngpt":
            try:
                state = read_weights(self.folder / WEIGHTS_FILE, self.config)
            except CheckpointError as e:
                raise CheckpointError(f"{e}; {self.remedy}") from None
            state = {name: tensor.float() for name, tensor in state.items()}
        else:
            state = read_hf_state(self.folder, self.hf_config, self.config, torch.float32)
        return build_model(config, crop_block_size(state, config.block_size)).train()


def is_hf_folder(path: Path) -> bool:
    """A local folder holding a Hugging Face model's config.json (else, if anything, an attngpt checkpoint)."""
    config = path / CONFIG_FILE
    try:  # bounded: a 1 TB config.json is refused from its size
        return config.is_file() and is_hf_config(read_json(config, MAX_CONFIG_BYTES, CONFIG_FILE))
    except UserError:
        return False  # read_config then says what is wrong with it


def open_pretrained(src: str | Path, what: str = "--ckpt", hub: bool = True, remedy: str | None = None) -> Pretrained:
    """Find and read SRC (module doc); `what` names the setting it came from, for the messages; hub=False
    never tries the hub (a default path); `remedy` replaces the advice for a damaged checkpoint. Bad input
    raises UserError or CheckpointError with one line."""
    text = str(src)
    remedy = remedy or f"pass {what} an intact checkpoint (a run's out_dir, or its best/ or latest/)"
    path = Path(text).expanduser()
    if path.exists() or not hub:
        if is_hf_folder(path):
            return _open_hf(path, text, remedy)
        try:
            folder = find_checkpoint(path)
        except CheckpointError:
            if what == "--ckpt":
                raise  # its own message: train one first, or pass --ckpt ...
            raise CheckpointError(f"no checkpoint or Hugging Face model at '{text}': pass {what} a run's out_dir, a "
                                  f"checkpoint folder, a Hugging Face model folder or a hub id") from None
        return _open_attngpt(folder, remedy, path)
    if looks_like_hub_id(text):
        return _open_hf(download(text), text, remedy)
    if what == "--ckpt":
        find_checkpoint(path)  # raises its own message: train one first, or pass --ckpt ...
    raise CheckpointError(f"no checkpoint at '{text}': pass {what} a run's out_dir, a checkpoint folder, a Hugging "
                          f"Face model folder or a hub id (e.g. gpt2)")


def _open_attngpt(folder: Path, remedy: str, path: Path | None = None) -> Pretrained:
    try:
        payload = read_config(folder)
    except CheckpointError as e:
        raise CheckpointError(f"{e}; {remedy}") from None
    tokenizer = tokenizer_from_json(payload.get("tokenizer"), base_dir=folder,
                                    remedy=f"the tokenizer in {folder / CONFIG_FILE} is damaged: {remedy}")
    config = ModelConfig.from_dict(payload["model"])
    _check_vocab(config, tokenizer, folder, remedy)
    return Pretrained(src=str(folder), kind="attngpt", folder=folder, config=config, tokenizer=tokenizer,
                      remedy=remedy, path=path)


def _open_hf(folder: Path, src: str, remedy: str) -> Pretrained:
    hf_config, config = read_hf_model_config(folder)  # validated, and a model that fits in memory
    where = str(folder / CONFIG_FILE)
    check_hf_weights(folder, hf_config, config)  # headers only: a folder without (fitting) weights fails here
    tokenizer = tokenizer_for_hf_folder(folder, hf_config, hf_model_type(hf_config, where), name=src)
    _check_vocab(config, tokenizer, folder, remedy)
    return Pretrained(src=src, kind="hf", folder=folder, config=config, tokenizer=tokenizer, hf_config=hf_config,
                      remedy=remedy)


def _check_vocab(config: ModelConfig, tokenizer: Any, folder: Path, remedy: str) -> None:
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(f"the tokenizer of '{folder}' has {tokenizer.vocab_size} tokens but the model only "
                        f"{config.vocab_size} (model.vocab_size): its config and tokenizer do not belong together; "
                        f"{remedy}")


def crop_block_size(state: dict[str, torch.Tensor], block_size: int) -> dict[str, torch.Tensor]:
    """A GPT's weights for the same model at a shorter context (fine-tuning GPT-2 at the context a CPU affords):
    learned positions keep the first block_size rows of their table. Nothing else stored depends on the
    context (RoPE's table is derived, not saved), so GPT(config at block_size) holding the result computes, on
    every input of up to block_size tokens, exactly what the full model computes."""
    positions = state.get("pos_emb.weight")  # (source block_size, d_model); absent with RoPE
    if positions is None or positions.shape[0] == block_size:
        return state
    if not 1 <= block_size < positions.shape[0]:
        raise ValueError(f"block_size={block_size}: the weights hold {positions.shape[0]} positions; a crop keeps "
                         f"1 to {positions.shape[0]} of them")
    return {**state, "pos_emb.weight": positions[:block_size].clone()}  # a copy: the full table can be freed

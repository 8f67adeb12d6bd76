"""A Hugging Face folder -> an attngpt GPT with the same weights (after the renames, transposes and RoPE
row permutation of gpt2_weights / llama_weights). Before anything is built, even on the meta device: config.json
is validated (config_map) and its model checked against memory; the weights' headers then against config.json
(every name, shape and dtype) before any tensor is read."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from common.errors import UserError
from model.config import ModelConfig
from model.gpt import GPT
from pretrained.checkpoint import weights_to_save
from pretrained.hf import gpt2_weights, llama_weights
from pretrained.hf.config_map import hf_model_type, model_config_from_hf
from pretrained.hf.source import CONFIG, read_hf_config, read_tensors, tensor_infos, weight_files
from pretrained.memory import check_fits_in_memory
from pretrained.safetensors_file import FLOAT_DTYPES, layer_count


def weights_module(kind: str) -> ModuleType:
    return gpt2_weights if kind == "gpt2" else llama_weights


def read_hf_model_config(folder: Path) -> tuple[dict[str, Any], ModelConfig]:
    """(config.json dict, the ModelConfig it describes) for a Hugging Face folder, validated, of a model that fits
    in this machine's memory (where it is built first, whatever the device it goes to)."""
    hf_config = read_hf_config(folder)
    config = model_config_from_hf(hf_config, str(folder / CONFIG))
    check_fits_in_memory(config, "cpu", source=f"'{folder / CONFIG}'")
    return hf_config, config


@dataclass
class WeightPlan:
    """What to read from a checked folder: files, stored name -> HF name, and whether a spare tied head is stored."""
    kind: str
    files: list[Path]
    wanted: dict[str, str]
    spare_head: bool


def check_hf_weights(folder: Path, hf_config: dict[str, Any], config: ModelConfig) -> WeightPlan:
    """Check the folder's weights against `config` (from its config.json) from the file headers alone:
    every tensor present, none unexpected, every shape right, every weight floating-point. The layer count
    comes first: the expected names come from a model built on the meta device, layer by layer."""
    kind = hf_model_type(hf_config, str(folder / CONFIG))
    module = weights_module(kind)
    files = weight_files(folder)
    stored = {module.normalize_name(name): (name, info)  # HF name -> (name in the file, dtype and shape)
              for name, (info, _) in tensor_infos(files).items() if not module.is_buffer(name)}
    layers = layer_count(stored, module.LAYER_NAME)
    if layers != config.n_layer:
        raise UserError(f"'{folder / CONFIG}' contradicts the weights beside it ({config.n_layer} layers in the "
                        f"config, {layers} in the weights): the folder is damaged or mixes two models")
    with torch.device("meta"):  # the HF name and shape of every tensor the HF model equal to `config` stores
        expected = {n: tuple(t.shape) for n, t in module.to_hf(weights_to_save(GPT(config)), config).items()}
    spare_head = config.tie_embeddings and "lm_head.weight" in stored  # some tied checkpoints store it anyway
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected) - ({"lm_head.weight"} if spare_head else set()))
    wrong = [f"{n} {stored[n][1].shape} vs {expected[n]}"
             for n in expected if n in stored and stored[n][1].shape != expected[n]]
    if missing or unexpected or wrong:
        details = "; ".join(filter(None, [
            f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}" if missing else "",
            f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}" if unexpected else "",
            f"shape {', '.join(wrong[:2])}" if wrong else ""]))
        raise UserError(f"'{folder / CONFIG}' contradicts the weights beside it ({details}): the folder is "
                        f"damaged or mixes two models")
    read = [*expected, *(["lm_head.weight"] if spare_head else [])]
    not_float = [f"{n} ({stored[n][1].dtype})" for n in read if stored[n][1].dtype not in FLOAT_DTYPES]
    if not_float:
        raise UserError(f"the weights beside '{folder / CONFIG}' store {', '.join(not_float[:3])}"
                        f"{' ...' if len(not_float) > 3 else ''}, not floating-point weights: the folder is damaged")
    return WeightPlan(kind=kind, files=files, wanted={stored[n][0]: n for n in read}, spare_head=spare_head)


def read_hf_state(folder: Path, hf_config: dict[str, Any], config: ModelConfig,
                  dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
    """The folder's weights under attngpt's names, checked first (check_hf_weights); dtype None keeps the stored one."""
    plan = check_hf_weights(folder, hf_config, config)
    hf_state = {plan.wanted[name]: t for name, t in read_tensors(plan.files, set(plan.wanted), dtype)}
    embedding = "transformer.wte.weight" if plan.kind == "gpt2" else "model.embed_tokens.weight"
    if plan.spare_head and not torch.equal(hf_state.pop("lm_head.weight"), hf_state[embedding]):
        raise UserError(f"'{folder / CONFIG}' says tie_word_embeddings=true, but the stored lm_head.weight differs "
                        f"from the token embedding: the config contradicts the weights")
    return weights_module(plan.kind).from_hf(hf_state, config)



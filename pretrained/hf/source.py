"""Where a Hugging Face model comes from: a local folder (what `save_pretrained` writes) or a hub id,
downloaded once into the Hugging Face cache through huggingface_hub; and reading its config.json and
safetensors weights (one file, or shards listed in model.safetensors.index.json).

Reading never writes into the folder, and never unpickles: a folder with only pytorch_model.bin is refused.
Everything is checked at the boundary: JSON files bounded in size before they are read (MAX_CONFIG_BYTES,
MAX_INDEX_BYTES) and parsed strictly (common/json_file.py); weights files complete (pretrained/safetensors_file.py),
their headers read before any tensor (names, shapes, dtypes), and every tensor finite.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import torch

from common.errors import UserError
from common.json_file import read_json
from common.schema import DictOf, Fields, Str, check
from pretrained.checkpoint import CONFIG_FILE as CONFIG, MAX_CONFIG_BYTES, WEIGHTS_FILE as WEIGHTS
from pretrained.safetensors_file import TensorInfo, open_safetensors, read_header

INDEX = "model.safetensors.index.json"
# what a download fetches: config, weights (top level only) and tokenizer files, nothing else in the repo
HUB_FILES = [CONFIG, "generation_config.json", WEIGHTS, INDEX, "model-*-of-*.safetensors", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"]
MAX_INDEX_BYTES = 16_000_000  # a shard index lists every tensor once: some hundred kB for the largest models
INDEX_SCHEMA = Fields({"weight_map": DictOf(Str())}, required=("weight_map",))  # tensor name -> shard file
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def looks_like_hub_id(text: str) -> bool:
    """`gpt2`, `openai-community/gpt2`: one or two names of letters, digits, '.', '_', '-'."""
    return bool(_HUB_ID.match(text)) and ".." not in text and "--" not in text and not text.endswith(".")


def is_hf_config(payload: Any) -> bool:
    """A transformers config.json (attngpt's has a "model" section instead)."""
    return isinstance(payload, dict) and "model" not in payload and ("model_type" in payload
                                                                      or "architectures" in payload)


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if not path.is_file():
        raise UserError(f"no {CONFIG} in '{folder}': not a Hugging Face model folder")
    payload = read_json(path, MAX_CONFIG_BYTES, CONFIG)
    if not is_hf_config(payload):
        raise UserError(f"'{path}' is not a Hugging Face model config (no model_type or architectures)")
    return payload


def download(repo_id: str) -> Path:
    """The hub repo's config, weights and tokenizer files, from the local Hugging Face cache when they are
    there (also offline), else downloaded into it. Any failure is one line: could not fetch it."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"'{repo_id}' is not a local folder, and fetching it from the Hugging Face hub needs "
                        f"huggingface_hub: pip install -e '.[hf]'") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown repo, gated, network errors: many types
        reason = " ".join(str(e).split()).split(". ")[0] or type(e).__name__  # the first sentence says it
        reason = reason if len(reason) <= 200 else reason[:197] + "..."
        raise UserError(f"could not fetch '{repo_id}' from the Hugging Face hub ({type(e).__name__}: {reason}), and "
                        f"it is no local folder: pass a local folder (a run's out_dir, a checkpoint or a Hugging Face "
                        f"model folder), or check the id and the network (HF_HUB_OFFLINE=1 allows only the "
                        f"local cache)") from None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files holding the model: model.safetensors, or every shard the index lists."""
    index = folder / INDEX
    if index.is_file():
        payload = read_json(index, MAX_INDEX_BYTES, INDEX)
        check(payload, INDEX_SCHEMA, f"'{index}'", "the shard index is damaged: fetch the model again")
        if not payload["weight_map"]:
            raise UserError(f"'{index}' has an empty weight_map: the shard index is damaged")
        names = sorted(set(payload["weight_map"].values()))
        if any(Path(n).name != n for n in names):
            raise UserError(f"'{index}' lists shard files outside its folder: refusing it")
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise UserError(f"'{folder}' lacks shard(s) {', '.join(missing[:3])} listed in {INDEX}: the download "
                            f"is incomplete")
        return [folder / n for n in names]
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pth")]
    extra = (f" (it has {', '.join(sorted(pickled)[:2])}: pickle files, which attngpt never loads; re-save the "
             f"model with transformers' save_pretrained, which writes safetensors)") if pickled else ""
    raise UserError(f"no {WEIGHTS} or {INDEX} in '{folder}'{extra}")


def tensor_infos(files: list[Path]) -> dict[str, tuple[TensorInfo, Path]]:
    """name -> (dtype and shape, file) from the headers only (no tensor is read)."""
    infos: dict[str, tuple[TensorInfo, Path]] = {}
    for path in files:
        for name, info in read_header(path).items():
            if name in infos:
                raise UserError(f"tensor {name} is stored twice ({infos[name][1].name} and {path.name})")
            infos[name] = (info, path)
    return infos


def read_tensors(files: list[Path], names: set[str], dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors `names` (a subset of the files' names), cast to dtype, each checked finite."""
    for path in files:
        with open_safetensors(path) as f:
            for name in (n for n in f.keys() if n in names):
                try:
                    tensor = f.get_tensor(name)
                except Exception as e:
                    raise UserError(f"weights file '{path}' is corrupted or truncated (tensor {name}: "
                                    f"{type(e).__name__})") from None
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    raise UserError(f"weights file '{path}' holds NaN or inf values (in {name})")
                yield name, tensor

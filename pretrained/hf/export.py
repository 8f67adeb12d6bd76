"""attngpt -> the Hugging Face layout: config.json, generation_config.json and model.safetensors that
`transformers.AutoModelForCausalLM.from_pretrained(folder)` loads as GPT2LMHeadModel or LlamaForCausalLM,
plus whatever tokenizer files the caller hands in.

A folder is written whole or not at all: everything goes into a temporary sibling folder, is fsynced, and
is renamed into place. Every folder written here holds CONVERT_MARK, which says so. An existing non-empty
OUT_DIR is refused, unless `force` and it is a folder written here before (it holds CONVERT_MARK and no
subfolder): then it is replaced, and only once the new one is complete. Never replaced or written into,
`force` or not: a source of the conversion (or a folder holding one, or inside one), and anything inside a
training run or a checkpoint or model folder (common/paths.py: `check_outside_runs`).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.paths import check_outside_runs, is_own_folder
from common.writes import fsync_dir, owning, write_file
from model.gpt import GPT
from pretrained.checkpoint import weights_to_save
from pretrained.hf.config_map import hf_architecture, hf_config_from_model
from pretrained.hf.load import weights_module


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights under HF names (tensors may share memory with the model's)."""
    return weights_module(hf_architecture(model.config)).to_hf(weights_to_save(model), model.config)


def hf_files(model: GPT, bos_id: int | None, eos_id: int | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors of model.safetensors, JSON files by name) of the HF folder equal to `model`."""
    config = hf_config_from_model(model.config, bos_id, eos_id)
    config["torch_dtype"] = str(model.tok_emb.weight.dtype).replace("torch.", "")  # the dtype written
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id}
    return hf_state_dict(model), {"config.json": config, "generation_config.json": generation}


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (e.g. gate and up, two halves of one fc_in): copy those."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


CONVERT_MARK = ".attngpt-convert.json"  # in every folder write_model_folder writes: what --force may replace


def check_out_dir(out_dir: Path, force: bool, sources: tuple[Path, ...] = ()) -> None:
    """Refuse (UserError) an OUT_DIR that would lose data or write where a reader must not (module doc)."""
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"OUT_DIR '{out_dir}' is a file: give a new folder")
    target = out_dir.resolve()
    for source in sources:
        src = Path(source).expanduser().resolve()
        if target == src or src in target.parents or target in src.parents:
            relation = ("is" if target == src else "lies inside" if src in target.parents else "holds")
            raise UserError(f"OUT_DIR '{out_dir}' {relation} the source '{source}': the conversion never writes "
                            f"over what it reads; give a new folder")
    check_outside_runs(out_dir, "OUT_DIR", "give a new folder outside it", own_mark=CONVERT_MARK)
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not force:
            raise UserError(f"OUT_DIR '{out_dir}' exists and is not empty: give a new folder, or pass --force to "
                            f"replace a folder convert.py wrote before")
        if not is_own_folder(out_dir, CONVERT_MARK):
            raise UserError(f"--force replaces only a folder convert.py wrote (it holds {CONVERT_MARK} and no "
                            f"subfolder), and '{out_dir}' is not one: give a new folder")


def write_model_folder(out_dir: str | Path, tensors: dict[str, torch.Tensor], json_files: dict[str, Any],
                       raw_files: dict[str, bytes] | None = None, force: bool = False,
                       sources: tuple[Path, ...] = (), about: str = "") -> Path:
    """Write model.safetensors + JSON files + raw files + CONVERT_MARK (saying `about`: what was converted from
    what) into OUT_DIR atomically (module doc); `sources`: the folders the conversion read."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir).expanduser()
    check_out_dir(out_dir, force, sources)
    json_files = {**json_files, CONVERT_MARK: {"written_by": "attngpt convert.py", "about": about,
                                               "note": "convert.py --force may replace this folder"}}
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with owning(tmp):  # a model folder once its weights are in: written by this process
            weights = _unshared(tensors)
            write_file(tmp / "model.safetensors", lambda f: save_file(weights, f.name, metadata={"format": "pt"}))
            for name, payload in json_files.items():
                write_file(tmp / name, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
            for name, data in (raw_files or {}).items():
                write_file(tmp / name, data)
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        fsync_dir(out_dir.parent)
    except (OSError, RuntimeError, ValueError) as e:  # disk full, permissions; safetensors raises its own types
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out_dir.exists():
            os.replace(old, out_dir)
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())[:160]
        raise UserError(f"could not write '{out_dir}' ({reason}); nothing was changed there") from None
    shutil.rmtree(old, ignore_errors=True)
    return out_dir

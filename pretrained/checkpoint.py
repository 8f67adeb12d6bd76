"""A model on disk: `model.safetensors` (weights) + `config.json` (ModelConfig and whatever the caller adds,
e.g. the tokenizer). Everything sampling needs, and nothing that runs code when read: safetensors and
JSON are data formats, unlike pickle.

A folder is read as untrusted input: config.json is bounded in size before it is read (MAX_CONFIG_BYTES),
parsed as strict JSON and validated (ModelConfig checks every field's type and range), and the model's size
is checked against memory before anything is built; the weights' header is checked (names, shapes, float
dtypes, the layer count) before a tensor is read.

Writing is not atomic here: callers write into a fresh folder and rename it (training/checkpoint.py).
Reading never writes: `find_checkpoint`, `load_checkpoint` and `load_model` rename, delete and create
nothing, so they are safe while a run is saving into the same folder; `load_checkpoint` reads again when a
save swapped the folder away mid-read.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from common.errors import UserError
from common.json_file import FileContentError, MissingFileError, read_json
from common.writes import owning, write_file
from model.config import ModelConfig
from model.gpt import GPT
from pretrained.memory import check_fits_in_memory
from pretrained.safetensors_file import FLOAT_DTYPES, TensorInfo, layer_count, not_float, read_header

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 4_000_000  # a checkpoint's config.json is a few kB (a large char vocabulary some hundred kB)
LAYER_NAME = re.compile(r"blocks\.(\d+)\.")  # the tensors of block i are named blocks.i.*
BEST = "best"  # a run's lowest-val-loss checkpoint: what sampling reads first
LATEST = "latest"  # a run's newest checkpoint: what a resume continues


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupted, or of another shape. The message says which."""


def weights_to_save(model: GPT) -> dict[str, torch.Tensor]:
    """Every state_dict tensor but a tied lm_head: what a model folder stores (renamed in Hugging Face's)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")  # the same tensor as tok_emb.weight; safetensors refuses shared storage
    return {name: tensor.detach().contiguous() for name, tensor in state.items()}


def save_model(model: GPT, directory: str | Path, extra: dict[str, Any] | None = None,
               files: dict[str, bytes] | None = None) -> None:
    """Write weights and config into `directory` (created if needed), and `files` beside them (e.g. the
    tokenizer.json that the config's tokenizer description names)."""
    write_model_files(Path(directory), weights_to_save(model), {"model": model.config.to_dict(), **(extra or {})},
                      files)


def write_model_files(directory: Path, weights: dict[str, torch.Tensor], config: dict[str, Any],
                      files: dict[str, bytes] | None = None) -> None:
    """model.safetensors, config.json and `files` in `directory`, each by common/writes.py (whole, never via a link)."""
    with owning(directory, "the model folder"):  # a model folder from its first file on: this process's
        write_file(directory / WEIGHTS_FILE, lambda f: save_file(weights, f.name, metadata={"format": "pt"}))
        write_file(directory / CONFIG_FILE, json.dumps(config, indent=2))
        for name, data in (files or {}).items():
            write_file(directory / name, data)


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder to read for `path`: the folder itself when it holds a config.json, else a run's
    out_dir's best/, else its latest/.

    A run swaps a new checkpoint in with two renames (`name` -> `.name.old`, `.name.tmp` -> `name`); a reader
    that arrives between them finds `name` missing and reads the complete `.name.old` where it lies. Only
    the training run itself, which owns the folder, ever moves it back. `name` is looked for again after
    `.name.old`: a save may finish between the two looks (and remove `.name.old`)."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return path
    for name in (BEST, LATEST):
        for candidate in (path / name, path / f".{name}.old", path / name):
            if (candidate / CONFIG_FILE).is_file():  # False for a path that is no folder
                return candidate
    raise CheckpointError(f"no checkpoint at '{path}': train one with `python train.py configs/small.yaml`, "
                          f"or pass --ckpt a run's out_dir or a checkpoint folder")


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[Path, GPT, dict[str, Any]]:
    """find_checkpoint + load_model, safe while the run is saving into the same out_dir: when the folder it
    read was swapped or removed meanwhile (its files vanished, or it is another folder now), it looks again,
    up to a few times, and reads the checkpoint now in place. A damaged checkpoint that stays put raises its
    CheckpointError at once. Returns (folder read, model in eval mode, config.json payload)."""
    for attempt in range(SWAP_RETRIES + 1):
        folder = find_checkpoint(path)
        before = _identity(folder)
        try:
            model, payload = load_model(folder, device)
        except CheckpointError:
            # a `.name.old` is on its way out: a save removes it file by file, so it may still stand, with its
            # config.json, while its weights are gone
            moving = folder.name.startswith(".") and folder.name.endswith(".old")
            # before None: the folder went away between being found and being looked at (a save's first
            # rename), which is a swap in progress, not a damaged checkpoint
            unchanged = before is not None and _identity(folder) == before
            if attempt == SWAP_RETRIES or (unchanged and not moving):
                raise
            continue
        if _identity(folder) == before:
            return folder, model, payload
    raise CheckpointError(f"the checkpoint at '{path}' kept changing while it was read (a run saving every "
                          f"few milliseconds?): pass --ckpt a checkpoint folder that is not being written")


SWAP_RETRIES = 3  # a save swaps in well under a second; two saves in a row during one read would be odd


def _identity(folder: Path) -> tuple[int, int, int | None] | None:
    """(device, inode) of the folder now at `folder`, and its config.json's inode (None without one); None if none."""
    try:
        st = folder.stat()
    except OSError:
        return None
    try:
        config_inode: int | None = (folder / CONFIG_FILE).stat().st_ino
    except OSError:
        config_inode = None
    return st.st_dev, st.st_ino, config_inode


def read_config(directory: str | Path, check_memory: bool = True) -> dict[str, Any]:
    """The checkpoint's config.json payload, checked (module doc): a `model` section that makes a valid
    ModelConfig of a model that fits in this machine's memory (check_memory False: a caller that builds only a
    model it has checked itself, of the same shape, as a resume does). Anything else raises CheckpointError."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"no {CONFIG_FILE} in '{directory}': not a checkpoint folder")
    try:
        payload = read_json(path, MAX_CONFIG_BYTES, CONFIG_FILE)
    except MissingFileError:  # removed since the check above (a run swapping its checkpoints)
        raise CheckpointError(f"no {CONFIG_FILE} in '{directory}': not a checkpoint folder") from None
    except FileContentError as e:
        raise CheckpointError(f"'{path}' is corrupted or not an attngpt config: it {e.problem}") from None
    try:
        if not isinstance(payload, dict):
            raise TypeError(f"it holds {type(payload).__name__}, not an object")
        config = ModelConfig.from_dict(payload["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"'{path}' is corrupted or not an attngpt config ({type(e).__name__}: {e})") from None
    if check_memory:  # host memory: every loader builds the model there first
        try:
            check_fits_in_memory(config, "cpu", source=f"'{path}'")
        except UserError as e:
            raise CheckpointError(str(e)) from None
    return payload


def load_model(directory: str | Path, device: torch.device | str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """(the GPT saved in `directory`, in eval mode, its config.json payload); missing, truncated or corrupted files
    and weights of another shape raise CheckpointError before the model is built (read_weights)."""
    directory = Path(directory)
    payload = read_config(directory)
    config = ModelConfig.from_dict(payload["model"])
    check_fits_in_memory(config, device, source=f"'{directory / CONFIG_FILE}'")
    state = read_weights(directory / WEIGHTS_FILE, config)
    return build_model(config, state, device), payload


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> GPT:
    """GPT(config) holding exactly `state`'s tensors: built on the meta device (no random init), then given them."""
    with torch.device("meta"):
        model = GPT(config)
    load_state(model, state, assign=True)
    return model.to(device).eval()  # .to() also rebuilds the RoPE table off the meta device (GPT._apply)


def load_state(model: GPT, state: dict[str, torch.Tensor], assign: bool = False) -> None:
    """Load an attngpt state (a tied head left out) into `model`, strictly."""
    result = model.load_state_dict(state, strict=False, assign=assign)
    tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:  # a bug in the mapping, not bad input
        raise RuntimeError(f"state does not fit the model: missing {result.missing_keys}, "
                           f"unexpected {result.unexpected_keys}")
    if model.config.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight


def read_weights(path: str | Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The safetensors weights at `path` of a GPT(config), but a tied lm_head, not yet in a model (a caller may crop
    them: pretrained.load.crop_block_size). Each name, shape and dtype is checked from the header first, against a
    model on the meta device once the layer count agrees (10**5 layers in a config beside 2 stored would build
    for minutes); each tensor read is finite."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file '{path}'")
    header = read_header(path, CheckpointError)
    stored = layer_count(header, LAYER_NAME)
    if stored != config.n_layer:
        raise CheckpointError(f"weights in '{path}' do not match the model in its config.json: n_layer "
                              f"{config.n_layer} in the config, {stored} layers in the weights")
    with torch.device("meta"):
        _check_header(header, GPT(config), path)
    try:
        state = load_file(str(path))
    except Exception as e:  # safetensors raises several types for a bad header or a short file
        raise CheckpointError(f"weights file '{path}' is corrupted or truncated ({type(e).__name__}: {e})") from None
    if {n: (str(t.dtype), tuple(t.shape)) for n, t in state.items()} != \
            {n: (str(FLOAT_DTYPES[i.dtype]), i.shape) for n, i in header.items()}:
        # a save replaced the file between the two reads: load_checkpoint looks again
        raise CheckpointError(f"weights file '{path}' changed while it was read")
    bad = [name for name, t in state.items() if not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(f"weights in '{path}' hold NaN or inf values (e.g. {bad[0]})")
    return state


def _check_header(header: dict[str, TensorInfo], model: GPT, path: Path) -> None:
    """The weights file holds exactly `model`'s tensors, of its shapes, as floating-point numbers."""
    expected = {name: tuple(t.shape) for name, t in weights_to_save(model).items()}
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    wrong_shape = [f"{n} {header[n].shape} vs model {expected[n]}"
                   for n in expected if n in header and header[n].shape != expected[n]]
    wrong_dtype = not_float(header)
    if missing or unexpected or wrong_shape or wrong_dtype:
        details = "; ".join(filter(None, [
            f"missing {', '.join(missing[:3])}" if missing else "",
            f"unexpected {', '.join(unexpected[:3])}" if unexpected else "",
            f"shape {', '.join(wrong_shape[:3])}" if wrong_shape else "",
            f"not floating-point weights: {', '.join(wrong_dtype[:3])}" if wrong_dtype else ""]))
        raise CheckpointError(f"weights in '{path}' do not match the model in its config.json: {details}")

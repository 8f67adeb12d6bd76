"""A safetensors file's header (names, dtypes, shapes), read before any tensor is: what a loader checks against the
model it builds. Opening a file with safetensors validates its layout against the file's size (a header of at
most 100 MB, every tensor's offsets inside the file, shape x dtype equal to its bytes, no gap, no overlap), so
a header cannot make a reader allocate more than the file holds; this module adds what safetensors leaves to
the caller: which dtypes are weights, and how many layers the names hold.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from common.errors import UserError

# the dtypes a weight may be stored in (read as float32, or kept); integers, bools and float8 (which needs a
# scale tensor to mean anything) are not weights
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors' name: F32, BF16, I64, ...
    shape: tuple[int, ...]


def open_safetensors(path: Path, error: type[Exception] = UserError):
    """safe_open(path), a damaged file raising `error` with one line naming it."""
    from safetensors import safe_open
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # bad header, short file, a pickle: several types
        reason = " ".join(str(e).split())[:160]
        raise error(f"weights file '{path}' is corrupted or truncated ({type(e).__name__}: {reason})") from None


def read_header(path: Path, error: type[Exception] = UserError) -> dict[str, TensorInfo]:
    """name -> TensorInfo of every tensor in the file, from its header only."""
    with open_safetensors(path, error) as f:
        out = {}
        for name in f.keys():
            tensor = f.get_slice(name)
            out[name] = TensorInfo(dtype=str(tensor.get_dtype()), shape=tuple(tensor.get_shape()))
        return out


def not_float(header: dict[str, TensorInfo], names: set[str] | None = None) -> list[str]:
    """'name (dtype)' for the tensors (of `names`, default all) not stored as floating-point weights."""
    return [f"{name} ({info.dtype})" for name, info in header.items()
            if (names is None or name in names) and info.dtype not in FLOAT_DTYPES]


def layer_count(names: list[str] | set[str], pattern: re.Pattern[str]) -> int:
    """How many distinct layers the tensor names hold: `pattern`'s first group is a layer index ('blocks.(\\d+).')."""
    return len({m.group(1) for m in map(pattern.match, names) if m})

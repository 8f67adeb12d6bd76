"""Which device a command runs on: shared by training, sampling and the benchmarks."""
from __future__ import annotations

import torch

from common.errors import UserError


def torch_version() -> tuple[int, int]:
    """The installed PyTorch's (major, minor): "2.4.1+cpu" -> (2, 4). Features that arrived later are chosen by it."""
    return tuple(int(part) for part in torch.__version__.split(".")[:2])


def resolve_device(name: str, setting: str = "device=") -> torch.device:
    """'auto' -> cuda > mps > cpu; an explicit device that this machine lacks is a UserError, whose advice
    is written as the caller's user sets a device: `setting` + value ("device=cpu", "--device cpu")."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device '{name}' is not a device name: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device '{name}' asked for, but this machine has no usable CUDA GPU: "
                            f"use {setting}cpu (or {setting}auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"device '{name}': this machine has {torch.cuda.device_count()} GPU(s)")
    elif device.type == "mps":
        if not mps:
            raise UserError(f"device '{name}' asked for, but MPS is not available here: use {setting}cpu")
    elif device.type != "cpu":
        raise UserError(f"device '{name}' is not supported: use auto, cpu, cuda, cuda:N or mps")
    return device

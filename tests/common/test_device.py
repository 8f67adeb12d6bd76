"""common/device.py: the installed PyTorch's version as (major, minor), and the device a command runs on -- auto
picks the best this machine has, an explicit device it lacks is one UserError line whose advice uses the
caller's way of setting it (`device=cpu` in a config, `--device cpu` on a command line)."""
from __future__ import annotations

import pytest
import torch

from common.device import resolve_device, torch_version
from common.errors import UserError


def test_torch_version_is_the_installed_major_and_minor():
    from packaging.version import Version
    assert torch_version() == Version(torch.__version__).release[:2]  # read by another parser


@pytest.mark.parametrize("version, expected", [("2.4.1+cpu", (2, 4)), ("2.13.0", (2, 13)), ("3.0.0a0+git1", (3, 0))])
def test_torch_version_reads_local_and_pre_release_versions(monkeypatch, version, expected):
    monkeypatch.setattr(torch, "__version__", version)
    assert torch_version() == expected


def test_auto_is_the_best_device_this_machine_has(monkeypatch):
    mps = getattr(torch.backends, "mps", None)
    for cuda, has_mps, expected in ((True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        if mps is not None:
            monkeypatch.setattr(mps, "is_available", lambda has_mps=has_mps: has_mps)
        elif has_mps:
            continue
        assert resolve_device("auto") == torch.device(expected)


def test_an_explicit_device_is_taken_as_named():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu:0") == torch.device("cpu:0")


@pytest.mark.parametrize("name, setting, says", [
    ("cuda", "device=", "device 'cuda' asked for, but this machine has no usable CUDA GPU: use device=cpu (or "
                        "device=auto)"),
    ("cuda:1", "--device ", "device 'cuda:1' asked for, but this machine has no usable CUDA GPU: use --device cpu"),
    ("gpu", "device=", "device 'gpu' is not a device name: use auto, cpu, cuda, cuda:N or mps"),
    ("meta", "device=", "device 'meta' is not supported: use auto, cpu, cuda, cuda:N or mps"),
])
def test_a_device_this_machine_lacks_is_one_line_in_the_callers_words(monkeypatch, name, setting, says):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as e:
        resolve_device(name, setting)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_a_gpu_index_past_the_machines_gpus_is_refused_naming_how_many_there_are(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(UserError, match=r"^device 'cuda:2': this machine has 2 GPU\(s\)$"):
        resolve_device("cuda:2")


def test_mps_asked_for_where_it_is_not_available_is_refused(monkeypatch):
    mps = getattr(torch.backends, "mps", None)
    if mps is None:
        pytest.skip("this PyTorch has no torch.backends.mps")
    monkeypatch.setattr(mps, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^device 'mps' asked for, but MPS is not available here: use --device cpu$"):
        resolve_device("mps", "--device ")

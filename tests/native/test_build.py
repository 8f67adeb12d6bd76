"""native/build.py: a build appears in the cache in one step and is reused; where none can be had (no compiler, a
failed build, a wrong probe product, switched off) there is no library, and a layer handed none keeps torch's
kernels; each probe passes its real kernel and fails one that computes wrong."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.nn as nn

import native.build as build
from model.decode_attention import DecodeAttention
from model.int8_matvec import Int8Matvec
from native.build import decode_attention_library, int8_matvec_library
from model.quantize import Int8Linear


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """int8_matvec_library() measured again against an empty cache folder of the test's own, and once more
    afterwards."""
    monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(tmp_path / "kernels"))
    int8_matvec_library.cache_clear()
    yield tmp_path / "kernels"
    monkeypatch.undo()
    int8_matvec_library.cache_clear()


def test_the_build_appears_in_one_step_and_is_reused(fresh_build, monkeypatch):
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    runs = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a[0]) or real_run(*a, **k))  # every process
    assert int8_matvec_library() is not None
    built = sorted(os.listdir(fresh_build))
    assert len(built) == 1 and built[0].startswith("int8_matvec-") and built[0].endswith(".so")  # no temporary left
    assert "-O3" in runs[0] and len(runs) == 1
    int8_matvec_library.cache_clear()
    assert int8_matvec_library() is not None and len(runs) == 1  # loaded from the cache, not compiled again


def test_no_compiler_a_failed_build_a_wrong_probe_or_switched_off_give_no_library(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert int8_matvec_library() is None
    monkeypatch.delenv("CC")
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    int8_matvec_library.cache_clear()
    monkeypatch.setattr(build, "compile_into", lambda cc, source, flags, target: False)
    assert int8_matvec_library() is None
    monkeypatch.undo()
    monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(fresh_build))
    int8_matvec_library.cache_clear()
    monkeypatch.setattr(build, "probe_exact", lambda lib: False)
    assert int8_matvec_library() is None
    monkeypatch.undo()
    monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(fresh_build))
    monkeypatch.setenv("ATTNGPT_NATIVE_KERNELS", "0")
    int8_matvec_library.cache_clear()
    assert int8_matvec_library() is None
    assert not Int8Linear.from_linear(nn.Linear(64, 8), "int8").use_native_kernel(int8_matvec_library())
    monkeypatch.delenv("ATTNGPT_NATIVE_KERNELS")
    assert build.built_library(fresh_build / "missing.c", build.bind_int8_matvec) is None


def test_the_probe_catches_a_kernel_that_sums_wrong(lib, monkeypatch):
    """The probe's worst case (codes at 255 and 1, weights +-127) passes here and fails a product off by one."""
    assert build.probe_exact(lib)
    real_call = Int8Matvec.__call__
    monkeypatch.setattr(Int8Matvec, "__call__", lambda self, x: real_call(self, x) + 1.0)
    assert not build.probe_exact(lib)


def test_the_cache_folder_is_the_one_named_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(tmp_path / "named"))
    assert build.cache_dir() == tmp_path / "named"
    monkeypatch.delenv("ATTNGPT_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "attngpt" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.cache_dir() == tmp_path / "home" / ".cache" / "attngpt" / "kernels"


def test_a_flag_set_that_does_not_build_gives_way_to_the_next(fresh_build, monkeypatch):
    """Where the compiler has no OpenMP (or no -march=native), the next flags build: one thread, the same
    numbers (the probe passed)."""
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    tried = []
    real = build.compile_into

    def without_openmp(cc, source, flags, target):
        tried.append(flags)
        return "-fopenmp" not in flags and real(cc, source, flags, target)
    monkeypatch.setattr(build, "compile_into", without_openmp)
    assert int8_matvec_library() is not None
    assert tried == list(build.FLAG_SETS[:2]) and len(os.listdir(fresh_build)) == 1


def test_the_attention_probe_catches_a_kernel_off_by_a_rounding_or_an_offset(attention_lib, monkeypatch):
    """The probe passes the real kernel; it fails one whose float32 result moves by 1e-4 relative (a score or a
    weight computed in a lower precision would), and one whose bfloat16 output is not its float32 one rounded."""
    assert build.probe_attention(attention_lib)
    real_call = DecodeAttention.__call__
    monkeypatch.setattr(DecodeAttention, "__call__", lambda self, q, k, v: real_call(self, q, k, v) * (1 + 1e-4))
    assert not build.probe_attention(attention_lib)

    def rounded_twice(self, q, k, v):  # bfloat16 output by way of float16: not one rounding of the float32 result
        if q.dtype == torch.float32:
            return real_call(self, q, k, v)
        return real_call(self, q.float(), k, v).to(torch.float16).to(q.dtype)
    monkeypatch.setattr(DecodeAttention, "__call__", rounded_twice)
    assert not build.probe_attention(attention_lib)


def test_the_attention_library_is_none_where_its_probe_fails_or_it_is_switched_off(monkeypatch, tmp_path):
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(tmp_path / "kernels"))
    decode_attention_library.cache_clear()
    try:
        assert decode_attention_library() is not None
        assert [name.split("-")[0] for name in os.listdir(tmp_path / "kernels")] == ["decode_attention"]
        decode_attention_library.cache_clear()
        monkeypatch.setattr(build, "probe_attention", lambda lib: False)
        assert decode_attention_library() is None
        monkeypatch.undo()
        decode_attention_library.cache_clear()
        monkeypatch.setenv("ATTNGPT_KERNEL_CACHE", str(tmp_path / "kernels"))
        monkeypatch.setenv("ATTNGPT_NATIVE_KERNELS", "0")
        assert decode_attention_library() is None
    finally:
        monkeypatch.undo()
        decode_attention_library.cache_clear()


def test_a_library_with_another_argument_list_is_not_used(attention_lib, monkeypatch):
    """A C file and a model/decode_attention.py out of step (another count of arguments) give no library."""
    import model.decode_attention as decode_attention
    monkeypatch.setattr(decode_attention, "ARGUMENTS", decode_attention.ARGUMENTS + 1)
    assert build.bind_decode_attention(attention_lib) is None
    monkeypatch.undo()
    assert build.bind_decode_attention(attention_lib) is attention_lib

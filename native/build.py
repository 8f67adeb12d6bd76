"""Building and loading the C kernels in this folder: `int8_matvec_library()` for model/int8_matvec.py,
`decode_attention_library()` for model/decode_attention.py.

A source is compiled once per machine into a cache folder (ATTNGPT_KERNEL_CACHE, else
$XDG_CACHE_HOME/attngpt/kernels, else ~/.cache/attngpt/kernels), named by a hash of the source, the compiler (its
path and modification time) and its flags and the CPU's flags, so that another machine, compiler or source builds
its own. The file appears in one step (compiled to a temporary name beside it, then renamed): two processes
building at once each write their own, and either may be loaded; nothing is ever deleted but a build's own
temporary file. Flags, in order until one builds and passes its probe: -O3 -march=native with OpenMP, without
OpenMP (one thread), then without -march=native. No compiler, no build, a library whose probe product comes out
wrong, or ATTNGPT_NATIVE_KERNELS=0 give None: the caller keeps torch's kernels.

Threads: a library's OpenMP calls land in the runtime torch loaded (the same libgomp.so.1, already in the process
when this loads one), each call asking for the threads it is given (torch.get_num_threads()).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

import model.decode_attention as decode_attention
from model.int8_matvec import Int8Matvec

HERE = Path(__file__).resolve().parent
INT8_MATVEC_SOURCE = HERE / "int8_matvec.c"
DECODE_ATTENTION_SOURCE = HERE / "decode_attention.c"
COMPILE_SECONDS = 120  # a build that has not finished by then is given up
FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"), ("-O3", "-fopenmp"), ("-O3",))


def cache_dir() -> Path:
    configured = os.environ.get("ATTNGPT_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attngpt" / "kernels"


def compiler() -> str | None:
    """The C compiler: $CC, else cc, gcc or clang on the PATH."""
    configured = os.environ.get("CC")
    if configured:
        return shutil.which(configured)
    return next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def cpu_flags() -> str:
    """What a -march=native build depends on besides its source and compiler: the CPU's architecture and feature
    flags (Linux; without starting a process, as platform.processor() would)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {flags}"


def compile_into(cc: str, source: Path, flags: tuple[str, ...], target: Path) -> bool:
    """Compile source into the shared library target in one step (a temporary file beside it, renamed); whether it
    built."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    except OSError:  # a cache folder that cannot be made or written
        return False
    os.close(descriptor)
    try:
        done = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", temporary, str(source), "-lm"],
                              capture_output=True, timeout=COMPILE_SECONDS)
        if done.returncode != 0:
            return False
        os.replace(temporary, target)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def built_library(source: Path, bind) -> ctypes.CDLL | None:
    """source built (or found in the cache) and loaded, with bind(lib) -> lib or None (its signatures set, its
    probe passed) deciding whether a build is usable; None where none is (module doc)."""
    if os.environ.get("ATTNGPT_NATIVE_KERNELS", "1") == "0" or not source.is_file():  # an install without it
        return None
    cc = compiler()
    if cc is None:
        return None
    text = source.read_bytes()
    stamp = str(os.stat(cc).st_mtime_ns)
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join(part.encode() if isinstance(part, str) else part for part in (
            text, cc, stamp, " ".join(flags), cpu_flags()))).hexdigest()[:16]
        target = cache_dir() / f"{source.stem}-{key}.so"
        if target.exists() or compile_into(cc, source, flags, target):
            try:
                lib = bind(ctypes.CDLL(str(target)))
            except OSError:
                lib = None
            if lib is not None:
                return lib
    return None


def bind_int8_matvec(lib: ctypes.CDLL) -> ctypes.CDLL | None:
    """int8_matvec.c's two functions' signatures set; lib where its probe product is exact, else None."""
    lib.attngpt_int8_matvec.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 5 + [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.attngpt_int8_matvec.restype = ctypes.c_int
    lib.attngpt_int8_matvec_vnni.restype = ctypes.c_int
    return lib if probe_exact(lib) else None


def probe_exact(lib: ctypes.CDLL) -> bool:
    """Whether the library's product is the exact sum on the worst case: 130 columns (two chunks and a padded
    one), 6 rows (a padded block), every code at its top or bottom, weights +-127; so that a miscompiled or
    mis-targeted build is never used."""
    weight = torch.full((6, 130), 127, dtype=torch.int8)
    weight[1::2] = -127
    x = torch.full((130,), 127.0)  # the digit scale exactly 1: digits +-127 (codes 255 and 1) and 0, no rounding
    x[::3] = -127.0
    y = Int8Matvec(lib, weight, torch.ones(6), None, 256)(x)
    return bool(torch.equal(y.double(), weight.double() @ x.double()))  # |sums| < 2^24: exact in float32 too


@functools.cache
def int8_matvec_library() -> ctypes.CDLL | None:
    """int8_matvec.c built and loaded for model/int8_matvec.py, or None where it cannot be had here; at most one
    build a process."""
    return built_library(INT8_MATVEC_SOURCE, bind_int8_matvec)


def bind_decode_attention(lib: ctypes.CDLL) -> ctypes.CDLL | None:
    """decode_attention.c's function's signature set; lib where its argument list is model/decode_attention.py's
    and its probe passes, else None."""
    try:
        decode_attention.bind(lib)
    except (ValueError, AttributeError):  # another version of the C file, or not this kernel's library
        return None
    return lib if probe_attention(lib) else None


def probe_attention(lib: ctypes.CDLL) -> bool:
    """Whether the library's attention matches a float64 computation to float32's precision on a case that covers
    its paths: two query heads on one kv head, head_dim 20 (a remainder past the 16 lanes), three keys with their
    scores far apart, from bfloat16 and float32 caches, out in float32 and (the same, rounded once) in q's dtype;
    and one key gives its value exactly."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1, 20, generator=generator) * 3
    k, v = (torch.randn(1, 1, 3, 20, generator=generator) for _ in range(2))
    kernel = decode_attention.DecodeAttention(lib)
    for dtype in (torch.float32, torch.bfloat16):
        q_, k_, v_ = q.to(dtype), k.to(dtype), v.to(dtype)
        weights = torch.softmax(q_.double() @ k_.double().transpose(-1, -2) / 20 ** 0.5, dim=-1)
        wide = kernel(q_.float(), k_, v_)  # (1, 2, 1, 20) float32
        if not torch.allclose(wide.double(), weights @ v_.double(), rtol=1e-5, atol=1e-6):
            return False
        if not torch.equal(kernel(q_, k_, v_), wide.to(dtype)):  # the float32 result, rounded once
            return False
    one = kernel(q, k[:, :, :1], v[:, :, :1])
    return bool(torch.equal(one, v[:, :, :1].expand(1, 2, 1, 20)))


@functools.cache
def decode_attention_library() -> ctypes.CDLL | None:
    """decode_attention.c built and loaded for model/decode_attention.py, or None where it cannot be had here; at
    most one build a process."""
    return built_library(DECODE_ATTENTION_SOURCE, bind_decode_attention)

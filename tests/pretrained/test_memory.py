"""The memory sample.py checks before generating (pretrained/memory.py: generation_bytes), with the KV cache and
without it: a lower bound of what generation really allocates (measured as the peak resident memory it adds
in a fresh process); and sample.py refuses exactly past the bound, for either path."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import GPT, ModelConfig
from pretrained.checkpoint import save_model
from pretrained.memory import generation_bytes, kv_cache_bytes, param_count
from data.tokenizer import CharTokenizer

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import os, resource, sys, torch
from model import GPT, ModelConfig
from model.generate import generate
torch.set_num_threads(1)
cache, attn_impl, batch = sys.argv[1] == "cache", sys.argv[2], int(sys.argv[3])
cfg = ModelConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, d_model=64, attn_impl=attn_impl)
model = GPT(cfg).eval()
prompt = torch.randint(0, 65, (1, 60))
generate(model, prompt.expand(2, -1), 2, temperature=0, use_kv_cache=cache)  # warm: kernels, allocator
resident = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
generate(model, prompt.expand(batch, -1), 4, temperature=0, use_kv_cache=cache)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - resident)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/statm, ru_maxrss in kB, glibc's malloc tunables")
@pytest.mark.parametrize("cache, attn_impl", [("cache", "manual"), ("none", "manual"),
                                              ("none", "sdpa")])
def test_generation_bytes_is_a_lower_bound_close_to_what_generation_allocates(cache, attn_impl):
    batch = 600
    # every tensor of more than 64 kB gets pages of its own, returned when it is freed (glibc would otherwise
    # raise that threshold as it goes and serve tensors from memory freed earlier, already resident): the peak
    # resident memory above the resident memory just before is then what generation held at once
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, "-c", PROBE, cache, attn_impl, str(batch)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = int(proc.stdout.strip().splitlines()[-1])
    cfg = ModelConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, d_model=64, attn_impl=attn_impl)
    estimate = generation_bytes(cfg, batch, 60, 4, 4, kv_cache=cache == "cache")
    assert estimate <= measured, (measured, estimate)


def test_the_estimate_counts_what_each_path_holds():
    cfg = ModelConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, d_model=64, attn_impl="manual")
    sdpa = ModelConfig(**{**cfg.to_dict(), "attn_impl": "sdpa"})
    # the uncached path runs the whole window: it grows with the window, the cached one by its cache
    assert generation_bytes(cfg, 8, 4, 60, kv_cache=False) > generation_bytes(cfg, 8, 4, 10, kv_cache=False)
    # manual attention holds its (B, n_head, T, T) scores and weights, the fused kernel does not
    scores = 2 * 8 * 4 * 64 * 64 * 4
    assert generation_bytes(cfg, 8, 60, 4, kv_cache=False) - generation_bytes(sdpa, 8, 60, 4, kv_cache=False) > 0
    assert generation_bytes(cfg, 8, 60, 4, kv_cache=False) >= scores
    # the cache is as long as the generation can get, not block_size
    with_cache = generation_bytes(cfg, 8, 10, 5, kv_cache=True)
    assert with_cache > kv_cache_bytes(cfg, 8, 4, max_len=15) and with_cache < kv_cache_bytes(cfg, 8, 4) + \
        generation_bytes(cfg, 8, 10, 5, kv_cache=False)
    # linear in the number of samples, beyond the causal table the cache shares
    for kv_cache in (True, False):
        g = [generation_bytes(cfg, n, 10, 5, kv_cache=kv_cache) for n in (0, 8, 16)]
        assert g[2] - g[1] == g[1] - g[0] > 0 and g[0] == (kv_cache_bytes(cfg, 0, 4, 15) if kv_cache else 0)


CHARS = "\n abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt") / "model"
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(CHARS), block_size=64, n_layer=1, n_head=2, d_model=16, attn_impl="manual")
    save_model(GPT(config), folder, extra={"tokenizer": CharTokenizer(CHARS).to_json()})
    return folder


def run_sample(argv: list[str]) -> tuple[int, str]:
    import sample
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        try:
            code = sample.main(argv)
        except SystemExit as e:
            code = e.code
    return code, stderr.getvalue()


@pytest.mark.parametrize("no_cache", [False, True])
def test_sample_refuses_exactly_beyond_the_bound_of_its_path(checkpoint, monkeypatch, no_cache):
    """With the device's memory set to the bound, the samples run; one byte less, they are refused before
    anything is allocated. The bounds of the two paths differ, so a check of the other path's would fail."""
    import pretrained.memory as memory
    from pretrained.checkpoint import read_config
    config = ModelConfig.from_dict(read_config(checkpoint)["model"])
    prompt, n, new = "abc abc", 40, 30
    needed = param_count(config) * 4 + generation_bytes(config, n, len(prompt), new, 4, kv_cache=not no_cache)
    other = param_count(config) * 4 + generation_bytes(config, n, len(prompt), new, 4, kv_cache=no_cache)
    assert needed != other
    argv = ["--ckpt", str(checkpoint), "--prompt", prompt, "--num-samples", str(n), "--max-new-tokens", str(new),
            *(["--no-kv-cache"] if no_cache else [])]
    monkeypatch.setattr(memory, "device_memory", lambda device: needed)
    code, stderr = run_sample(argv)
    assert code == 0, stderr
    monkeypatch.setattr(memory, "device_memory", lambda device: needed - 1)
    code, stderr = run_sample(argv)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"not enough memory on cpu for {n} sample(s)" in lines[0], stderr
    assert ("whole window at every step" in lines[0]) == no_cache

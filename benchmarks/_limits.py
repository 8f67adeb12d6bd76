"""What a batch-1 decode step of a GPT is up against: the bytes it must read, the machine's memory bandwidth, and
the time of the model's own matmuls alone. Used by sample_vs_hf.py; not a benchmark itself.

- bytes per token: one decode step reads every weight of every matmul it runs (each block's qkv, out, MLP in and
  out; the LM head), each at the size it is stored in, plus the norms, one embedding row (and one position row)
  and the KV cache up to the step's position. At batch 1 each weight is used for one multiply-add, so the step is
  a stream of these bytes: bandwidth / bytes per token is the tokens/s a decode could reach if the weights came
  from memory at the measured bandwidth and nothing else took time.
- memory bandwidth: a timed streaming read (a sum) of a buffer several times the last-level cache, so it cannot
  come from the cache, on the threads the run uses.
- matmul floor: the model's matmul modules themselves (whatever kernel they run: nn.Linear, or a quantized or
  prepacked replacement) called back to back on one token, the LM head as the model's decode runs it.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

import _report
from model import GPT

MIN_BANDWIDTH_BUFFER = 256 * 2**20  # bytes: at least this much, whatever the cache size says
# on a GPU more: HBM reads 256 MiB in ~50 us, not much longer than the synchronize around the timed read
MIN_CUDA_BANDWIDTH_BUFFER = 2 * 2**30
CACHE_MULTIPLE = 4  # the buffer is at least this many last-level caches


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of cpu0's highest-level cache, from sysfs ('32768K'), None where sysfs does not say."""
    best: tuple[int, int] | None = None  # (level, bytes)
    for index in sorted(sysfs.glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        number, unit = (size[:-1], units[size[-1]]) if size[-1:] in units else (size, 1)
        if number.isdigit() and (best is None or level > best[0]):
            best = (level, int(number) * unit)
    return None if best is None else best[1]


def bandwidth_buffer(device: torch.device) -> tuple[int, str]:
    """(bytes of the buffer memory_bandwidth reads by default, why that size): CACHE_MULTIPLE times the last-level
    cache (a CPU's L3 from sysfs, a GPU's L2), at least MIN_BANDWIDTH_BUFFER (MIN_CUDA_BANDWIDTH_BUFFER on CUDA)."""
    if device.type == "cuda":
        cache, name = torch.cuda.get_device_properties(device).L2_cache_size, "L2"
        least = MIN_CUDA_BANDWIDTH_BUFFER
    else:
        cache, name = last_level_cache_bytes(), "last-level cache"
        least = MIN_BANDWIDTH_BUFFER
    if not cache:
        return least, f"{name} size unknown; at least {least / 2**20:g} MiB"
    size = max(least, CACHE_MULTIPLE * cache)
    return size, (f"{CACHE_MULTIPLE} x the {cache / 2**20:g} MiB {name} is {CACHE_MULTIPLE * cache / 2**20:g} MiB; "
                  f"at least {least / 2**20:g} MiB")


def memory_bandwidth(device: torch.device, n_bytes: int | None = None, reps: int = 10) -> float:
    """Bytes/s of a streaming read of `n_bytes` (default: bandwidth_buffer) on `device`: the best of `reps` timed
    sums of a float32 buffer, the device synchronized around each. A sum does one add per 4 bytes read, far below
    what a core can do, so its time is the read's; the best rep is the one least disturbed by other work."""
    n_bytes = bandwidth_buffer(device)[0] if n_bytes is None else n_bytes
    buffer = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)  # ones: every page touched
    buffer.sum()  # warm-up (a first call may allocate or load a kernel)
    best = min(_report.timed(buffer.sum, device)[0] for _ in range(reps))
    return buffer.nbytes / best


@dataclasses.dataclass
class MatmulModule:
    name: str  # where the model holds it, e.g. "blocks.0.attn.qkv_proj"
    module: torch.nn.Module
    in_features: int  # the width of the input a decode step gives it


def matmul_modules(model: GPT) -> list[MatmulModule]:
    """Every matmul module a decode step runs, in the order it runs them, the LM head last (GPT.matmul_slots).
    Found by where the model holds them, not by type: other code may replace an nn.Linear by a quantized or
    prepacked module, each of which keeps its in_features."""
    return [MatmulModule(name, getattr(parent, attr), getattr(parent, attr).in_features)
            for name, parent, attr in model.matmul_slots()]


def stored_bytes(module: torch.nn.Module) -> int:
    """numel x element size of the module's parameters and buffers (each tensor once), as they are stored."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def mean_decode_context(prompt_tokens: int, new_tokens: int) -> float:
    """The mean number of cache slots a decode step of model.generate.generate attends over (new_tokens >= 2):
    after the prefill of the prompt, which gives the first token, step k (k = 1..new_tokens - 1) writes token k
    at position prompt + k - 1 and attends over prompt + k slots (no step runs after the last token)."""
    return prompt_tokens + new_tokens / 2


@dataclasses.dataclass
class DecodeBytes:
    """What one decode step reads, in bytes."""
    matmul_weights: int  # every matmul module's parameters and buffers (LM head included)
    other_weights: int  # the norms, one token-embedding row, one position row (learned positions)
    kv_cache: float  # keys and values of every layer at the mean context

    @property
    def total(self) -> float:
        return self.matmul_weights + self.other_weights + self.kv_cache


def decode_bytes_per_token(model: GPT, mean_context: float, cache_element_size: int) -> DecodeBytes:
    """The bytes one decode step reads (DecodeBytes) at `mean_context` attended slots, its KV cache stored
    `cache_element_size` bytes per number: 2 (keys and values) x n_layer x n_kv_head x head_dim x context."""
    c = model.config
    matmuls = sum(stored_bytes(m.module) for m in matmul_modules(model))
    norms = [*(b.attn_norm for b in model.blocks), *(b.mlp_norm for b in model.blocks), model.final_norm]
    rows = [e.weight for e in (model.tok_emb, model.pos_emb) if e is not None]  # one row of each is read
    other = sum(stored_bytes(n) for n in norms) + sum(w.shape[1] * w.element_size() for w in rows)
    kv = 2 * c.n_layer * c.n_kv_head * c.head_dim * mean_context * cache_element_size
    return DecodeBytes(matmuls, other, kv)


def matmul_pass(model: GPT):
    """A function running one pass of the model's matmuls alone at batch 1: each matmul module (the very objects
    the model runs) called back to back on a (1, 1, in_features) input of the model's dtype, then the LM head
    through GPT.logits, as decode runs it (on a CPU: x @ head_columns). Call it under no grad, as decode runs."""
    weight = model.tok_emb.weight
    device, dtype = weight.device, weight.dtype
    generator = torch.Generator().manual_seed(0)
    inputs = {width: torch.randn(1, 1, width, generator=generator).to(device=device, dtype=dtype)
              for width in {m.in_features for m in matmul_modules(model)}}  # (1, 1, width) per input width
    modules = [(m.module, inputs[m.in_features]) for m in matmul_modules(model)[:-1]]
    head_input = inputs[model.config.d_model]

    def one_pass() -> None:
        for module, x in modules:
            module(x)
        model.logits(head_input)  # (1, 1, vocab_size), the way the model's decode computes it
    return one_pass


@torch.no_grad()
def matmul_floor_seconds(model: GPT, rounds: int = 5, min_round_seconds: float = 0.02) -> float:
    """Seconds of one pass of the model's matmuls alone at batch 1 (matmul_pass), best of `rounds` rounds, each
    enough passes to last `min_round_seconds` (a small model's pass is tens of microseconds); per pass."""
    device = model.tok_emb.weight.device
    one_pass = matmul_pass(model)
    one_pass()  # warm-up: GPT.head_columns builds its column-major copy on the first call
    passes = max(1, math.ceil(min_round_seconds / _report.timed(one_pass, device)[0]))
    best = min(_report.timed(lambda: [one_pass() for _ in range(passes)], device)[0] for _ in range(rounds))
    return best / passes


def fractions_reached(tokens_per_s: float, bandwidth: float, bytes_per_token: float,
                      floor_seconds: float) -> tuple[float, float]:
    """(percent of the bandwidth bound, percent of the matmul floor) that a measured tokens/s reaches: tok/s over
    bandwidth / bytes per token, and tok/s over 1 / floor seconds."""
    return 100 * tokens_per_s / (bandwidth / bytes_per_token), 100 * tokens_per_s * floor_seconds

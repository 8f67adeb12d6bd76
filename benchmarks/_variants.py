"""What benchmarks/train_throughput.py measures: its variants, parsed from names such as
`modern-sdpa-bf16-compile`, the model configuration each one stands for, and the shapes and batch they run
on (see that script's docstring)."""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import torch

from common.errors import UserError
from model import GPT, ModelConfig

PRESETS = ("gpt2", "modern")
ATTNS = ("manual", "sdpa")
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
# nanogpt: the baseline of every ratio; nanogpt-bf16-compile: nanoGPT as its train.py runs on a GPU (bf16 autocast,
# torch.compile, fused AdamW), a second ratio where it runs; textbook: a slower reference
BASELINES = ("nanogpt", "nanogpt-bf16-compile", "textbook")
VARIANT_RE = re.compile(r"^(?P<preset>gpt2|modern)-(?:(?P<auto>auto)|(?P<attn>manual|sdpa)-(?P<dtype>fp32|bf16)"
                        r"(?P<compile>-compile)?)$")
DEFAULT_VARIANTS = ("nanogpt", "textbook", "gpt2-sdpa-fp32", "gpt2-sdpa-fp32-compile", "modern-sdpa-fp32",
                    "modern-sdpa-fp32-compile", "modern-sdpa-bf16", "modern-auto")
SEED = 1337  # of the one random batch every variant trains on
# named shapes: (vocab, block, batch, layers, heads, width)
SHAPES = {"cpu": (65, 64, 12, 4, 4, 128),  # nanoGPT's CPU command line (README), shakespeare-char
          "char": (65, 256, 8, 6, 6, 384)}  # nanoGPT's shakespeare-char model at batch 8


@dataclass
class Variant:
    name: str
    preset: str | None = None  # None: a baseline (nanogpt or textbook)
    attn: str = "sdpa"
    dtype: str = "fp32"
    compile: bool = False
    auto: bool = False  # dtype and compile chosen by training/autotune.py, as `dtype: auto` / `compile: auto` do
    choice: str = ""  # what auto chose, and the measurements behind it
    # filled in by setup()
    step: Callable[[], tuple[float, float]] | None = field(default=None, repr=False)
    flops_per_token: float = 0.0
    params: int = 0
    ms: list[float] = field(default_factory=list)  # ms/step of each timed round
    peak_mem: float | None = None  # CUDA: bytes this variant added at its peak (weights, optimizer, activations)
    error: str | None = None
    last_loss: float = math.nan


def parse_variants(text: str, with_compile: bool) -> list[Variant]:
    if text == "all":
        names = [*BASELINES] + [f"{p}-{a}-{d}" for p in PRESETS for a in ATTNS for d in DTYPES] + \
            [f"{p}-auto" for p in PRESETS]
    elif text == "default":
        names = list(DEFAULT_VARIANTS)
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
    if with_compile and text in ("all", "default"):
        names += [f"{n}-compile" for n in names if n not in BASELINES and not n.endswith("-auto")
                  and f"{n}-compile" not in names]
    variants = []
    for name in dict.fromkeys(names):  # each name once, in order
        if name == "nanogpt-bf16-compile":
            variants.append(Variant(name, dtype="bf16", compile=True))
            continue
        if name in BASELINES:
            variants.append(Variant(name))
            continue
        m = VARIANT_RE.match(name)
        if m is None:
            raise UserError(f"unknown variant '{name}': use {', '.join(BASELINES)}, PRESET-auto or "
                            f"PRESET-ATTN-DTYPE[-compile] with PRESET in {'|'.join(PRESETS)}, ATTN in "
                            f"{'|'.join(ATTNS)}, DTYPE in {'|'.join(DTYPES)} (e.g. modern-sdpa-bf16-compile), "
                            f"or 'all' / 'default'")
        if m["auto"]:
            variants.append(Variant(name, m["preset"], auto=True))
        else:
            variants.append(Variant(name, m["preset"], m["attn"], m["dtype"], bool(m["compile"])))
    if not variants:
        raise UserError("--variants is empty: name at least one variant")
    return variants


def kv_heads_for_gqa(n_head: int) -> int:
    """n_head/2 when it divides n_head (GQA, two query heads per key/value head), else the largest divisor below."""
    return next(kv for kv in range(max(1, n_head // 2), 0, -1) if n_head % kv == 0)


def model_config(preset: str, attn: str, args: argparse.Namespace) -> ModelConfig:
    common = dict(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                  d_model=args.width, attn_impl=attn, dropout=0.0)
    if preset == "gpt2":
        return ModelConfig(**common, mlp="gelu", norm="layernorm", pos="learned", n_kv_head=args.heads)
    return ModelConfig(**common, mlp="swiglu", norm="rmsnorm", pos="rope", n_kv_head=kv_heads_for_gqa(args.heads))


def counting_model(cfg: ModelConfig) -> GPT:
    """A GPT on the meta device: parameter shapes for counting, no memory, no initialisation cost."""
    with torch.device("meta"):
        return GPT(cfg)


def shape_list(args: argparse.Namespace) -> list[tuple[str, tuple[int, ...]]]:
    custom = [getattr(args, n) for n in ("vocab", "block", "batch", "layers", "heads", "width")]
    if any(v is not None for v in custom):
        base = SHAPES["cpu"]
        dims = tuple(v if v is not None else d for v, d in zip(custom, base))
        if any(d < 1 for d in dims):
            raise UserError("--vocab/--block/--batch/--layers/--heads/--width must be >= 1")
        if dims[5] % dims[4]:
            raise UserError(f"--width {dims[5]} must be divisible by --heads {dims[4]}")
        return [("custom", dims)]
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise UserError(f"--shapes {args.shapes!r}: use names from {', '.join(SHAPES)}")
    return [(n, SHAPES[n]) for n in names]


def set_shape(args: argparse.Namespace, name: str, dims: tuple[int, ...]) -> None:
    """Put shape `name` into args (vocab ... width) with its timing defaults, unless given on the command line."""
    args.shape_name = name
    args.vocab, args.block, args.batch, args.layers, args.heads, args.width = dims
    big = args.block * args.width >= 256 * 384
    args.steps_now = args.steps or (4 if big else 20)
    args.warmup_now = args.warmup if args.warmup is not None else (2 if big else 5)
    args.repeats_now = args.repeats
    if args.quick:
        args.steps_now, args.repeats_now, args.warmup_now, args.peak_trials = 2, 2, 1, 1


def random_batch(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randint(0, args.vocab, (args.batch, args.block), generator=gen).to(device)
    y = torch.randint(0, args.vocab, (args.batch, args.block), generator=gen).to(device)
    return x, y

"""Training throughput: tokens/s, ms/step and MFU of full training steps, attngpt against nanoGPT's own recipe.

A step: forward, backward, clip_grad_norm_(1.0), optimizer step, loss and grad norm read back (`.item()`, as
both loops do every step on a CPU). Variants, all on one random batch from one seed:
  nanogpt                      benchmarks/nanogpt_reference.py, nanoGPT's model and optimizer as it runs them on a
                               CPU (fp32, eager): every "vs nanoGPT" ratio is taken against it, in the same run.
  nanogpt-bf16-compile         the same model and step as nanoGPT's train.py runs them on a GPU: the forward under
                               bf16 autocast, torch.compile, fused AdamW; where it runs, a second ratio column.
  textbook                     benchmarks/reference_gpt.py: explicit attention with a mask buffer, separate q/k/v,
                               biases, torch.optim.AdamW defaults: what a textbook reader writes.
  PRESET-ATTN-DTYPE[-compile]  attngpt's GPT through training.step with training.optim's AdamW (fused kernel):
      PRESET  gpt2    gelu MLP, layernorm, learned positions, MHA: nanoGPT's architecture
              modern  swiglu MLP, rmsnorm, RoPE, GQA with n_kv_head = n_head/2 (what configs/small.yaml uses)
      ATTN    manual  the from-scratch softmax(QK^T/sqrt(d))V     sdpa  F.scaled_dot_product_attention
      DTYPE   fp32    plain float32                               bf16  bfloat16 autocast (fp32 master weights)
      -compile        torch.compile(model) (10-60 s of compilation per variant on a CPU)
  PRESET-auto                  the preset as `dtype: auto` + `train.compile: auto` run it: training/autotune.py
                               times the candidates here (for a run of --auto-steps steps); its choice is printed.

Shapes (--shapes, default both): cpu = nanoGPT's CPU command line (vocab 65, block 64, batch 12, 4 layers x 4 heads
x 128); char = its shakespeare-char model (block 256, 6 x 6 x 384) at batch 8; any of --vocab/--block/--batch/
--layers/--heads/--width instead runs that one custom shape.

Timing, for a noisy shared machine: each variant warms up (--warmup steps, compilation included), then the
variants run round-robin, --repeats rounds of --steps steps (each round starting one variant later, the device
synchronized around each block): median and min ms/step; tokens/s and MFU from the median. MFU = FLOPs/token
(GPT.flops_per_token: 6 per matmul weight + attention's 12*L*H*hd*T; the baselines count as the gpt2 preset)
x tokens/s / peak, for two peaks: measured at start with a large matmul in the variant's dtype (best of
--peak-trials), and the datasheet's dense peak where the GPU is known (H100/H200, A100; n/a on CPUs).

Prints a table and appends a dated section to benchmarks/RESULTS.md (not with --quick, a smoke run, unless
--save; never with --profile, which only profiles).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time

import torch

import _report
from _report import nominal_peaks
from _variants import (DEFAULT_VARIANTS, DTYPES, PRESETS, SEED, SHAPES, Variant, counting_model, model_config,
                       parse_variants, random_batch, set_shape, shape_list)
from common.device import resolve_device
from common.errors import ArgumentParser, UserError, user_errors_exit
from model import GPT
from nanogpt_reference import NanoGPT, NanoShape
from nanogpt_reference import train_step as nanogpt_step
from reference_gpt import ReferenceGPT
from training.autotune import choose
from training.config import TrainConfig
from training.optim import build_optimizers
from training.runtime import Runtime, measure_peak_flops
from training.step import accumulate_gradients, apply_gradients

GRAD_CLIP = 1.0


def sdpa_context(backend: str) -> contextlib.AbstractContextManager:
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    choice = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]
    return sdpa_kernel([choice])


def sdpa_backend_of(v: Variant, forced: str) -> str:
    """The kernel an sdpa variant's attention is held to: the forced one, except flash for a float32 variant
    (flash has no float32 kernel: such a variant keeps PyTorch's own choice, as the timing line says)."""
    if v.attn != "sdpa" or (forced == "flash" and v.dtype == "fp32"):
        return "auto"
    return forced


def setup(v: Variant, args: argparse.Namespace, device: torch.device, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Build the model and optimizer of v on device and set v.step: one full training step."""
    x, y = batch
    torch.manual_seed(SEED)
    gpt2_cfg = model_config("gpt2", "manual", args)
    if v.preset is None:  # a baseline
        v.flops_per_token = counting_model(gpt2_cfg).flops_per_token(args.block)  # the same architecture's count
        if v.name.startswith("nanogpt"):
            model = NanoGPT(NanoShape(args.layers, args.heads, args.width, args.block, args.batch, args.vocab))
            model = model.to(device).train()
            opt = model.configure_optimizer()
        else:
            model = ReferenceGPT(args.vocab, args.block, args.layers, args.heads, args.width).to(device).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        v.params = sum(p.numel() for p in model.parameters())
        stepped = torch.compile(model) if v.compile else model
        # the textbook step is nanoGPT's too: backward, clip, optimizer step, zero_grad, loss and norm read back
        v.step = lambda: nanogpt_step(stepped, opt, x, y, GRAD_CLIP, autocast=DTYPES[v.dtype])
        return

    cfg = model_config(v.preset, v.attn, args)
    raw = GPT(cfg).to(device)
    raw.train()
    v.params = raw.num_params()
    v.flops_per_token = raw.flops_per_token(args.block)
    optimizers = build_optimizers(raw, TrainConfig(batch_size=args.batch, grad_clip=GRAD_CLIP))
    compiled = None
    if v.auto:
        choice, compiled = choose((raw, optimizers, (x, y)), Runtime(device, None),
                                  TrainConfig(grad_clip=GRAD_CLIP, compile="auto"), args.auto_steps, "auto")
        v.dtype, v.compile, v.choice = {"float32": "fp32", "bfloat16": "bf16"}[choice.dtype], choice.compile, \
            choice.summary()
        print(f"  {v.name}: {v.choice}", flush=True)
    rt = Runtime(device, DTYPES[v.dtype])
    model = (compiled if compiled is not None else torch.compile(raw)) if v.compile else raw
    backend = sdpa_backend_of(v, args.sdpa_backend)

    def step() -> tuple[float, float]:
        with sdpa_context(backend):
            loss, norm = accumulate_gradients(model, raw, lambda: (x, y), rt, TrainConfig(grad_clip=GRAD_CLIP))
            values = loss.item(), norm.item()  # the loop reads both before applying (non-finite check)
            apply_gradients(optimizers)
        return values
    v.step = step


def run_steps(v: Variant, n: int, device: torch.device) -> float:
    """Seconds for n steps of v, the device synchronized before and after."""
    def steps() -> None:
        for _ in range(n):
            v.last_loss, _ = v.step()
    return _report.timed(steps, device)[0]


def fail(v: Variant, e: BaseException, device: torch.device) -> None:
    v.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    v.step = None
    print(f"  {v.name}: FAILED ({v.error})", file=sys.stderr, flush=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fmt_rate(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def profile(v: Variant, args: argparse.Namespace, device: torch.device, batch) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile
    setup(v, args, device, batch)
    run_steps(v, max(args.warmup_now, 2), device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        seconds = run_steps(v, args.profile_steps, device)
    averages = prof.key_averages()
    keys = ("self_device_time_total", "self_cuda_time_total") if device.type == "cuda" else ("self_cpu_time_total",)
    for sort_by in keys:  # torch >= 2.4 names the GPU column "device"; older versions "cuda"
        try:
            table = averages.table(sort_by=sort_by, row_limit=25)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    else:
        sort_by = "self_cpu_time_total"
        table = averages.table(sort_by=sort_by, row_limit=25)
    print(f"torch.profiler: {v.name}, {args.profile_steps} steps ({1e3 * seconds / args.profile_steps:.1f} ms/step "
          f"under the profiler), shape {args.shape_name}: batch {args.batch} x block {args.block}, top 25 ops by {sort_by}:")
    print(table)


def main() -> None:
    parser = ArgumentParser(prog="train_throughput", description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    parser.add_argument("--variants", default="default",
                        help=f"comma-separated variant names, 'default' ({','.join(DEFAULT_VARIANTS)}) or 'all'")
    parser.add_argument("--compile", action="store_true",
                        help="add a -compile twin of every attngpt variant of 'default'/'all' (explicit "
                             "-compile names in --variants run without it)")
    parser.add_argument("--shapes", default="cpu,char", help=f"named shapes to run: {', '.join(SHAPES)}")
    shape = parser.add_argument_group("a custom shape instead (any of these replaces --shapes)")
    for name, help_text in (("vocab", None), ("block", "sequence length (block_size)"), ("batch", None),
                            ("layers", None), ("heads", None), ("width", "d_model")):
        shape.add_argument(f"--{name}", type=int, default=None, help=help_text)
    timing = parser.add_argument_group("timing")
    timing.add_argument("--steps", type=int, default=None, help="steps per variant per round (default 20 for "
                                                                "the cpu shape, 4 for char)")
    timing.add_argument("--warmup", type=int, default=None, help="untimed steps per variant first (compilation "
                                                                 "too; default 5 for cpu, 2 for char)")
    timing.add_argument("--repeats", type=int, default=5, help="round-robin rounds (median and min reported)")
    timing.add_argument("--auto-steps", type=int, default=5000,
                        help="the run length the -auto variants decide for (compile is tried only for long runs)")
    timing.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU (default torch's)")
    timing.add_argument("--peak-size", type=int, default=None,
                        help="matmul size of the peak measurement (default 1024 on CPU, 8192 on CUDA)")
    timing.add_argument("--peak-trials", type=int, default=3, help="peak measurements per dtype; the best is used")
    parser.add_argument("--sdpa-backend", default="auto", choices=("auto", "flash", "efficient", "cudnn", "math"),
                        help="force one F.scaled_dot_product_attention kernel in the sdpa variants (flash: in the "
                             "16-bit ones; float32 ones keep PyTorch's choice. A variant the kernel cannot serve "
                             "otherwise fails and is reported so)")
    parser.add_argument("--profile", metavar="VARIANT", default=None,
                        help="only profile VARIANT (on the first shape): torch.profiler's top 25 ops")
    parser.add_argument("--profile-steps", type=int, default=5)
    _report.save_flags(parser, quick="smoke run: 1 warm-up step, 2 rounds of 2 steps, peak from one small matmul; "
                                     "nothing saved")
    args = parser.parse_args()

    with user_errors_exit("train_throughput"):
        shapes = shape_list(args)
        for name, least in (("repeats", 1), ("peak_trials", 1), ("profile_steps", 1), ("auto_steps", 1),
                            ("steps", 1), ("warmup", 0)):
            if getattr(args, name) is not None and getattr(args, name) < least:
                raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= {least}")
        if args.threads:
            torch.set_num_threads(args.threads)
        device = resolve_device(args.device, setting="--device ")
        parse_variants(args.profile or args.variants, args.compile)  # names checked before any work
        if args.profile:
            set_shape(args, *shapes[0])
            variants = parse_variants(args.profile, False)
            if len(variants) != 1:
                raise UserError("--profile takes one variant name")
            profile(variants[0], args, device, random_batch(args, device))
            return
        gpu = [f"GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, float32 matmul precision "
               f"{torch.get_float32_matmul_precision()})"] if device.type == "cuda" else []
        machine_line = _report.machine(torch_threads=True, extra=[_report.cpu_bf16_support(), *gpu])
        print(machine_line, flush=True)
        blocks = []
        for shape_name, dims in shapes:
            set_shape(args, shape_name, dims)
            print(f"\n### shape {shape_name}", flush=True)
            blocks.append(run(parse_variants(args.variants, args.compile), args, device, random_batch(args, device)))
        _report.save(args, f"Training throughput vs nanoGPT, {device.type}", machine_line, "train_throughput.py",
                     "- speed vs nanoGPT = nanogpt median ms/step / variant median ms/step (higher is faster); "
                     "vs nanoGPT bf16 compile, the same against nanogpt-bf16-compile where it ran. "
                     "final loss: the last timed step's loss on the fixed random batch, a sanity check only (the "
                     "textbook reference keeps PyTorch's default init, N(0, 1) tied embeddings, hence its large "
                     "loss).", "", *[line for block in blocks for line in block])


def run(variants: list[Variant], args: argparse.Namespace, device: torch.device, batch) -> list[str]:
    """Time the variants on one shape; print and return its lines for RESULTS.md."""
    _, nominal = nominal_peaks(device)
    steps, warmup, repeats = args.steps_now, args.warmup_now, args.repeats_now

    # peaks first, on an idle device
    peak_size = args.peak_size or ((256 if args.quick else 1024) if device.type == "cpu" else None)
    measured: dict[str, float] = {}
    for dtype in DTYPES:
        measured[dtype] = measure_peak_flops(device, DTYPES[dtype], peak_size, rounds=args.peak_trials)
        print(f"measured peak {dtype}: {fmt_rate(measured[dtype])} (matmul {peak_size or 8192}^3, best of "
              f"{args.peak_trials}); nominal: {fmt_rate(nominal[dtype]) if dtype in nominal else 'n/a'}", flush=True)

    # build and warm up each variant (compilation happens here)
    for v in variants:
        t0 = time.perf_counter()
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            setup(v, args, device, batch)
            run_steps(v, max(warmup, 1 if device.type == "cuda" else 0), device)
            if device.type == "cuda":
                v.peak_mem = torch.cuda.max_memory_allocated(device) - before
        except Exception as e:  # one broken variant (OOM, a missing compiler, no SDPA kernel) must not sink the rest
            fail(v, e, device)
            continue
        print(f"  {v.name}: ready, {v.params / 1e6:.2f}M params, warm-up {time.perf_counter() - t0:.1f} s", flush=True)

    # round-robin timing; each round starts one variant later
    live = [v for v in variants if v.step is not None]
    for r in range(repeats):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for v in order:
            if v.step is None:
                continue
            try:
                v.ms.append(1e3 * run_steps(v, steps, device) / steps)
            except Exception as e:
                fail(v, e, device)
        done = ", ".join(f"{v.name} {v.ms[-1]:.1f}" for v in order if v.ms and v.step is not None)
        print(f"round {r + 1}/{repeats} (ms/step): {done}", flush=True)

    tokens_per_step = args.batch * args.block
    def median_of(name: str) -> float | None:
        return next((statistics.median(v.ms) for v in variants if v.name == name and v.ms), None)
    ref_ms, gpu_ref_ms = median_of("nanogpt"), median_of("nanogpt-bf16-compile")
    cuda = device.type == "cuda"
    gpu_ratio = gpu_ref_ms is not None  # a second ratio column, against nanoGPT's GPU step
    header = ("| variant | ms/step median | ms/step min | tokens/s | speed vs nanoGPT "
              + ("| vs nanoGPT bf16 compile " if gpu_ratio else "") + "| MFU (measured peak) "
              "| MFU (nominal peak) | final loss |" + (" peak memory |" if cuda else ""))
    table = [header, "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if gpu_ratio else "")
             + ("---:|" if cuda else "")]
    for v in variants:
        if not v.ms:
            table.append(f"| {v.name} | FAILED: {v.error} | | | | | | |" + (" |" if gpu_ratio else "")
                         + (" |" if cuda else ""))
            continue
        med = statistics.median(v.ms)
        achieved = v.flops_per_token * tokens_per_step / (med / 1e3)
        nominal_mfu = f"{100 * achieved / nominal[v.dtype]:.1f}%" if v.dtype in nominal else "n/a"
        speed = f"{ref_ms / med:.2f}x" if ref_ms else "n/a"
        speed += f" | {gpu_ref_ms / med:.2f}x" if gpu_ratio else ""
        note = f" (failed later: {v.error})" if v.error else ""
        table.append(f"| {v.name}{note} | {med:.2f} | {min(v.ms):.2f} | {tokens_per_step / (med / 1e3):,.0f} | "
                     f"{speed} | {100 * achieved / measured[v.dtype]:.1f}% | {nominal_mfu} | {v.last_loss:.3f} |"
                     + (f" {v.peak_mem / 2**30:.2f} GiB |" if cuda and v.peak_mem is not None else " |" if cuda else ""))

    presets = {}
    for preset in PRESETS:
        m = counting_model(model_config(preset, "sdpa", args))
        presets[preset] = (m.num_params(), m.flops_per_token(args.block), m.config.n_kv_head)
    shape_line = (f"Shape {args.shape_name}: vocab {args.vocab}, block {args.block}, batch {args.batch} "
                  f"({tokens_per_step:,} tokens/step), {args.layers} layers, {args.heads} heads, width {args.width}; "
                  + "; ".join(f"{p}: {n / 1e6:.2f}M params, n_kv_head {kv}, {f / 1e6:.2f} MFLOP/token"
                              for p, (n, f, kv) in presets.items())
                  + "; the baselines are counted as gpt2")
    peaks_line = ("Peaks: measured " + ", ".join(f"{d} {fmt_rate(p)}" for d, p in measured.items())
                  + f" (matmul {peak_size or 8192}^3, best of {args.peak_trials}); nominal "
                  + (", ".join(f"{d} {fmt_rate(nominal[d])}" for d in measured if d in nominal) + " (dense datasheet)"
                     if nominal else "n/a"))
    protocol = (f"Timing: {warmup} warm-up step(s) per variant, then {repeats} round-robin rounds x "
                f"{steps} steps (device synchronized around each round); same random batch for all; a step = "
                f"forward + backward + clip_grad_norm_(1.0) + optimizer step + loss/grad-norm .item(); "
                f"ms/step median and min over rounds, tokens/s and MFU from the median"
                + (f"; sdpa backend forced: {args.sdpa_backend}" if args.sdpa_backend != "auto" else "")
                + (" (float32 variants: PyTorch's choice, flash has no float32 kernel)"
                   if args.sdpa_backend == "flash" else "") + ".")
    autos = [f"{v.name} chose: {v.choice}" for v in variants if v.auto and v.choice]
    mem_line = ("peak memory: what the variant's weights, optimizer state and warm-up steps added to the CUDA "
                "allocator's peak (torch.cuda.max_memory_allocated)." if cuda else "")
    notes = [shape_line, peaks_line, protocol, *autos, *([mem_line] if mem_line else [])]
    print("\n".join(["", *notes, "", *table]))
    return [f"### Shape {args.shape_name}", "", *[f"- {n}" for n in notes], "", *table, ""]


if __name__ == "__main__":
    main()

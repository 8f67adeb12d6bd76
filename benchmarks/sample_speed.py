"""Sampling speed with and without the KV cache, per-token latency by position, and KV-cache bytes.

Why: the cache is what makes long-context sampling affordable, and two targets show it, reported here (never
asserted): at 1024 tokens of context the cached path generates >= 5x as fast as recomputing
the window, and a cached step at position ~1000 costs <= 1.5x a step at position ~10.

Model: random weights, n_layer 6, n_head 6, d_model 384, block_size 1024, vocab 50304, attn_impl sdpa (what
configs/small.yaml trains with), fp32 on the CPU unless --dtype / --device say otherwise; and the same with GQA
(n_kv_head 2). Timings use `model.generate.generate` itself, greedy, batch 1:
  - generate tokens/s: prompt of (context - N) tokens, N new ones, so the last step sees `context` tokens;
    the wall time includes the prefill (what a user waits for); median of --reps runs.
  - ms/token at position p: with the cache, one decode step as generate runs it (1 token at position p,
    model.generate.eager_decode_step) after a prefill of p tokens; without it, one forward of p + 1 tokens with
    last-position logits (what the no-cache path runs per token).
If `transformers` is importable, GPT2LMHeadModel.generate of the same shape (random weights, greedy, its own
cache) runs at the same contexts as a reference.

    python benchmarks/sample_speed.py [--quick] [--reps 3] [--new-tokens 32] [--threads N] [--profile] [--no-save]
        [--device cpu|cuda] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse
import contextlib

import torch

import _report
from common.device import resolve_device
from common.errors import user_errors_exit
from common.huge_pages import restart_in_huge_pages
from model import GPT, ModelConfig
from model.generate import eager_decode_step, generate

CONTEXTS = (64, 256, 1024)
POSITIONS = (10, 1000)


def device_of(model: GPT) -> torch.device:
    return model.tok_emb.weight.device


def generate_speed(model: GPT, context: int, n_new: int, use_cache: bool, reps: int) -> float:
    """tokens/s of generate() for n_new greedy tokens after a prompt of context - n_new tokens."""
    device = device_of(model)
    prompt = torch.randint(0, model.config.vocab_size, (1, context - n_new),
                           generator=torch.Generator().manual_seed(0)).to(device)
    return n_new / _report.median_seconds(lambda: generate(model, prompt, n_new, temperature=0.0,
                                                           use_kv_cache=use_cache), reps, device)


@contextlib.contextmanager
def prefilled(model: GPT, tokens: torch.Tensor):
    """The model's KV cache holding all of `tokens` but the last; yields a cached step's (input, position)."""
    position, device = tokens.shape[1] - 1, device_of(model)
    model.setup_kv_cache(1, model.config.block_size)  # on the model's device, in its dtype
    try:
        with torch.no_grad():
            model(tokens[:, :position], input_pos=torch.arange(position, device=device))
        yield tokens[:, position:], position
    finally:
        model.clear_kv_cache()


@torch.no_grad()
def step_latency(model: GPT, position: int, use_cache: bool, steps: int) -> float:
    """Median ms of one generation step at `position` (see the module docstring)."""
    vocab, device = model.config.vocab_size, device_of(model)
    tokens = torch.randint(0, vocab, (1, position + 1), generator=torch.Generator().manual_seed(1)).to(device)
    if not use_cache:
        return 1e3 * _report.median_seconds(lambda: model(tokens, last_only=True), steps, device)
    with prefilled(model, tokens) as (last, pos):
        step = eager_decode_step(model)
        return 1e3 * _report.median_seconds(lambda: step(last, pos), steps, device)


def hf_reference(contexts: tuple[int, ...], n_new: int, reps: int) -> tuple[list[str], str]:
    """GPT2LMHeadModel.generate tokens/s of the same shape, if transformers is importable."""
    try:
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return [], "transformers is not installed: no Hugging Face reference in this run."
    try:
        cfg = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=384, n_layer=6, n_head=6)
        hf = GPT2LMHeadModel(cfg).eval()
        rows = []
        for context in contexts:
            prompt = torch.randint(0, 50304, (1, context - n_new), generator=torch.Generator().manual_seed(0))
            mask = torch.ones_like(prompt)

            def run():
                with torch.no_grad():
                    hf.generate(prompt, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                                do_sample=False, use_cache=True, pad_token_id=0)
            run()  # warm-up
            rows.append(f"| HF GPT2LMHeadModel.generate (MHA, its cache) | {context} | {n_new} | - | "
                        f"{n_new / _report.median_seconds(run, reps):.1f} | - |")
        return rows, f"transformers {transformers.__version__}: GPT2LMHeadModel, same shape, random weights."
    except Exception as e:  # an optional reference must not sink the benchmark
        return [], f"transformers {getattr(transformers, '__version__', '?')} reference failed: {type(e).__name__}: {e}"


def profile_decode(model: GPT, position: int, steps: int = 20) -> str:
    """torch.profiler table of cached decode steps at `position`: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile
    device = device_of(model)
    tokens = torch.randint(0, model.config.vocab_size, (1, position + 1)).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with prefilled(model, tokens) as (last, pos), torch.no_grad():
        step = eager_decode_step(model)
        step(last, pos)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step(last, pos)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def main() -> None:
    parser = argparse.ArgumentParser(prog="sample_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per setting (the median is reported)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per run")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the models' weights and KV cache")
    parser.add_argument("--profile", action="store_true", help="also print a torch.profiler table of cached "
                                                               "decode steps at position ~1000")
    _report.save_flags(parser, quick="smoke run: 4 new tokens, 1 rep, nothing saved")
    args = parser.parse_args()
    with user_errors_exit("sample_speed"):
        device = resolve_device(args.device, setting="--device ")
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    reps, n_new, steps = (1, 4, 3) if args.quick else (args.reps, args.new_tokens, 10)
    machine_line = _report.machine(torch_threads=True, gpu=device)
    print(machine_line)

    models = {}
    for name, n_kv_head in (("MHA", None), ("GQA n_kv_head=2", 2)):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=50304, block_size=1024, n_layer=6, n_head=6, n_kv_head=n_kv_head, d_model=384,
                          attn_impl="sdpa")
        models[name] = GPT(cfg).to(device=device, dtype=dtype).eval()
    warm = torch.zeros(1, 8, dtype=torch.long, device=device)
    for model in models.values():
        generate(model, warm, 2, temperature=0.0)
        generate(model, warm, 2, temperature=0.0, use_kv_cache=False)

    speed = ["| model | context | new tokens | no cache tok/s | KV cache tok/s | speedup |", "|---|---:|---:|---:|---:|---:|"]
    latency = ["| model | position | KV cache ms/token | no cache ms/token | KV cache speedup |",
               "|---|---:|---:|---:|---:|"]
    speedups: dict[tuple[str, int], float] = {}  # (model, context) -> cached / uncached tok/s
    cached_ms: dict[tuple[str, int], float] = {}  # (model, position) -> ms per cached step
    for name, model in models.items():
        for context in CONTEXTS:
            slow = generate_speed(model, context, n_new, use_cache=False, reps=reps)
            fast = generate_speed(model, context, n_new, use_cache=True, reps=reps)
            speedups[(name, context)] = fast / slow
            speed.append(f"| {name} | {context} | {n_new} | {slow:.1f} | {fast:.1f} | {fast / slow:.1f}x |")
            print(speed[-1], flush=True)
        for position in POSITIONS:
            cached = step_latency(model, position, use_cache=True, steps=steps)
            full = step_latency(model, position, use_cache=False, steps=max(1, steps // 3))
            cached_ms[(name, position)] = cached
            latency.append(f"| {name} | {position} | {cached:.2f} | {full:.2f} | {full / cached:.1f}x |")
            print(latency[-1], flush=True)
    if device.type == "cpu" and dtype == torch.float32:
        hf_rows, hf_note = hf_reference(CONTEXTS, n_new, reps)
    else:  # the reference is built for the CPU fp32 comparison only
        hf_rows, hf_note = [], "no Hugging Face reference: it runs only with --device cpu --dtype float32."
    speed.extend(hf_rows)

    size = ["| model | n_kv_head | KV cache bytes, B=1, max_len=1024, fp32 | bf16 | vs MHA |", "|---|---:|---:|---:|---:|"]
    mha_bytes = None
    for name, model in models.items():
        fp32 = model.setup_kv_cache(1, 1024, dtype=torch.float32)
        bf16 = model.setup_kv_cache(1, 1024, dtype=torch.bfloat16)
        model.clear_kv_cache()
        mha_bytes = mha_bytes or fp32
        size.append(f"| {name} | {model.config.n_kv_head} | {fp32:,} ({fp32 / 2**20:.1f} MiB) | {bf16:,} | "
                    f"1/{mha_bytes / fp32:g} |")

    targets = []
    for name in models:
        at_1024 = speedups[(name, 1024)]
        lat_ratio = cached_ms[(name, POSITIONS[1])] / cached_ms[(name, POSITIONS[0])]
        targets.append(f"- {name}: KV-cache speedup at 1024 context {at_1024:.1f}x (target >= 5x: "
                       f"{'met' if at_1024 >= 5 else 'NOT met'}); cached ms/token at position {POSITIONS[1]} / at "
                       f"{POSITIONS[0]} = {lat_ratio:.2f} (target <= 1.5: {'met' if lat_ratio <= 1.5 else 'NOT met'}).")

    print("\n".join(["", *speed, "", *latency, "", *size, "", hf_note, *targets]))
    if args.profile:
        print(f"\ntorch.profiler, {models['MHA'].config.n_layer}-layer MHA, 20 cached decode steps at position "
              f"{POSITIONS[1]}:\n" + profile_decode(models["MHA"], POSITIONS[1]))
    _report.save(args, "Sampling speed, KV cache vs none", machine_line, "sample_speed.py",
                 "- Model: random weights, n_layer 6, n_head 6, d_model 384, block_size 1024, vocab 50304, attn_impl "
                 f"sdpa, {args.dtype} on {device}, batch 1, greedy. tok/s = new tokens / wall time of `generate()` "
                 f"including the prefill of (context - {n_new}) prompt tokens; median of {reps}. ms/token: one cached "
                 "step at that position, or one forward of the whole window (what the no-cache path runs per token). "
                 "Both paths compute logits for the last position only (`last_only`, since 21:40 on 2026-11-29; "
                 "before, every prompt position).", f"- {hf_note}", "", *speed, "", *latency, "", *size, "",
                 *targets, "")


if __name__ == "__main__":
    restart_in_huge_pages("sample_speed")  # as sample.py runs: both sides and the floors on the same pages
    main()

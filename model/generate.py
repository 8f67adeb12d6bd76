"""Autoregressive sampling, through the KV cache or (the reference) by recomputing the window.

The window: the model sees at most block_size tokens. When the next token would not fit, the window
slides: it keeps its last block_size // 2 tokens, which are prefilled again at positions 0.. (so learned
positions and RoPE stay within what the model was trained on), and generation continues from there.
Both paths follow exactly this policy, so with the same seed they produce the same tokens.
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.decode import EagerDecodeStep
from model.gpt import GPT, fused_attention
from model.packed import PackedLinear
from model.timing import best_seconds

# The least a compile of the decode step has cost on a CPU here: small.yaml's 3-layer step with a warm inductor
# cache, 6.2 s (23 s cold; GPT-2 small's 12 layers 27 s cold: benchmarks/RESULTS.md). A lower bound on what the
# compile costs, so a generation that cannot save this much cannot repay it.
CPU_COMPILE_FLOOR_S = 6.0
# The same on a GPU (on CUDA the step is captured as a CUDA graph): GPT-2 small's on an H200 (torch 2.11), 17.8 s for
# the first cache length in a process and 8.0 s for a second one (benchmarks/RESULTS.md)
GPU_COMPILE_FLOOR_S = 8.0
TIMED_STEPS = 5  # eager decode steps timed by compile_repays (the best one counts)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of logits (B, vocab) -> (B,).

    temperature 0 is greedy (argmax). top_k keeps exactly the k highest logits (ties broken by index);
    top_p keeps the smallest set of most likely tokens whose probability reaches top_p (nucleus; ties
    broken by index too)."""
    if temperature == 0:
        # the first index of the row's largest, as argmax gives it, in the logits' own dtype: on a CPU max's
        # reduction is ~3x faster than argmax's over a 50,304-token row (21 against 63 us in float32; bfloat16
        # 35 us, against 90 for argmax after widening)
        return logits.max(dim=-1).indices
    # float64, shifted so the row max is 0: a tiny temperature (1e-40) then sends the other logits to
    # -inf instead of overflowing to inf - inf = NaN in the softmax
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        # torch.topk picks an arbitrary one among tied values: keep everything above the k-th value,
        # then the lowest-index ties until exactly k remain
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        above, tied = logits > kth, logits == kth
        room = top_k - above.sum(dim=-1, keepdim=True)  # how many tied tokens still fit
        logits = logits.masked_fill(~(above | (tied & (tied.cumsum(dim=-1) <= room))), float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the tokens ranked above
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))  # the first always stays
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return draw_proportional(logits.exp(), generator)  # the row max is 0: weights in [0, 1], the largest 1


def draw_proportional(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of weights (B, V) >= 0, each row's largest > 0, drawn with probability weight / row sum
    -> (B,). Inverse CDF: a uniform u in [0, total) picks the first index whose running sum exceeds u, so index i
    owns [cdf_{i-1}, cdf_i), an interval as long as its weight (empty for weight 0). One running sum and one
    uniform per row: at a 50,257-token vocabulary ~0.05 ms, where torch.multinomial's one exponential draw per
    entry took ~1.1 ms a token on a 2-core CPU."""
    cdf = weights.cumsum(dim=-1)  # (B, V), non-decreasing: every weight >= 0
    total = cdf[:, -1:].contiguous()  # (B, 1)
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device, generator=generator) * total  # [0, total]
    index = torch.searchsorted(cdf, u, right=True)  # (B, 1): first i with cdf_i > u; V when u rounded up to total
    last = torch.searchsorted(cdf, total)  # the first index where the sum reaches its total: a weight > 0
    return torch.minimum(index, last).squeeze(-1)


def eager_attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """The fused-attention kernels eager decoding may take on `device`: on CUDA every one but cuDNN's, elsewhere
    whatever PyTorch picks. PyTorch prefers cuDNN's attention on Hopper GPUs (torch >= 2.10 with a recent cuDNN),
    which builds a plan for every new key length (tens of milliseconds each), and eager decoding reaches a new key
    length at every token: GPT-2 small decoded at 10-16 tok/s through sample.py in bfloat16 on an H200, against
    ~260 tok/s in a process that had met those lengths before (benchmarks/RESULTS.md). Flash attention and the
    memory-efficient kernel need no plan. Compiled CUDA decoding attends over the whole static buffer (one length)
    and is left to PyTorch's choice."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def decode_cache_dtype(model: GPT, batch_size: int, max_len: int, compiled: bool = False) -> torch.dtype:
    """The dtype generate keeps its KV cache in: the model's, or float32 under a narrower model decoding eagerly on
    a CPU where the fused attention kernel measured faster in float32 there (float32_attention_faster). CPU flash
    attention over one bfloat16 query is slow: GPT-2 small's heads over 100 cached positions took 80-150 us a layer
    in bfloat16 against ~45 us on a float32 cache, over 1,000 positions 1,090 against 180 us, on an AVX512-BF16 CPU
    (benchmarks/RESULTS.md). A float32 cache holds the same numbers (each bfloat16 key and value widened exactly)
    and is read as it is stored (CausalSelfAttention.forward), twice the memory of a bfloat16 one. Compiled decode
    steps keep the model's, and so does a model on our decode attention kernel (model/decode_attention.py), which
    was timed faster on the model's dtype than the fused kernel on either."""
    dtype, device = model.tok_emb.weight.dtype, model.tok_emb.weight.device
    attn = model.blocks[0].attn
    if (compiled or device.type != "cpu" or dtype == torch.float32 or not dtype.is_floating_point
            or attn.decode_kernel is not None):
        return dtype
    length = max(1, max_len // 2)  # the mean context of a generation that fills the cache
    wide = float32_attention_faster(dtype, batch_size, attn.n_head, attn.n_kv_head, attn.head_dim, length)
    return torch.float32 if wide else dtype


@functools.cache
def float32_attention_faster(dtype: torch.dtype, batch_size: int, n_head: int, n_kv_head: int, head_dim: int,
                             length: int) -> bool:
    """Whether one decoded query per row attends over `length` cached positions faster with the fused kernel in
    float32 (q widened, k and v stored in float32) than in `dtype`, timed on this CPU once per shape."""
    generator = torch.Generator().manual_seed(0)  # its own: the caller's seeded draws stay what they would have been
    q = torch.randn(batch_size, n_head, 1, head_dim, generator=generator).to(dtype)
    k, v = (torch.randn(batch_size, n_kv_head, length, head_dim, generator=generator).to(dtype) for _ in range(2))
    k32, v32 = k.float(), v.float()
    # a few calls: the two kernels part by 1.8-6x where they part (decode_cache_dtype's figures), and each generate
    # in a new process (sample.py) pays for this inside the time it reports
    best = best_seconds({"narrow": lambda: fused_attention(q, k, v, None, causal=False),
                         "float32": lambda: fused_attention(q, k32, v32, None, causal=False, float32=True)},
                        rounds=3, calls=2)
    return best["float32"] < best["narrow"]


# a public API with its sampling settings as keywords, as transformers' and nanoGPT's generate have
@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, use_kv_cache: bool = True,
             stop_token: int | None = None, on_token: Callable[[torch.Tensor], None] | None = None,
             compile: bool = False) -> torch.Tensor:
    """Continue prompt (B, T0) by up to max_new_tokens tokens; returns (B, T0' + n) where T0' <= block_size
    (a longer prompt keeps its last block_size tokens). Stops early once every row has produced
    stop_token (rows that stopped earlier keep producing tokens the caller should cut at stop_token).
    on_token receives each new column (B,) as soon as it is drawn (for streaming).
    compile: run the one-token decode steps through `compiled_decode_step` (KV cache only; the prefills stay
    eager). Its first call compiles (seconds to a minute); worth it for long generations or repeated calls.
    Runs in inference mode, where each op costs less than under no_grad (no version counters, no view tracking:
    0.3-0.5 ms less a token for a decode step of GPT-2 small's 12 layers on a 2-core CPU, measured at width 96);
    what it returns is a plain tensor."""
    block_size = model.config.block_size
    keep = max(1, block_size // 2)
    prompt = prompt[:, -block_size:]
    B = prompt.shape[0]
    device = prompt.device
    was_training = model.training
    model.eval()
    out = [prompt]
    window = prompt  # (B, n): the tokens the model currently sees; through a KV cache only made when it slides
    seen = prompt.shape[1]  # n, the window's length
    finished = [False] * B  # per row: has it drawn stop_token
    decode = compiled_decode_step(model) if (compile and use_kv_cache) else None
    # on_token's surroundings, made once: a context manager's construction at every token cost ~15 us more, run
    # after the LM head has emptied the caches (each enter and exit below leaves the mode as it found it)
    leave_inference_mode, without_grad = torch.inference_mode(False), torch.no_grad()

    def forward(tokens: torch.Tensor, **kwargs) -> torch.Tensor:  # an eager pass -> logits
        with eager_attention_kernels(device):
            return model(tokens, **kwargs)[0]
    try:
        if use_kv_cache:
            # a cache as long as this generation can get: block_size only when the window may fill up (a model
            # with a long context, e.g. 32K positions, would otherwise allocate a 32K x 32K causal table)
            max_len = min(block_size, prompt.shape[1] + max(max_new_tokens, 1))
            if decode is not None:  # a compiled step is specialised to its cache length: round up to a power of
                max_len = min(block_size, 1 << (max_len - 1).bit_length())  # two, so few lengths ever compile
            model.setup_kv_cache(B, max_len, dtype=decode_cache_dtype(model, B, max_len, compiled=decode is not None),
                                 device=device)
        eager_step = eager_decode_step(model) if use_kv_cache and decode is None else None
        positions = torch.arange(seen, device=device) if use_kv_cache else None
        logits = forward(window, input_pos=positions, last_only=True)
        for drawn in range(1, max_new_tokens + 1):
            token = sample_next(logits[:, -1], temperature, top_k, top_p, generator)  # (B,)
            out.append(token[:, None])
            if on_token is not None:
                # a plain tensor, which the caller may keep and train on; its code runs without grad, as before
                with leave_inference_mode, without_grad:
                    on_token(token.clone())
            if stop_token is not None:  # on the host: one transfer, where tensor ops would be four a token
                finished = [done or drawn_id == stop_token for done, drawn_id in zip(finished, token.tolist())]
                if all(finished):
                    break
            if drawn == max_new_tokens:  # the last token: no step after it, its logits would go unused
                break
            n, seen = seen, seen + 1
            if n == block_size:  # no room for the new token: slide, keep the last `keep` tokens
                window, seen = torch.cat(out, dim=1)[:, -keep:], keep
                positions = torch.arange(keep, device=device) if use_kv_cache else None  # prefilled again at 0..
                logits = forward(window, input_pos=positions, last_only=True)
            elif decode is not None:
                logits = decode(token[:, None], torch.tensor([n], device=device))
            elif eager_step is not None:
                logits = eager_step(token[:, None], n)
            else:
                window = torch.cat([window, token[:, None]], dim=1)
                logits = forward(window, last_only=True)
    finally:
        if use_kv_cache:
            model.clear_kv_cache()
        model.train(was_training)
    with torch.inference_mode(False):  # the tokens as a plain tensor, which the caller may change in place
        return torch.cat(out, dim=1)


def eager_decode_step(model: GPT) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The eager `(token (B, 1), position) -> logits (B, 1, vocab)` step generate runs through the KV cache set up
    on the model: on a CPU the flat step (model/decode.py) where it applies, else the modules' forward, under
    eager_attention_kernels either way. Built after setup_kv_cache, once per generation."""
    device = model.tok_emb.weight.device
    flat = EagerDecodeStep(model) if EagerDecodeStep.applies(model) else None

    def step(token: torch.Tensor, pos: int) -> torch.Tensor:
        with eager_attention_kernels(device):
            if flat is not None:
                return flat(token, pos)
            return model(token, input_pos=torch.tensor([pos], device=device))[0]
    return step


def compiled_decode_step(model: GPT) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A compiled `(token (B, 1), input_pos (1,)) -> logits (B, 1, vocab)` step through the model's KV cache.

    On a CPU the step attends over the written prefix, as eager code does: the prefix length enters the graph
    as a dynamic size (the length of `seen`, positions 0..n), so one graph serves every position and the work
    grows with the context instead of being the whole buffer's from the first token (GPT-2 6 x 384, 992 tokens
    in a 1024-slot cache: 1.10x a whole-buffer step; benchmarks/RESULTS.md).
    On CUDA every step attends over the whole preallocated buffer, the causal table's row masking the unwritten
    slots, because the step is captured as a CUDA graph (mode "reduce-overhead"), which needs static shapes: a
    decode step of a small model is a few hundred tiny kernels, and launching them costs more than running them.
    Built once per model and kept on it (`GPT.setup_kv_cache` reuses the same cache buffers for the same batch
    size and cache length, so later generate() calls reuse the compiled graph too).
    On a CPU the step's logits get the check every eager pass ends with (GPT._check_finite: one reduction, and
    a CPU has no device to wait for); a CUDA graph's are not checked, which would wait for the device at every
    token."""
    step = model.__dict__.get("_compiled_decode")
    if step is None:
        on_cpu = model.tok_emb.weight.device.type == "cpu"

        def decode(token: torch.Tensor, seen: torch.Tensor, head_columns: torch.Tensor | None) -> torch.Tensor:
            # seen: the positions written once this token is, 0..n (CPU); or (n,) alone (CUDA: whole buffer)
            hidden, _ = model._hidden(token, seen[-1:], kv_len=seen.shape[0] if on_cpu else None)  # (B, 1, d_model)
            # on a CPU, the column-major head (GPT.logits) also inside the graph; passed in, so a changed
            # weight reaches the compiled code without a recompile (None: a head that is no nn.Linear, e.g. int8)
            return hidden @ head_columns if head_columns is not None else model.lm_head(hidden)
        compiled = torch.compile(decode, mode=None if on_cpu else "reduce-overhead", dynamic=False)

        if on_cpu:
            positions = torch.arange(model.config.block_size)

            def step(token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
                n = int(input_pos)
                if n + 1 == model.causal_table.shape[0]:
                    # the buffer's last slot: a whole-buffer slice is contiguous, and the graph would have to
                    # specialise on that length; this one step runs eagerly instead
                    return model(token, input_pos=input_pos)[0]
                seen = positions[:n + 1]
                torch._dynamo.mark_dynamic(seen, 0)  # one graph for every prefix length
                logits = compiled(token, seen, model.head_columns() if model.head_is_linear() else None)
                model._check_finite(logits, token, input_pos, None)  # the eager pass's check, outside the graph
                return logits
        else:
            def step(token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
                return compiled(token, input_pos, None)
        model.__dict__["_compiled_decode"] = step
    return step


@torch.no_grad()
def compile_repays(model: GPT, batch_size: int, new_tokens: int,
                   timings: Callable[[GPT, int], tuple[float, float]] | None = None) -> tuple[bool, str]:
    """Whether compiling the decode step (generate(compile=True)) can pay for itself in a generation of
    `new_tokens` tokens of `batch_size` rows, and a line saying why.

    A compiled step runs the same matmuls as an eager one, on the kernels compiled code calls (F.linear on the
    weights as stored, the LM head as one x @ W^T); what it can save is the rest of the eager step: the per-op
    overhead, the norms, attention and the elementwise work. So at most new_tokens x (eager step - those matmuls
    alone), both timed here on this machine (`timings`: model, batch -> the two, in seconds; step_timings by
    default), and only if that exceeds what a compile costs at the least (CPU_COMPILE_FLOOR_S). An eager step on
    prepacked weights (model/packed.py) may already be faster than the compiled code's matmuls alone: then nothing
    can be saved. Already compiled for this model in this process: repays.
    On a GPU the compiled step (on CUDA a CUDA graph) runs kernels this does not time: it can save at most the whole
    eager step, new_tokens x eager step, against GPU_COMPILE_FLOOR_S (only the eager step of `timings` is read)."""
    if model.__dict__.get("_compiled_decode") is not None:
        return True, "already compiled in this process"
    if model.tok_emb.weight.device.type != "cpu":
        eager_s = timings(model, batch_size)[0] if timings else eager_step_seconds(model, batch_size)
        saving_s = new_tokens * eager_s
        return saving_s > GPU_COMPILE_FLOOR_S, (
            f"an eager step takes {eager_s * 1e3:.2f} ms, so a CUDA graph can save at most {saving_s:.2f} s over "
            f"{new_tokens} tokens, against a compile of at least {GPU_COMPILE_FLOOR_S:g} s on a GPU")
    eager_s, matmuls_s = (timings or step_timings)(model, batch_size)
    saving_s = new_tokens * max(0.0, eager_s - matmuls_s)
    why = (f"an eager step takes {eager_s * 1e3:.2f} ms and the matmuls compiled code would run {matmuls_s * 1e3:.2f} "
           f"ms, so compiling can save at most {saving_s:.2f} s over {new_tokens} tokens, against a compile of at "
           f"least {CPU_COMPILE_FLOOR_S:g} s on a CPU")
    return saving_s > CPU_COMPILE_FLOOR_S, why


def step_timings(model: GPT, batch_size: int) -> tuple[float, float]:
    """(an eager decode step, the matmuls compiled code would run for it), seconds on this machine."""
    return eager_step_seconds(model, batch_size), compiled_matmul_seconds(model, batch_size)


def eager_step_seconds(model: GPT, batch_size: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The best of TIMED_STEPS eager one-token decode steps through a KV cache, as generate runs them
    (eager_decode_step), after a one-token prefill (a cache of TIMED_STEPS + 2 slots, then cleared);
    on a GPU each step waited for."""
    was_training = model.training
    model.eval()
    device = model.tok_emb.weight.device
    token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
    wait = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    try:
        model.setup_kv_cache(batch_size, min(model.config.block_size, TIMED_STEPS + 2))
        with eager_attention_kernels(device):
            model(token, input_pos=torch.tensor([0], device=device), last_only=True)
        step = eager_decode_step(model)
        best = float("inf")
        for pos in range(1, min(model.config.block_size, TIMED_STEPS + 1)):
            wait()
            t0 = clock()
            step(token, pos)
            wait()
            best = min(best, clock() - t0)
    finally:
        model.clear_kv_cache()
        model.train(was_training)
    return best


def compiled_matmul_seconds(model: GPT, batch_size: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """One decode step's matmuls alone as compiled code runs them, best of TIMED_STEPS, on (batch_size, 1, in) rows:
    F.linear on the weights of each block's matmuls where they are float (packed ones included: compiled code
    cannot run oneDNN's packed layout), the module's compiled path otherwise (Int8Linear.run without its one-row
    kernels, model/quantize.py); the LM head as x @ head_columns, or its own module's compiled path."""
    weight = model.tok_emb.weight
    layers = [getattr(parent, attr) for _, parent, attr in model.matmul_slots()]  # the LM head last
    generator = torch.Generator().manual_seed(0)  # its own: the caller's seeded draws stay what they would have been
    rows = {m.in_features: torch.randn(batch_size, 1, m.in_features, generator=generator).to(weight.device,
                                                                                               weight.dtype)
            for m in layers}
    calls = [(lambda m=m: F.linear(rows[m.in_features], m.weight, m.bias)) if isinstance(m, (nn.Linear, PackedLinear))
             else (lambda m=m: m.run(rows[m.in_features], one_row_kernels=False)) for m in layers[:-1]]
    head_input = rows[model.lm_head.in_features]
    if model.head_is_linear():
        head = model.head_columns()  # (d_model, vocab_size)
        calls.append(lambda: head_input @ head)
    else:
        calls.append(lambda: model.lm_head.run(head_input, one_row_kernels=False))
    return best_seconds({"matmuls": lambda: [call() for call in calls]}, rounds=TIMED_STEPS, calls=1,
                        clock=clock)["matmuls"]

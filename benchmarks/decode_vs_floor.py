"""A decode step against the matmul floor, token by token: how much of each step is not its matmuls, and where.

model.generate.generate decodes random weights of one of sample_vs_hf.py's SHAPES in --dtype on the CPU, batch 1,
greedy, with the matmul weights as sample.py leaves them (model.packed.pack_linears, timed). After every drawn
token, inside on_token, one pass of the model's own matmul modules alone is timed (_limits.matmul_pass: each
block's four, then the LM head as decode runs it, on one token's input). So decode steps and floor passes
alternate one for one: a slow spell of a shared machine falls on both, and their ratio holds where absolute
speeds drift by 20-30% between minutes. A decode step is the time from one token to the next less the floor pass
between them (the prefill is not one); the first floor pass, a warm-up, is left out.

Each round then generates twice more with every matmul call timed where it is made (matmul_calls_timed: the
kernels generate's flat decode step binds for each matmul layer and the head, model/decode.py, and the modules'
own calls in a pass that goes through them, record when they start and end):
  - as it is: the matmuls' own time inside a step, set against the floor pass (the same matmuls back to back),
    and the time between them, split by the matmul each stretch follows (after attn.qkv_proj: attention over
    the cache and its writes; after lm_head: the sampling, the next token's embedding and the Python around
    them, up to the first block's first matmul);
  - with every matmul module swapped for a stand-in returning zeros of its output shape (NoMatmul, timing
    only): the same ops between, with nothing streaming weights through the caches between them.
Where the ops between take longer inside a real step than with the matmuls left out, they pay for what the
matmuls' weights evicted from the caches (their data, their code, the Python objects they touch), not for work
of their own: a stretch of a few hundred small ops, warm, can take several times as long after a matmul has
streamed megabytes through the core's cache.

Per round: the medians over its decode steps; then the medians over the rounds.

With --quantize the model is quantized first, as sample.py does it: its matmul modules are then Int8Linear, whose
calls include each token's activation digits (model/quantize.py), in the floor pass and in a step alike.

    python benchmarks/decode_vs_floor.py [--shape gpt2-124m] [--dtype bfloat16] [--quantize int8] [--new-tokens 128]
        [--prompt 32] [--rounds 3] [--threads 2] [--no-save]
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

import torch

import _decode_model
import _limits
import _report
import model.decode as decode_module
from common.errors import ArgumentParser, user_errors_exit
from common.huge_pages import restart_in_huge_pages
from model import GPT
from model.generate import decode_cache_dtype, generate


def one_round(model: GPT, prompt: torch.Tensor, n_new: int) -> tuple[float, float]:
    """(median decode step, median floor pass), seconds, over one generation of n_new tokens after `prompt`."""
    floor_pass = _limits.matmul_pass(model)
    steps, floors = [], []
    last_end = None  # when the previous floor pass ended: the next decode step starts there

    def on_token(token: torch.Tensor) -> None:
        nonlocal last_end
        arrived = time.perf_counter()
        if last_end is not None:
            steps.append(arrived - last_end)
        floor_pass()  # on_token runs without grad, as the decode step does
        last_end = time.perf_counter()
        floors.append(last_end - arrived)

    generate(model, prompt, n_new, temperature=0.0, on_token=on_token)
    return statistics.median(steps), statistics.median(floors[1:])


class NoMatmul(torch.nn.Module):
    """Timing only: stands in for a matmul module of in_features -> out_features and returns zeros (..., out_features)
    in its input's dtype, made once per shape, so that a decode step runs everything but its matmuls."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._zeros: dict[tuple, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (*x.shape[:-1], x.dtype)
        if key not in self._zeros:
            self._zeros[key] = x.new_zeros(*x.shape[:-1], self.out_features)
        return self._zeros[key]


@contextlib.contextmanager
def matmuls_left_out(model: GPT):
    """Every matmul module of `model` (GPT.matmul_slots, the LM head included) replaced by a NoMatmul for the
    duration, then put back."""
    kept = [(parent, attr, getattr(parent, attr)) for _, parent, attr in model.matmul_slots()]
    try:
        for parent, attr, module in kept:
            setattr(parent, attr, NoMatmul(module.in_features, module.out_features))
        yield
    finally:
        for parent, attr, module in kept:
            setattr(parent, attr, module)


Mark = tuple[int, float, float]  # (matmul slot index in GPT.matmul_slots order, start, end) of one call


def timed_call(call, index: int, marks: list[Mark]):
    """`call`, appending (index, start, end) to `marks` at every call; marked with the slot it times."""
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        marks.append((index, start, time.perf_counter()))
        return out
    timed.timed_slot = index
    return timed


@contextlib.contextmanager
def matmul_calls_timed(model: GPT, marks: list[Mark]):
    """For the duration, every call of a matmul slot appends (slot index, start, end) to `marks`, on either path a
    pass takes:
      - through the modules (a prefill): each block matmul module's forward and GPT.logits (the head as decode runs
        it: on a CPU a product with a column-major copy of its weight, not its module), shadowed on the instances,
        so the modules keep their types (what GPT.head_is_linear and model/packed.py look at);
      - through generate's flat decode step (model/decode.py): the kernels it binds for each matmul layer and the
        head (linear_kernel, head_kernel), each wrapped where it is made (a kernel that is a layer's own shadowed
        forward is already timed).
    Put back after."""
    slots = model.matmul_slots()
    owners = [(getattr(parent, attr), "forward") for _, parent, attr in slots[:-1]] + [(model, "logits")]
    slot_of = {id(getattr(parent, attr)): index for index, (_, parent, attr) in enumerate(slots)}
    shadowed = [(owner, name, owner.__dict__.get(name)) for owner, name in owners]
    kernels = {"linear_kernel": decode_module.linear_kernel, "head_kernel": decode_module.head_kernel}

    def timed_linear_kernel(linear, *args):
        kernel = kernels["linear_kernel"](linear, *args)
        if hasattr(kernel, "timed_slot") or id(linear) not in slot_of:
            return kernel
        return timed_call(kernel, slot_of[id(linear)], marks)

    def timed_head_kernel(gpt, *args):
        kernel = kernels["head_kernel"](gpt, *args)
        return kernel if hasattr(kernel, "timed_slot") else timed_call(kernel, len(slots) - 1, marks)
    try:
        for index, (owner, name) in enumerate(owners):
            owner.__dict__[name] = timed_call(getattr(owner, name), index, marks)
        decode_module.linear_kernel, decode_module.head_kernel = timed_linear_kernel, timed_head_kernel
        yield
    finally:
        decode_module.linear_kernel, decode_module.head_kernel = kernels["linear_kernel"], kernels["head_kernel"]
        for owner, name, before in shadowed:
            if before is None:
                owner.__dict__.pop(name, None)
            else:
                owner.__dict__[name] = before


def slot_kinds(model: GPT) -> list[str]:
    """Per matmul slot, what it is within its block (attn.qkv_proj, ..., model.gpt.BLOCK_MATMULS), or lm_head."""
    return [name.split(".", 2)[2] if name.startswith("blocks.") else name for name, _, _ in model.matmul_slots()]


@dataclasses.dataclass
class StepSplit:
    """One decode step taken apart, seconds (medians over a generation's steps)."""
    step: float  # from a step's first matmul call to the next step's
    matmuls: float  # the matmul calls' own time, summed
    between: dict[str, float]  # per slot kind: the time from the end of such a call to the start of the next one


def split_steps(marks: list[Mark], kinds: list[str]) -> StepSplit:
    """marks of one generation (the prefill's calls first, then each decode step's, len(kinds) calls each) ->
    the medians over its decode steps, each step from its first call to the next step's first call, so the
    stretch after the LM head (sampling, the next token's embedding) is its last."""
    per_step = len(kinds)
    steps = [marks[i:i + per_step] for i in range(per_step, len(marks) - per_step + 1, per_step)]
    if len(steps) < 2 or any([index for index, _, _ in s] != list(range(per_step)) for s in steps):
        raise ValueError(f"expected the prefill's and then whole decode steps of {per_step} matmul calls each in "
                         f"slot order, got {len(marks)} calls")
    totals, matmuls, between = [], [], {kind: [] for kind in kinds}
    for this, after in zip(steps, steps[1:]):
        totals.append(after[0][1] - this[0][1])
        matmuls.append(sum(end - start for _, start, end in this))
        stretch = {kind: 0.0 for kind in between}
        for (index, _, end), (_, next_start, _) in zip(this, [*this[1:], after[0]]):
            stretch[kinds[index]] += next_start - end
        for kind, seconds in stretch.items():
            between[kind].append(seconds)
    return StepSplit(statistics.median(totals), statistics.median(matmuls),
                     {kind: statistics.median(v) for kind, v in between.items()})


def timed_generation(model: GPT, prompt: torch.Tensor, n_new: int) -> StepSplit:
    """One generation of n_new tokens after `prompt` with every matmul call timed (matmul_calls_timed), taken
    apart step by step (split_steps)."""
    marks: list[Mark] = []
    with matmul_calls_timed(model, marks):
        generate(model, prompt, n_new, temperature=0.0)
    return split_steps(marks, slot_kinds(model))


def main() -> None:
    parser = ArgumentParser(prog="decode_vs_floor", description=__doc__.splitlines()[0])
    _decode_model.add_flags(parser, new_tokens=128, new_tokens_help="tokens generated a round", rounds=3)
    _report.save_flags(parser)
    args = parser.parse_args()
    with user_errors_exit("decode_vs_floor"):
        machine_line = _decode_model.start(args, least_new_tokens=3)
        model, packing, prompt = _decode_model.build(args)
        cache = decode_cache_dtype(model, 1, args.prompt + args.new_tokens)
        rows = []  # per round: (decode step, floor pass, StepSplit as it is, StepSplit with the matmuls left out)
        for r in range(args.rounds):
            step_s, floor_s = one_round(model, prompt, args.new_tokens)
            real = timed_generation(model, prompt, args.new_tokens)
            with matmuls_left_out(model):
                left_out = timed_generation(model, prompt, args.new_tokens)
            rows.append((step_s, floor_s, real, left_out))
            print(f"  round {r + 1}: decode step {step_s * 1e3:.2f} ms, floor pass {floor_s * 1e3:.2f} ms, "
                  f"ratio {floor_s / step_s:.3f}; matmuls timed in a step {real.matmuls * 1e3:.2f} ms, between "
                  f"them {(real.step - real.matmuls) * 1e3:.2f} ms, {(left_out.step - left_out.matmuls) * 1e3:.2f} "
                  f"with the matmuls left out", flush=True)

        def cells(step_s: float, floor_s: float, matmuls_s: float, between_s: float, left_out_s: float,
                  bold: str = "") -> str:
            return (f"{step_s * 1e3:.2f} | {floor_s * 1e3:.2f} | {bold}{floor_s / step_s:.3f}{bold} | "
                    f"{matmuls_s * 1e3:.2f} | {matmuls_s / floor_s:.2f} | {between_s * 1e3:.2f} | "
                    f"{left_out_s * 1e3:.2f} | {bold}{between_s / left_out_s:.2f}{bold}")
        numbers = [(s, f, real.matmuls, real.step - real.matmuls, left.step - left.matmuls)
                   for s, f, real, left in rows]
        medians = [statistics.median(x) for x in zip(*numbers)]
        kinds = list(rows[0][2].between)
        stretches = [(kind, statistics.median(real.between[kind] for *_, real, _ in rows),
                      statistics.median(left.between[kind] for *_, left in rows)) for kind in kinds]
        quantize_flag = f", --quantize {args.quantize}" if args.quantize else ""
        lines = [f"- {args.shape} in {args.dtype}{quantize_flag}, batch 1, greedy, prompt {args.prompt}, "
                 f"{args.new_tokens} new tokens, KV cache in {str(cache).removeprefix('torch.')}; {packing}.",
                 "- decode step = token to token less the floor pass between them; floor pass = the model's matmul "
                 "modules alone on one token (_limits.matmul_pass), timed after every token; matmuls in a step = "
                 "the matmul calls' own time in a generation with each call timed where it is made "
                 "(matmul_calls_timed); between = that generation's step less its matmuls; left out = the same "
                 "with every matmul module returning zeros (NoMatmul); medians per round.",
                 "", "| round | decode step ms | floor pass ms | floor / step | matmuls in a step ms | in a step / "
                 "floor | between the matmuls ms | between, matmuls left out ms | between / left out |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                 *(f"| {i + 1} | {cells(*n)} |" for i, n in enumerate(numbers)),
                 f"| median | {cells(*medians, bold='**')} |",
                 "", "Between the matmuls, by the matmul each stretch follows (a step's stretches after all the "
                 "layers' calls of that kind, summed; medians over the rounds):",
                 "", "| after | in a step ms | matmuls left out ms | in a step / left out |", "|---|---:|---:|---:|",
                 *(f"| {kind} | {real_s * 1e3:.3f} | {left_s * 1e3:.3f} | {real_s / left_s:.2f} |"
                   for kind, real_s, left_s in stretches)]
        print("\n".join(lines))
        _report.save(args, "A decode step against the matmul floor, token by token", machine_line,
                     "decode_vs_floor.py", *lines)


if __name__ == "__main__":
    restart_in_huge_pages("decode_vs_floor")  # as sample.py runs: both sides and the floors on the same pages
    main()

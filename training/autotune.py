"""`dtype: auto` and `train.compile: auto`: chosen by timing real training steps on this machine and model.

Why measure: the same code is 2x faster in bf16 on a CPU with AMX and 3x slower on one without it, and
torch.compile repays its compile time on a long run of a small model but not on a short one. No constant
can know which machine it runs on, so a run with either setting on `auto` times a few of its own training
steps (forward, backward, clip, optimizer step, on one batch of its own data) in each candidate -- the
candidates compared timed in turn, ROUNDS rounds, each keeping its fastest round -- and keeps the fastest:

  1. float32 eager (always: the baseline, and what an explicit `dtype: float32` would run);
  2. bfloat16 autocast eager, when the device supports bf16 and a short matmul probe does not already show
     bf16 matmuls slower than float32 ones (then its training steps cannot be faster: they are matmuls);
     Before 1 and 2 are timed, when bfloat16 is a candidate under `dtype: auto` and the model runs the fast
     attention paths (attn_impl sdpa): one layer's attention alone, forward and backward at the run's shape, in
     each of them (attention_kernel_timings: the fused kernel on q, k, v in bfloat16, the same on float32
     copies, and the formula as chunked bfloat16 matmuls); the fastest is kept when MIN_GAIN faster than the
     fused kernel as autocast gives it (GPT.set_attention_kernel), so the bfloat16 steps are timed with it,
     and dropped again when float32 wins;
  3. the winner of 1-2 compiled, when compile is `auto` and the rest of the run, at the eager pace, lasts
     at least COMPILE_MIN_RUN_S (compiling costs tens of seconds on a CPU: a shorter run cannot repay it).

A candidate other than float32 eager is kept only when it is at least MIN_GAIN faster, so `auto` is never slower
than plain float32 eager beyond noise; and only when every candidate's fastest round is confirmed by another of
its rounds within ROUND_NOISE: rounds further apart say the machine's load changed while they were timed, by up to
their spread, and the comparison then keeps its baseline, the safe default, saying so, unless the fastest beat it
by more than that spread times MIN_GAIN, which no such change of load explains (`compare`). The steps are timed
while the run is resolved (training/plan.py), on a model of the run's shape built for the timing, before the
run's own model exists: a run with `auto` trains exactly as the same run with the chosen settings written out
(`choose` also puts back the weights, optimizer state and RNG streams of what it timed). What it decided is a
value, `Precision`, that the run is built with; nothing is changed afterwards. The choice is saved in out_dir
(CHOICE_FILE) and a resume reuses it without measuring again. Explicit settings are obeyed as written and never
measured.

What the run prints: before timing, what is timed, about how long it takes and how to skip it; before
compiling, why and that it takes a while; then one summary line. The summary gives each comparison with the
numbers it was decided on: 1-2 are timed together, 3 against the winner's eager step timed again beside it,
minutes later, when the machine's load may differ, so the two comparisons are never mixed into one ratio.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from common.schema import is_number
from common.writes import write_file
from training.config import RunConfig, TrainConfig
from training.optim import Optimizers
from training.runtime import DTYPES, Runtime, seconds_of, synchronize
from training.step import accumulate_gradients, apply_gradients
from training.run_dir import could_not_write

COMPILE_MIN_RUN_S = 60.0  # try compiling only when the run's remaining eager time is at least this long
MEASURE_S = 1.0  # time each candidate for about this long in all (at least MIN_STEPS steps a round)
# the attention kernels alone: a call is a tenth of a step or less, and the kernels differ by 1.3-2.7x where they
# differ at all, so ~5 calls a round settle them in a third of a training step's time
KERNEL_MEASURE_S = 0.3
MIN_STEPS = 2
# candidates compared with each other are timed in turn, ROUNDS times, each keeping its fastest round: drift and
# bursts of load on a shared machine hit a round, not every round of one candidate (timed one after the other,
# a 1.2x compile gain once measured 1.05x and the run went eager)
ROUNDS = 3
# what compiling costs, said before it starts: configs/small.yaml's model took 38 s on a 2-core CPU (58 s under load
# from other processes); torch's compile cache makes a repeat of the same model on one machine a few seconds
FIRST_COMPILE = "~20-60 s"


# --------------------------------------------------------------------------------------------------------------------
# What auto decided (Choice, with the comparisons behind it) and its file in out_dir: CHOICE_FILE, written
# atomically by the run that owns out_dir, read back whole on a resume (anything damaged reads as none saved).
# --------------------------------------------------------------------------------------------------------------------

CHOICE_FILE = "autotune.json"
MIN_GAIN = 1.05  # a candidate must beat float32 eager by 5% (timing noise on a shared machine is a few %)
# a candidate's fastest round counts when another of its rounds is within this factor of it: on a busy machine one
# float32 step was timed at 191 ms and, moments later, 2,863 ms, and no ratio drawn from such rounds means anything
ROUND_NOISE = 1.25
UNITS = ("ms/step", "ms/call")
# the attention kernels timed, by the names their timings carry, and the model's name for each (model/gpt.py
# ATTENTION_KERNELS); the baseline, "{dtype} attention", is the fused kernel as the autocast gives it q, k, v
FLOAT32_ATTENTION = "float32 attention"  # the fused kernel on float32 copies of q, k, v
MATMUL_ATTENTION = "matmul attention"  # the formula as chunked batched matmuls (model.gpt.matmul_attention)
KERNEL_OF = {FLOAT32_ATTENTION: "fused float32", MATMUL_ATTENTION: "matmul"}  # any other name: "fused"


def kernel_kept(attention: "Comparison | None") -> str:
    """The model's name (ATTENTION_KERNELS) of the kernel a comparison kept: "fused" unless another measured
    faster, and where nothing was measured."""
    return KERNEL_OF.get(attention.kept, "fused") if attention is not None else "fused"


@dataclass
class Comparison:
    """Candidates timed in turn (ms per step, each its fastest round) and the one kept: `baseline` unless
    another beat it by MIN_GAIN. A choice saved before comparisons were recorded holds one with its flat
    table of numbers and no baseline (they were not all timed together, so no ratio is drawn from them)."""

    ms_per_step: dict[str, float]  # ms per training step, or per call of what is timed (`unit`)
    baseline: str | None = None
    kept: str | None = None
    unit: str = "ms/step"  # or "ms/call": one forward and backward of the fused attention kernel
    # the candidates whose rounds disagreed beyond ROUND_NOISE, each with its second-fastest round over its fastest:
    # then the baseline is kept, unless the fastest beat it by more than the largest spread times MIN_GAIN
    unsettled: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """'bfloat16 602.3 vs float32 854.7 ms/step: 1.42x, kept' for each candidate against the baseline."""
        if self.baseline is None or len(self.ms_per_step) == 1:
            return "; ".join(f"{name} {ms:.1f} {self.unit}" for name, ms in self.ms_per_step.items())
        base = self.ms_per_step[self.baseline]
        parts = []
        for name, ms in self.ms_per_step.items():
            if name != self.baseline:
                spread = ", ".join(f"{n}'s rounds {r:.2f}x apart" for n, r in self.unsettled.items())
                if name == self.kept:
                    verdict = (f"kept ({spread}, and {base / ms:.2f}x is beyond that times {MIN_GAIN:.2f})"
                               if self.unsettled else "kept")
                elif self.unsettled and self.kept == self.baseline:
                    verdict = f"not kept ({spread}, beyond the {ROUND_NOISE}x of noise: kept the safe default)"
                elif base / ms >= MIN_GAIN:  # fast enough, but another candidate was faster still
                    verdict = f"not kept ({self.kept} faster)"
                else:
                    verdict = f"not kept (under {MIN_GAIN:.2f}x)"
                parts.append(f"{name} {ms:.1f} vs {self.baseline} {base:.1f} {self.unit}: {base / ms:.2f}x, {verdict}")
        return "; ".join(parts)

    @classmethod
    def from_json(cls, d: Any) -> "Comparison":
        ms = d.get("ms_per_step") if isinstance(d, dict) else None
        if not (isinstance(ms, dict) and ms
                and all(isinstance(k, str) and is_number(v) and v > 0 for k, v in ms.items())):
            raise ValueError(f"ms_per_step is not a table of positive timings: {str(ms)[:120]}")
        baseline, kept, unit = d.get("baseline"), d.get("kept"), d.get("unit", "ms/step")
        if not ((baseline is None and kept is None) or (baseline in ms and kept in ms)):
            raise ValueError(f"baseline {str(baseline)[:40]!r} / kept {str(kept)[:40]!r} are not among the timings")
        if unit not in UNITS:
            raise ValueError(f"unit {str(unit)[:40]!r} is not one of {', '.join(UNITS)}")
        unsettled = d.get("unsettled", {})
        if not (isinstance(unsettled, dict) and all(k in ms and is_number(v) and v >= 1 for k, v in unsettled.items())):
            raise ValueError(f"unsettled is not a table of the timings' spreads: {str(unsettled)[:120]}")
        return cls(ms_per_step={k: float(v) for k, v in ms.items()}, baseline=baseline, kept=kept, unit=unit,
                   unsettled={k: float(v) for k, v in unsettled.items()})


@dataclass
class Choice:
    """What `auto` settled on, and the comparisons behind it, in the order they were made."""

    dtype: str  # "float32" | "bfloat16" | "float16" (the autocast dtype; weights stay float32)
    compile: bool
    comparisons: list[Comparison] = field(default_factory=list)
    compile_seconds: float | None = None
    note: str = ""  # why a candidate was skipped or failed
    # the attention kernels timed in the chosen lower-precision dtype, the fused kernel as autocast gives it q, k,
    # v the baseline (None: not measured -- float32 chosen, the from-scratch path, or dtype set explicitly)
    attention: Comparison | None = None

    @property
    def attention_kernel(self) -> str:
        """The attention kernel kept (model/gpt.py ATTENTION_KERNELS): "fused" unless another measured faster."""
        return kernel_kept(self.attention)

    def summary(self) -> str:
        """One line for the run's log: the choice, then each comparison with the numbers it was decided on."""
        parts = [c.describe() for c in self.comparisons]
        if self.attention is not None:
            parts.insert(1, self.attention.describe())  # after the dtype comparison it was measured in
        if self.compile_seconds is not None:
            parts.append(f"compile took {self.compile_seconds:.0f} s")
        measured = "; ".join(parts) if parts else "nothing measured"
        return (f"auto: dtype {self.dtype}, compile {'on' if self.compile else 'off'} "
                f"({measured}{'; ' + self.note if self.note else ''})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Choice":
        """The saved choice, checked whole (a ValueError on anything else: the run then measures again). A
        file of the earlier layout (one flat ms_per_step table) reads as one comparison without a baseline."""
        if not (isinstance(d, dict) and d.get("dtype") in DTYPES and isinstance(d.get("compile"), bool)):
            raise ValueError(f"not a dtype/compile choice: {str(d)[:120]}")
        seconds = d.get("compile_seconds")
        if not (seconds is None or (is_number(seconds) and seconds >= 0)):
            raise ValueError(f"compile_seconds is not a number of seconds: {str(seconds)[:60]}")
        if "comparisons" in d:
            if not isinstance(d["comparisons"], list):
                raise ValueError(f"comparisons is not a list: {str(d['comparisons'])[:120]}")
            comparisons = [Comparison.from_json(c) for c in d["comparisons"]]
        else:  # the earlier layout
            ms = d.get("ms_per_step") or {}
            comparisons = [Comparison.from_json({"ms_per_step": ms})] if ms else []
        attention = d.get("attention")
        if attention is not None:
            attention = Comparison.from_json(attention)
            timed, baseline = set(attention.ms_per_step), attention.baseline
            if not (attention.unit == "ms/call" and baseline in {f"{name} attention" for name in DTYPES}
                    and FLOAT32_ATTENTION in timed and timed <= {baseline, *KERNEL_OF}):
                raise ValueError(f"attention is not a comparison of attention kernels: {str(d['attention'])[:120]}")
        return cls(dtype=d["dtype"], compile=d["compile"], comparisons=comparisons, compile_seconds=seconds,
                   note=str(d.get("note", "")), attention=attention)


def saved_choice(out_dir: Path) -> Choice | None:
    """The choice a previous run of this out_dir made, or None (none saved, or unreadable: measure again)."""
    try:
        return Choice.from_json(json.loads((Path(out_dir) / CHOICE_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def save_choice(out_dir: Path, choice: Choice) -> None:
    """Written by the run that owns out_dir (holding its lock), atomically (temp file + rename)."""
    path = Path(out_dir) / CHOICE_FILE
    with could_not_write(path, out_dir):
        write_file(path, json.dumps(choice.to_json(), indent=2))


# --------------------------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------------------------


def bf16_matmul_ratio(device: torch.device, size: int = 512, reps: int = 4, rounds: int = 3) -> float:
    """bf16 / float32 matmul throughput on this device (> 1: bf16 is faster), from a short probe of `rounds`
    rounds, the dtypes in turn within each, each dtype's fastest round kept. One pass of each, one after the
    other, once read a CPU whose bf16 matmuls are 2.8x float32's as 0.72x (a burst of load on a shared
    machine hit the bf16 pass), and the run trained in float32, 1.2x slower."""
    gen = torch.Generator(device=device).manual_seed(0)
    operands = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size, device=device, generator=gen).to(dtype)
        b = torch.randn(size, size, device=device, generator=gen).to(dtype)
        a @ b  # first call: kernel selection, packing
        operands[dtype] = (a, b)
    seconds = {dtype: math.inf for dtype in operands}
    for _ in range(rounds):
        for dtype, (a, b) in operands.items():
            seconds[dtype] = min(seconds[dtype], seconds_of(lambda: a @ b, device, reps, time.perf_counter))
    return seconds[torch.float32] / seconds[torch.bfloat16]


def attention_kernel_timings(model: nn.Module, batch_size: int, seq_len: int, dtype: str,
                             device: torch.device) -> dict[str, float]:
    """ms per call of one layer's causal attention, forward and backward, at the run's shape (batch_size x
    seq_len, `model`'s heads, kv heads and head_dim) under `dtype` autocast, in each kernel: the fused one on
    q, k, v in `dtype` as autocast gives them ("{dtype} attention"), the same on float32 copies
    (FLOAT32_ATTENTION), and chunked batched matmuls (MATMUL_ATTENTION); timed in turn as the training steps
    are (_time_rounds). Why: at head_dim 32 (GQA 4/2, block 256) CPU flash attention's bfloat16 backward ran
    slower than its float32 one (65 against 44 ms a step of small.yaml) and the matmuls faster than both,
    which no whole-step comparison of dtypes can separate from the projections', where bfloat16 wins."""
    from model.gpt import fused_attention, matmul_attention
    config = model.config
    gen = torch.Generator(device=device).manual_seed(0)
    amp = DTYPES[dtype]

    def tensor(heads: int, grad: bool = True) -> torch.Tensor:
        t = torch.randn(batch_size, heads, seq_len, config.head_dim, device=device, generator=gen).to(amp)
        return t.requires_grad_(grad)

    q, k, v = tensor(config.n_head), tensor(config.n_kv_head), tensor(config.n_kv_head)
    grad_out = tensor(config.n_head, grad=False)

    def call(attention: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast(device.type, dtype=amp):
                out = attention()
            torch.autograd.grad(out, (q, k, v), grad_out)
        return run

    runs = {f"{dtype} attention": call(lambda: fused_attention(q, k, v, None, True, config.dropout)),
            FLOAT32_ATTENTION: call(lambda: fused_attention(q, k, v, None, True, config.dropout, float32=True)),
            MATMUL_ATTENTION: call(lambda: matmul_attention(q, k, v, config.dropout))}
    for run in runs.values():
        run()  # warm-up: kernel selection, allocator
    return _time_rounds(runs, device, KERNEL_MEASURE_S)


def _fused_model(model: nn.Module) -> bool:
    """A model whose forward pass runs the fast attention paths (attn_impl sdpa) and can choose between them."""
    config = getattr(model, "config", None)
    return getattr(config, "attn_impl", None) == "sdpa" and hasattr(model, "set_attention_kernel")


@contextmanager
def _restored(model: nn.Module, optimizers: Optimizers, device: torch.device) -> Iterator[None]:
    """Weights, optimizer state and RNG streams, put back exactly after the block (the measurement)."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optim_state = copy.deepcopy(optimizers.state_dict())
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        with torch.no_grad():
            model.load_state_dict(weights)
        optimizers.load_state_dict(optim_state)
        optimizers.zero_grad()
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


class Timings(dict):
    """ms per step of each candidate, its fastest round (what is compared), and `rounds`: every round's ms per
    step, which say whether the machine's load held still while they were timed (`compare`)."""

    def __init__(self, rounds: dict[str, list[float]]):
        super().__init__({name: min(ms) for name, ms in rounds.items()})
        self.rounds = rounds


def _time_rounds(steps: dict[str, Callable[[], None]], device: torch.device, measure_s: float | None = None
                 ) -> Timings:
    """Each candidate's ms per step, in ROUNDS rounds of the candidates in turn (a lone one: one round), each
    round about measure_s / ROUNDS seconds of it (default MEASURE_S)."""
    measure_s = MEASURE_S if measure_s is None else measure_s
    rounds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(ROUNDS if len(steps) > 1 else 1):
        for name, step in steps.items():
            n, elapsed = 0, 0.0  # MIN_STEPS steps at least, and about measure_s / ROUNDS seconds
            synchronize(device)
            t0 = time.perf_counter()
            while n < MIN_STEPS or elapsed < measure_s / ROUNDS:
                step()
                n += 1
                synchronize(device)
                elapsed = time.perf_counter() - t0
            rounds[name].append(1e3 * elapsed / n)
    return Timings(rounds)


def choose(timed: tuple[nn.Module, Optimizers, tuple[torch.Tensor, torch.Tensor]], rt: Runtime, tc: TrainConfig,
           steps_left: int, dtype_setting: str, say: Callable[[str], None] = lambda line: None
           ) -> tuple[Choice, nn.Module | None]:
    """Time the candidates (module doc) on `timed`, (a model, its optimizers, one batch), stepping as the run's
    `train:` section says (grad_accum, grad_clip); return (choice, the compiled model if compile won, else None).
    Only the run's settings on "auto" (dtype_setting, tc.compile) are chosen. `say` gets the lines the user waits
    on: what is timed and for about how long, and why the model is compiled, before each. The model and optimizers
    end exactly as they started, but for the attention kernel's precision where it was chosen (module doc)."""
    model, optimizers, batch = timed
    compile_setting = tc.compile
    device = rt.device
    dtypes = [dtype_setting] if dtype_setting != "auto" else ["float32"]
    notes = []
    if dtype_setting == "auto" and _bf16_supported(device):
        ratio = bf16_matmul_ratio(device)
        if ratio >= 1.0:
            dtypes.append("bfloat16")
        else:
            notes.append(f"bfloat16 skipped: its matmuls run at {ratio:.2f}x float32 here")
    single = dataclasses.replace(rt, world_size=1, rank=0)  # measured alone, outside DDP
    x, y = batch
    comparisons: list[Comparison] = []

    def steps_with(runner: nn.Module, dtype: str) -> Callable[[], None]:
        step_rt = dataclasses.replace(single, autocast_dtype=DTYPES[dtype] if dtype != "float32" else None)

        def step() -> None:
            loss, norm = accumulate_gradients(runner, model, lambda: (x, y), step_rt, tc, None, optimizers)
            loss.item(), norm.item()  # the loop reads both back every step
            optimizers.set_compute_dtype(step_rt.autocast_dtype)  # Muon's iteration in the candidate's dtype
            apply_gradients(optimizers)
        return step

    with _restored(model, optimizers, device):
        eager = {dtype: steps_with(model, dtype) for dtype in dtypes}
        for i, step in enumerate(eager.values()):
            # a warm-up: allocator, kernel selection, optimizer state
            step_s = seconds_of(step, device, clock=time.perf_counter)
            if i == 0:  # the pace the announcement estimates from (the other warm-ups follow it)
                say(announcement(dtypes, dtype_setting, compile_setting, step_s))
        attention = None
        lower = [d for d in dtypes if d != "float32"]
        if dtype_setting == "auto" and lower and _fused_model(model):
            # the kernel's precision first, so that the bfloat16 steps are timed with the faster kernel: timed
            # with the slower one, a CPU's bfloat16 steps once read 1.03x float32 and the run trained in float32
            kernel_ms = attention_kernel_timings(model, x.size(0), x.size(1), lower[0], device)
            attention = compare(kernel_ms, f"{lower[0]} attention", unit="ms/call")
            model.set_attention_kernel(kernel_kept(attention))  # before any compile
        ms = _time_rounds(eager, device)
        baseline = "float32" if dtype_setting == "auto" else dtypes[0]
        comparisons.append(compare(ms, baseline))
        best = comparisons[-1].kept
        if best == "float32" and attention is not None:  # no autocast: the kernel's precision does not arise
            attention = None
            model.set_attention_kernel("fused")
        compiled, compile_seconds, use_compile = None, None, compile_setting is True
        if compile_setting == "auto":
            eager_left_s = steps_left * ms[best] / 1e3
            if eager_left_s < COMPILE_MIN_RUN_S:
                notes.append(f"compile not tried: the run has ~{eager_left_s:.0f} s left, under "
                             f"{COMPILE_MIN_RUN_S:.0f} s")
            else:
                say(f"auto: compiling the model to time it against eager {best} (the run has ~{eager_left_s:.0f} s "
                    f"left at {ms[best]:.0f} ms/step, at least {COMPILE_MIN_RUN_S:.0f} s); a first compile takes "
                    f"{FIRST_COMPILE} on a CPU, a few seconds when torch's compile cache holds the model")
                try:
                    compiled = torch.compile(model)
                    step = steps_with(compiled, best)
                    # twice: the first call compiles forward and backward, a second can recompile (e.g. after the
                    # optimizer's first step)
                    compile_seconds = seconds_of(step, device, 2, time.perf_counter)
                    # eager again, in turn with the compiled step: the two numbers compared share the minutes
                    pair = _time_rounds({best: eager[best], f"{best} compiled": step}, device)
                    comparisons.append(compare(pair, best))
                    use_compile = comparisons[-1].kept != best
                except Exception as e:  # no C++ compiler, an unsupported op, ...: stay eager
                    notes.append(f"compile failed ({type(e).__name__}: {' '.join(str(e).split())[:100]})")
    choice = Choice(dtype=best, compile=use_compile, comparisons=comparisons,
                    compile_seconds=None if compile_seconds is None else round(compile_seconds, 1),
                    note="; ".join(notes), attention=attention)
    return choice, (compiled if use_compile else None)



def timing_seconds(n_candidates: int, step_s: float) -> float:
    """About how long timing n candidates takes after the first warm-up step, at step_s seconds a step: the
    other warm-ups, then what _time_rounds does."""
    rounds = ROUNDS if n_candidates > 1 else 1
    return (n_candidates - 1) * step_s + n_candidates * rounds * max(MEASURE_S / ROUNDS, MIN_STEPS * step_s)


def announcement(dtypes: list[str], dtype_setting: str, compile_setting: bool | str, step_s: float) -> str:
    """The line printed before timing: what is timed, about how long it takes (from the first warm-up step's
    pace, step_s seconds), and the explicit settings that skip it."""
    seconds = timing_seconds(len(dtypes), step_s)
    what = (f"{' and '.join(dtypes)} training steps to choose dtype" if len(dtypes) > 1
            else f"{dtypes[0]} training steps")
    line = f"auto: timing {what} (~{math.ceil(seconds)} s at {1e3 * step_s:.0f} ms a step)"
    if compile_setting == "auto":
        line += (f", then, if the run lasts at least {COMPILE_MIN_RUN_S:.0f} s at that pace, a compiled step to "
                 f"choose train.compile (a first compile takes {FIRST_COMPILE} on a CPU)")
    skip = [*(["dtype=float32 or bfloat16"] if dtype_setting == "auto" else []),
            *(["train.compile=false or true"] if compile_setting == "auto" else [])]
    return f"{line}; skip it by setting {' and '.join(skip)}"


def compare(timings: dict[str, float], baseline: str, unit: str = "ms/step") -> Comparison:
    """The comparison of candidates timed in turn (a `Timings` also holds every round; module doc). A lone
    round confirms nothing and contradicts nothing."""
    rounds = getattr(timings, "rounds", {name: [ms] for name, ms in timings.items()})
    spreads = {}  # second-fastest round over the fastest, for the candidates beyond ROUND_NOISE
    for name, ms in rounds.items():
        fastest, *others = sorted(ms)
        if others and others[0] > fastest * ROUND_NOISE:
            spreads[name] = others[0] / fastest
    # rounds that disagree say the load moved by up to their spread while they were timed, so a fastest round may
    # have been slowed by that much: a gain smaller than the spread (times MIN_GAIN) may be the load's, a larger
    # one cannot be, and stands
    kept = _fastest(timings, baseline, MIN_GAIN * max(spreads.values(), default=1.0))
    unsettled = {name: round(spread, 2) for name, spread in spreads.items()}
    # to 6 significant digits for the saved choice (never 0, unlike a fixed number of decimals)
    rounded = {name: float(f"{ms:.6g}") for name, ms in timings.items()}
    return Comparison(rounded, baseline, kept, unit=unit, unsettled=unsettled)


def _fastest(ms: dict[str, float], baseline: str, min_gain: float = MIN_GAIN) -> str:
    """The fastest candidate, unless it beats the baseline by less than `min_gain`: then the baseline."""
    best = min(ms, key=ms.get)
    return best if ms[baseline] / ms[best] >= min_gain else baseline


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"  # bf16 autocast runs on every CPU; the probe decides whether it is worth timing


@dataclass(frozen=True)
class Precision:
    """How a run computes: settled once, before its model is built (training/plan.py), never changed after."""

    autocast_dtype: torch.dtype | None  # None: plain float32 (the weights always stay float32)
    compile: bool  # torch.compile the model
    attention_kernel: str = "fused"  # the fast path of plain causal attention (GPT.set_attention_kernel)


# builds what auto times, when it has to measure: (a model of the run's shape, its optimizers, one batch of the
# run's data); called on the main process only, and only when no saved choice is reused
TimingRun = Callable[[], tuple[nn.Module, Optimizers, tuple[torch.Tensor, torch.Tensor]]]


def decide_precision(cfg: RunConfig, rt: Runtime, timing_run: TimingRun | None, steps_left: int, resumed: bool,
                     say: Callable[[str], None] = lambda line: None) -> tuple[Choice | None, Precision]:
    """The run's precision and compile setting, and what `auto` decided (None when nothing is on auto).

    Explicit settings are taken as written (rt.autocast_dtype holds the explicit dtype's). With `auto`: reuse the
    choice saved in out_dir on a resume, else time the candidates on the main process (`choose`, on what
    timing_run builds) and save the choice there (the process that owns out_dir), then share it with the other
    processes. Under FSDP auto is not timed: the shards' mixed precision is fixed when the model is sharded, and
    one process cannot time steps that need all of them. `say`: where the lines printed while measuring go."""
    tc = cfg.train
    explicit = Precision(rt.autocast_dtype, tc.compile is True)
    if cfg.dtype != "auto" and tc.compile != "auto":
        return None, explicit
    if tc.parallel == "fsdp":
        say(f"auto under FSDP (not timed): dtype {str(rt.autocast_dtype or 'float32').replace('torch.', '')}, "
            f"compile {'on' if explicit.compile else 'off'}")
        return None, explicit
    out_dir = Path(cfg.out_dir)
    choice = saved_choice(out_dir) if resumed else None
    if choice is None:
        if rt.is_main:
            choice, _ = choose(timing_run(), rt, tc, steps_left, cfg.dtype, say)
            save_choice(out_dir, choice)
        if rt.ddp:
            import torch.distributed as dist
            shared = [choice.to_json() if choice is not None else None]
            dist.broadcast_object_list(shared, src=0)
            choice = Choice.from_json(shared[0])
    say(choice.summary())
    autocast = (None if choice.dtype == "float32" else DTYPES[choice.dtype]) if cfg.dtype == "auto" \
        else rt.autocast_dtype
    return choice, Precision(autocast_dtype=autocast,
                             compile=choice.compile if tc.compile == "auto" else explicit.compile,
                             attention_kernel=choice.attention_kernel if autocast is not None else "fused")

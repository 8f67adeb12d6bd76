"""Where and how the run executes: device, precision, processes (DDP), seeds, and the device's peak FLOP/s."""
from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.distributed as dist

from common.device import resolve_device
from common.errors import UserError
from common.host_memory import keep_freed_memory

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Runtime:
    """Where and how a run executes; frozen: resolved once (training/plan.py), never changed afterwards."""

    device: torch.device
    autocast_dtype: torch.dtype | None  # None: plain float32; params always stay float32 (master weights)
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    compile: bool = False  # torch.compile the model (train.compile; `auto` is decided by training/autotune.py)

    @property
    def ddp(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


def resolve_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    if dtype == "float32":
        return None
    if dtype == "float16" and device.type != "cuda":
        raise UserError(f"dtype float16 needs a CUDA GPU (device is {device}): use bfloat16 or float32")
    return DTYPES[dtype]


@dataclass(frozen=True)
class DistributedEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1


LAUNCH_HINT = ("torchrun sets them all (torchrun --nproc_per_node=N train.py CONFIG); for one process, unset "
               "WORLD_SIZE, RANK and LOCAL_RANK")


def distributed_env(environ: Mapping[str, str] | None = None) -> DistributedEnv:
    """This process's place in a torchrun group, from WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT,
    checked before torch.distributed reads them: a missing or malformed variable is a UserError naming it
    (one process when WORLD_SIZE is unset or 1)."""
    env = os.environ if environ is None else environ

    def integer(name: str) -> int | None:
        text = env.get(name)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            raise UserError(f"environment variable {name}={text!r} is not an integer: {LAUNCH_HINT}") from None

    world_size, rank, local_rank = integer("WORLD_SIZE"), integer("RANK"), integer("LOCAL_RANK")
    if world_size is None or world_size == 1:
        for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
            if value not in (None, 0):
                raise UserError(f"{name}={value} is set but WORLD_SIZE is {'not' if world_size is None else '1'}: "
                                f"{LAUNCH_HINT}")
        return DistributedEnv()
    if world_size < 1:
        raise UserError(f"WORLD_SIZE={world_size}: must be at least 1; {LAUNCH_HINT}")
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
        if value is None:
            raise UserError(f"WORLD_SIZE={world_size} is set but {name} is not: {LAUNCH_HINT}")
        if not 0 <= value < world_size:
            raise UserError(f"{name}={value} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}): {LAUNCH_HINT}")
    if not env.get("MASTER_ADDR", "").strip():
        raise UserError(f"WORLD_SIZE={world_size} is set but MASTER_ADDR is not (the address of rank 0): "
                        f"{LAUNCH_HINT}")
    port = integer("MASTER_PORT")
    if port is None or not 1 <= port <= 65535:
        raise UserError(f"MASTER_PORT={env.get('MASTER_PORT')!r} is not a port number (1..65535): {LAUNCH_HINT}")
    return DistributedEnv(rank, local_rank, world_size)


def setup_runtime(device_name: str, dtype: str) -> Runtime:
    """Single process, or one process of a `torchrun` group (RANK/WORLD_SIZE set): NCCL on CUDA, gloo on CPU."""
    env = distributed_env()
    device = resolve_device(device_name)
    if device.type == "cpu":
        keep_freed_memory()  # each step's activations reused, not faulted in again (common/host_memory.py)
    if env.world_size > 1:
        if device.type == "cuda":
            device = torch.device("cuda", env.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Runtime(device, resolve_autocast(dtype, device), env.rank, env.local_rank, env.world_size)


def teardown_runtime(rt: Runtime, finished: bool = False) -> None:
    """Leave the process group. finished: this process ended its run normally; it then waits at a barrier
    for the others first, so no process tears down its gloo threads while a peer still has work in flight
    with it (a process leaving early has aborted at exit in C++: "terminate called without an active
    exception"). A process leaving on an error does not wait: torchrun stops its peers."""
    if dist.is_initialized():  # torchrun's group, or the one-process group of an FSDP run
        if finished and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Python, numpy and torch RNG states as tensors and plain lists (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    state = {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def seconds_of(run: Callable[[], Any], device: torch.device, reps: int = 1,
               clock: Callable[[], float] | None = None) -> float:
    """Seconds that `reps` calls of run() take, the device synchronized before and after. clock: the caller's
    time.perf_counter, looked up where it is called (tests stand in a clock of their own)."""
    clock = clock or time.perf_counter
    synchronize(device)
    t0 = clock()
    for _ in range(reps):
        run()
    synchronize(device)
    return clock() - t0


def measure_peak_flops(device: torch.device, dtype: torch.dtype | None, size: int | None = None,
                       rounds: int = 3) -> float:
    """FLOP/s of a large square matmul in the training dtype: the 'peak' MFU is measured against.
    Measured, not looked up, so it is honest on any machine (never a hard-coded A100 number). The fastest
    of `rounds` timings: a burst of other load during one of them would otherwise lower the peak and put the
    run's MFU above 100%."""
    dtype = dtype or torch.float32
    size = size or (8192 if device.type == "cuda" else 1024)
    gen = torch.Generator(device=device).manual_seed(0)  # its own generator: never shifts the run's RNG stream
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    for _ in range(2):
        a @ b
    reps = 10 if device.type == "cuda" else 4
    fastest = min(seconds_of(lambda: a @ b, device, reps) for _ in range(rounds))
    return 2 * size**3 * reps / fastest


class PeakFlops:
    """One device's peak FLOP/s, what MFU divides by, and the rule that keeps every MFU shown a fraction.

    A run that computes faster than its peak proves the peak wrong: measured while other processes held the
    cores (a start-up on a busy machine once gave mfu=146%), or given too low as train.peak_flops. A measured
    peak is then measured again, once, and the larger kept; while the run is still faster, its own fastest
    rate stands in for the peak. From then on the MFU is an upper bound (the true peak is at least that rate),
    marked `bounded`, and `say` is told once why."""

    def __init__(self, given: float | None, measure: Callable[[], float], say: Callable[[str], None]):
        self.given, self.measure, self.say = given, measure, say  # measure: its matmul rate now (measure_peak_flops)
        self.value = given or measure()
        self.measured_again = given is not None  # a given peak is the user's number: never replaced by a measure
        self.bounded = False

    def mfu(self, flops_per_s: float) -> float:
        """flops_per_s (one device's) over the peak: never above 1."""
        if flops_per_s > self.value and not self.measured_again:
            self.measured_again = True
            self.value = max(self.value, self.measure())
        if flops_per_s > self.value:
            if not self.bounded:
                source = "given as train.peak_flops" if self.given is not None else "measured at start and again"
                self.say(f"note: this run computes {flops_per_s:.3g} FLOP/s per device, more than the peak {source} "
                         f"({self.value:.3g}); MFU is shown against the run's fastest rate from here on, an upper "
                         f"bound (shown as <=): set train.peak_flops to the device's peak for an exact figure")
            self.bounded = True
            self.value = flops_per_s
        return flops_per_s / self.value

"""Sharded data parallelism (FSDP2), and what every multi-process run needs: stopping together.

`train.parallel: ddp` (the default) keeps a whole model and optimizer on every process and all-reduces
gradients (DistributedDataParallel, training/trainer.py `_wrap`). `train.parallel: fsdp` shards them:
`torch.distributed.fsdp.fully_shard` on every transformer block and then on the root (embeddings, final
norm, LM head), so each process holds 1/N of every parameter, gradient and AdamW moment, and gathers one
block's full weights only while that block runs (and frees them after: reshard_after_forward). A model
whose weights + Adam state (16 bytes per parameter in fp32) do not fit one GPU trains across N of them.

- Where the model is built: on the CPU, at full size (so every process starts from the same seeded
  init, the one a single process would have); `fully_shard` then moves one block at a time to the
  device and keeps only its shard there. The full model must fit host memory, not the GPU.
- Mixed precision follows `dtype`: bfloat16 -> `MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`: blocks compute with bf16 copies of the fp32 sharded master weights, and gradients
  are reduce-scattered in fp32. float32: no policy. float16 is refused (its loss scaling is untested on
  sharded gradients; bf16 needs none).
- Gradient accumulation: a reduce-scatter after every micro-batch, so gradients accumulate sharded, in
  fp32 (skipping the sync would accumulate unsharded gradients in the compute dtype: bf16 on a GPU).
- The attention monitor's `attention_maps` is registered as an FSDP forward method: with sharded
  weights it is a collective, so every process runs it (`MonitorFollower` on ranks other than 0).
- Checkpoints: training/dist_checkpoint.py.

FSDP2 on CPU with gloo (torch 2.13), as found here (tests/training/test_parallel_fsdp.py, the 124M dry run in
tests/cli/test_train_gpt2_recipe.py, and probes of each feature):
- works: fully_shard per block + root, fp32 and bf16 params (gloo's all-gather and reduce-scatter take
  fp32, bf16 and fp16, AVG included), fused AdamW and clip_grad_norm_ over DTensors, Muon
  (training/muon.py gathers each row-sharded matrix, orthogonalises it whole and keeps its own rows:
  tests/training/test_muon.py),
  torch.compile of the sharded model, torch.distributed.checkpoint save/load, full state dicts.
- does not work: CPUOffloadPolicy (parameters offloaded to host memory) raises "Cannot access accelerator
  device when none is available": offloading needs a GPU; attngpt does not use it.
- slow: bf16 params on a CPU without bf16 instructions (AVX2 only, this machine) run a step ~10x slower
  than fp32 (4 layers of width 256, 2 processes: 19 s vs 2.0 s). CPU FSDP proves correctness, not speed.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from common.device import torch_version
from common.errors import UserError
from training.runtime import Runtime

STOP_CODES = {None: 0, "requested": 1, "SIGINT": 2, "SIGTERM": 3}


def fsdp2() -> Any:
    """The module that holds the FSDP2 API (fully_shard, FSDPModule, MixedPrecisionPolicy, ...): public in
    `torch.distributed.fsdp` from PyTorch 2.6 on, `torch.distributed._composable.fsdp` in 2.4 and 2.5."""
    import torch.distributed.fsdp as public
    if hasattr(public, "fully_shard"):
        return public
    from torch.distributed._composable import fsdp as composable
    return composable


def is_sharded(model: nn.Module) -> bool:
    """True for a model wrapped by `fully_shard` (its class becomes FSDP<name>)."""
    return isinstance(model, fsdp2().FSDPModule)


def check_fsdp_settings(autocast_dtype: torch.dtype | None, device: torch.device) -> None:
    if device.type == "cpu" and torch_version() < (2, 6):
        # before 2.6, FSDP2 creates CUDA streams whatever the device
        raise UserError(f"train.parallel=fsdp on a CPU needs PyTorch >= 2.6 (this is {torch.__version__}): "
                        "upgrade torch, or use train.parallel=ddp")
    if autocast_dtype == torch.float16:
        raise UserError("dtype float16 is not supported with train.parallel=fsdp (its loss scaling is untested on "
                        "sharded gradients): use dtype bfloat16, which needs no loss scaling")


def shard_model(model: nn.Module, rt: Runtime) -> nn.Module:
    """fully_shard every block, then the root, over all processes; mixed precision from the run's dtype.
    `model` is the CPU-built GPT; it comes back sharded on rt.device (the same object, now an FSDP module)."""
    from torch.distributed.device_mesh import init_device_mesh

    check_fsdp_settings(rt.autocast_dtype, rt.device)
    fsdp = fsdp2()
    if not dist.is_initialized():  # FSDP needs a process group even as one process (no torchrun): one in memory
        dist.init_process_group("nccl" if rt.device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)  # (HashStore: no port, no file)
    mesh = init_device_mesh(rt.device.type, (dist.get_world_size(),))
    bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if rt.autocast_dtype == torch.bfloat16 else {}
    policy = fsdp.MixedPrecisionPolicy(**bf16)
    for block in model.blocks:
        fsdp.fully_shard(block, mesh=mesh, mp_policy=policy)
    fsdp.fully_shard(model, mesh=mesh, mp_policy=policy)
    fsdp.register_fsdp_forward_method(model, "attention_maps")  # the monitor's forward pass gathers weights too
    return model


def agreed_stop(signal_name: str | None, device: torch.device) -> str | None:
    """The stop request of any process, for all of them: a save is collective (FSDP) and every process
    must run the same number of steps, so all stop after the same step or none does. (On the run's
    device: NCCL reduces CUDA tensors only.)"""
    flag = torch.tensor(STOP_CODES[signal_name], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return {code: name for name, code in STOP_CODES.items()}[int(flag)]


class MonitorFollower:
    """On ranks other than 0 of an FSDP run: runs the attention probe whenever rank 0's monitor does (it is
    a collective with sharded weights) and records nothing."""

    def __init__(self, cfg: Any, model: nn.Module, prepared: Any, rt: Runtime) -> None:
        from training.attn_monitor import Probes

        self.model, self.interval, self.seconds = model, cfg.wandb.attn_interval, 0.0
        self.probes = Probes(cfg, model, prepared, rt)

    def due(self, step: int) -> bool:
        return self.interval is not None and step % self.interval == 0

    def record_icl(self, step: int, icl_score: float) -> None:
        pass  # rank 0 records it

    def summary(self) -> None:
        return None  # rank 0 sums the run up

    def snapshot(self, step: int) -> None:
        self.probes.run(self.model)  # the same forward passes as rank 0's AttentionMonitor.snapshot

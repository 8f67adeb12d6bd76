"""The run config: one YAML file, sections mapped onto dataclasses, dotted overrides on the command line.

    out_dir, seed, device, dtype      top level
    model:  ModelConfig               (model/config.py; vocab_size comes from the tokenizer unless set)
    data:   DataConfig                (data/config.py)
    train:  TrainConfig    eval: EvalConfig    wandb: WandbConfig    attn: AttnConfig

`load_run_config(path, overrides)` validates everything and raises `UserError` with one clear line.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from common.config_io import PATH, apply_overrides, check_ranges, closest, coerce, from_dict, load_yaml, to_dict
from common.errors import UserError
from common.schema import Float, Int
from data.config import DataConfig
from insight import ABLATION_MODES, AblationMode
from model.config import ModelConfig


@dataclass
class TrainConfig:
    batch_size: int = 32  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step, per process; global batch = batch_size*grad_accum*world_size
    max_iters: int = 2000  # optimizer steps in the whole run (a resumed run continues up to it)
    optimizer: Literal["adamw", "muon"] = "adamw"  # muon: Muon on 2-D hidden weights, AdamW on the rest
    lr: float = 1e-3  # peak learning rate (AdamW)
    min_lr: float | None = None  # end of the decay; None -> lr / 10 (Chinchilla)
    warmup_iters: int = 100  # linear warmup from lr/warmup_iters (never 0) to lr
    lr_decay_iters: int | None = None  # the decay ends here; None -> max_iters
    # after warmup: cosine (down to min_lr from the warmup's end, nanoGPT's), or wsd (warmup-stable-decay: the peak
    # held, then a straight line down to min_lr over the last cooldown_frac of the steps to lr_decay_iters)
    lr_schedule: Literal["cosine", "wsd"] = "cosine"
    cooldown_frac: float = 0.4  # wsd only: the share of the steps (up to lr_decay_iters) spent decaying
    weight_decay: float = 0.1  # on 2-D weights (matmuls, embeddings) only; never on norms and biases
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 turns clipping off
    # AdamW's peak learning rate for the embedding tables (tokens, and learned positions; a tied LM head is the token
    # table); None -> lr. A table row moves only when its token occurs, so it can take a far larger step than the
    # dense matrices do
    embedding_lr: float | None = None
    muon_lr: float = 0.02  # Muon's learning rate (it normalises updates, so it lives on another scale)
    muon_momentum: float = 0.95
    # torch.compile the model: true, false, or auto (timed against eager at start, tried only when the run is long
    # enough to repay the compile; training/autotune.py)
    compile: bool | Literal["auto"] = "auto"
    resume: Literal["auto", "never"] = "auto"  # auto: continue from out_dir/latest if present; never: refuse a used out_dir
    log_interval: int = 10  # steps between progress-bar/W&B scalar updates
    nonfinite: Literal["stop", "skip"] = "stop"  # a NaN/inf loss or gradient: stop the run, or skip the step and count it
    # one device's peak FLOP/s; MFU is per device (a process's FLOP/s over it). None -> measured at start with a
    # large matmul
    peak_flops: float | None = None
    # the starting weights: scratch (random init), or a pretrained model's -- an attngpt checkpoint or run out_dir,
    # a Hugging Face model folder or hub id (gpt2, a Llama-family id); its shape and tokenizer come with it
    init_from: str = field(default="scratch", metadata=PATH)
    # processes under torchrun: ddp (every process holds the whole model) or fsdp (parameters, gradients and
    # AdamW state sharded across processes: FSDP2, training/parallel.py)
    parallel: Literal["ddp", "fsdp"] = "ddp"

    # each setting's range, as data (common/config_io.py: check_ranges); the rules between settings follow
    RANGES: ClassVar = {**dict.fromkeys(("batch_size", "grad_accum", "max_iters", "log_interval"), Int(1)),
                        "lr": Float(above=0), "muon_lr": Float(above=0),
                        "embedding_lr": (Float(above=0), " (or null for train.lr)"), "warmup_iters": Int(0),
                        "cooldown_frac": Float(above=0, high=1), "lr_decay_iters": Int(1),
                        "weight_decay": Float(low=0), "grad_clip": Float(low=0),
                        **dict.fromkeys(("beta1", "beta2", "muon_momentum"), Float(low=0, below=1)),
                        "peak_flops": (Float(above=0), " (or null to measure it)")}

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr={self.min_lr}: must be in [0, lr={self.lr}]")
        if not self.init_from.strip():
            raise ValueError("init_from must be scratch, a checkpoint, a Hugging Face model folder or a hub id")


@dataclass
class EvalConfig:
    interval: int = 250  # steps between evaluations (and checkpoints); the last step always evaluates
    iters: int = 50  # batches averaged per split; the same batches at every eval, so evals compare fairly
    batch_size: int | None = None  # None -> train.batch_size

    RANGES: ClassVar = dict.fromkeys(("interval", "iters", "batch_size"), Int(1))

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)


@dataclass
class WandbConfig:
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # auto: online with credentials, else offline
    project: str = "attngpt"
    entity: str | None = None
    run_name: str | None = None  # None -> the out_dir's name
    attn_interval: int | None = None  # steps between attention snapshots; None -> every eval
    init_timeout: float = 90.0  # seconds wandb.init may wait for the server (online mode) before the run goes on without it

    RANGES: ClassVar = {"attn_interval": (Int(1), " (or null: at every eval)"),
                        "init_timeout": (Float(above=0, high=3600), " seconds")}

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)


MAX_ROLE_BATCH = 1024  # role probes held at once: 1024 x 101 tokens' maps of a layer are ~40 MB per head


@dataclass
class AttnConfig:
    enabled: bool = True  # log attention heatmaps and per-head statistics while training
    layers: list[int] | None = None  # layers drawn as heatmaps; None -> first, middle and last
    probe_text: str | None = None  # the text attention is shown on; None -> the first block_size tokens of val
    # sequences in the role probe (start token, R random ordinary tokens, the same R again: insight/roles.py)
    # that duplicate_token and induction are measured on
    role_batch: int = 8
    # how a head is removed for ablation_dloss on the probe text: zero its output, replace it by its mean over
    # positions, or off (no ablation: the stats.csv column stays empty, no W&B key). YAML reads a bare off as
    # false: that is taken as off too
    ablation: AblationMode | bool = "zero"

    RANGES: ClassVar = {"role_batch": (Int(1, MAX_ROLE_BATCH), " sequences")}

    def __post_init__(self) -> None:
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ValueError(f"layers={self.layers}: layer indices must be >= 0")
        check_ranges(self, self.RANGES)
        if self.ablation is False:
            self.ablation = "off"
        if self.ablation not in ABLATION_MODES:
            raise ValueError(f"ablation={self.ablation!r}: must be one of {', '.join(ABLATION_MODES)}")


MAX_SEED = 2**63 - 1


@dataclass
class RunConfig:
    # checkpoints, the resolved config, attention snapshots, W&B files (`~` is the home folder, as in every path)
    out_dir: str = field(default="runs/default", metadata=PATH)
    seed: int = 1337  # model init, batch order, dropout: one seed fixes the whole run (0 .. 2**63-1)
    device: str = "auto"  # auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps
    # autocast dtype; weights stay float32. auto: float32 or bfloat16, whichever trains faster here, timed at start
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    # set by load_run_config: True when the YAML leaves model.vocab_size to the tokenizer
    vocab_size_from_tokenizer: bool = field(default=True, init=False, repr=False)
    # set by load_run_config: the model settings the YAML (or an override) gives, type-checked, and whether it
    # sets data.tokenizer (train.init_from refuses a setting that contradicts the source, fills in the others)
    model_set: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    data_tokenizer_set: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:  # torch, numpy and the loader's SeedSequence all take this range
            raise ValueError(f"seed={self.seed}: must be an integer from 0 to 2**63-1")
        if self.train.init_from == "scratch":  # else the source's n_layer counts (training/init_from.py)
            problem = attn_layers_problem(self.attn.layers, self.model.n_layer)
            if problem:
                raise ValueError(problem)


def attn_layers_problem(layers: list[int] | None, n_layer: int, model: str = "the model") -> str | None:
    """Why attn.layers names a layer a model of n_layer layers lacks, or None when every one is there."""
    if layers is not None and any(layer >= n_layer for layer in layers):
        return f"attn.layers={layers}: {model} has layers 0..{n_layer - 1}"
    return None


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """YAML + overrides -> RunConfig. model.vocab_size is taken from the tokenizer unless the YAML sets it."""
    raw = apply_overrides(load_yaml(path), overrides or [], RunConfig)
    model_raw = raw.get("model")
    explicit_vocab = isinstance(model_raw, dict) and model_raw.get("vocab_size") is not None
    model_set = _model_settings(model_raw)
    train_raw = raw.get("train")
    if isinstance(train_raw, dict) and train_raw.get("init_from", "scratch") != "scratch":
        # the shape comes from the source: only the free keys build this ModelConfig (a partial section need
        # not be valid against the defaults); the others are checked against the source (training/init_from.py)
        raw = {**raw, "model": {k: v for k, v in model_set.items() if k in ("dropout", "attn_impl")}}
    config = from_dict(RunConfig, raw)
    config.vocab_size_from_tokenizer = not explicit_vocab
    config.model_set = model_set
    data_raw = raw.get("data")
    config.data_tokenizer_set = isinstance(data_raw, dict) and data_raw.get("tokenizer") is not None
    return config


def _model_settings(model_raw: Any) -> dict[str, Any]:
    """The `model:` keys given a value, each checked (an unknown key names the closest valid one) and typed."""
    if not isinstance(model_raw, dict):
        return {}
    hints = typing.get_type_hints(ModelConfig)
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in model_raw:
        if key not in hints:
            raise UserError(f"unknown config key 'model.{key}'{closest(str(key), names, 'model.')}")
    return {k: coerce(hints[k], v, f"model.{k}") for k, v in model_raw.items() if v is not None}


LOADER_FLAGS = ("vocab_size_from_tokenizer", "model_set", "data_tokenizer_set")  # not settings


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config_as_dict(config), sort_keys=False)


def config_as_dict(config: RunConfig) -> dict[str, Any]:
    return {name: value for name, value in to_dict(config).items() if name not in LOADER_FLAGS}

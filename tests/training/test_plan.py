"""training/plan.py's pieces that a run's first lines and its memory refusal come from, on a run's config
without training it: the line that says what is trained (describe), and the memory bound a run is held to,
whole and under FSDP (check_memory)."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import pretrained.memory as memory
from common.errors import UserError
from pretrained.memory import param_count
from tests.helpers import tiny_config
from training.plan import check_memory, describe
from training.runtime import Runtime

PREPARED = types.SimpleNamespace(train_tokens=1_234_567, val_tokens=8_910)


def _model_line(cfg, n_params: int, tail: str) -> str:
    m = cfg.model
    return (f"model: {n_params / 1e6:.2f}M parameters, {m.n_layer} layers, {m.n_head} heads ({m.n_kv_head} kv), "
            f"d_model {m.d_model}, block {m.block_size}; data: 1,234,567 train / 8,910 val tokens; device cpu{tail}")


@pytest.mark.parametrize("autocast, world_size, parallel, tail", [
    (None, 1, None, ""), (torch.bfloat16, 1, None, ", autocast bfloat16"),
    (None, 2, "ddp", ", 2 processes"), (torch.float16, 4, "fsdp", ", autocast float16, 4 processes, FSDP")])
def test_the_model_line_says_the_shape_data_device_autocast_and_processes(tmp_path, autocast, world_size, parallel,
                                                                          tail):
    cfg = tiny_config(tmp_path, "model.vocab_size=65", *([f"train.parallel={parallel}"] if parallel else []))
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=autocast, world_size=world_size)
    n_params = param_count(cfg.model)
    assert describe(cfg, rt, None, cfg.model, PREPARED, n_params) == [_model_line(cfg, n_params, tail)]


@pytest.mark.parametrize("block_size, cropped", [(32, ""), (16, "; context cropped to 16 of its 32")])
def test_a_fresh_start_from_a_source_says_where_its_weights_come_from_first(tmp_path, block_size, cropped):
    cfg = tiny_config(tmp_path, "model.vocab_size=65", "train.init_from=/models/src")
    source = types.SimpleNamespace(config=dataclasses.replace(cfg.model, block_size=32), kind="attngpt",
                                   tokenizer="CharTokenizer(65)")
    shape = dataclasses.replace(source.config, block_size=block_size)
    lines = describe(cfg, Runtime(device=torch.device("cpu"), autocast_dtype=None), source, shape, PREPARED,
                     param_count(shape))
    assert lines[0] == ("starting from the weights of /models/src (attngpt checkpoint), with a fresh optimizer and "
                        f"schedule; tokenizer 'CharTokenizer(65)'{cropped}")
    assert len(lines) == 2 and lines[1].startswith(f"model: {param_count(shape) / 1e6:.2f}M parameters")


def _needed(config, per_param: int) -> int:
    """pretrained/memory.py's bound, written out: parameters x bytes each + buffers + the modules' objects."""
    return param_count(config) * per_param + memory.buffer_bytes(config) + config.n_layer * memory.MODULE_BYTES_PER_LAYER


@pytest.mark.parametrize("world_size", [1, 3, 32])
@pytest.mark.parametrize("sharded", [False, True])
def test_a_run_is_refused_exactly_when_its_training_state_cannot_fit(tmp_path, monkeypatch, world_size, sharded):
    """Unsharded, every process holds 16 bytes a parameter (weights, gradients, AdamW's two moments); under FSDP
    the model is first built whole on the CPU (4 bytes a parameter), then each process keeps 1/world_size of
    the 16 (at least 1 byte). The device is given exactly the larger need, then one byte less."""
    cfg = tiny_config(tmp_path, "model.vocab_size=65")
    per_process = max(1, 16 // world_size) if sharded else 16
    whole = _needed(cfg.model, 4) if sharded else 0
    need = max(whole, _needed(cfg.model, per_process))
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=None, world_size=world_size)
    monkeypatch.setattr(memory, "device_memory", lambda device: need)
    check_memory(cfg.model, rt, sharded)
    monkeypatch.setattr(memory, "device_memory", lambda device: need - 1)
    with pytest.raises(UserError) as e:
        check_memory(cfg.model, rt, sharded)
    what = ("its weights, built whole before sharding" if whole >= _needed(cfg.model, per_process)
            else "its weights, gradients and AdamW moments")
    assert f"the model in this run's config has {param_count(cfg.model):,} parameters" in str(e.value)
    assert f": {what} would need {memory.human_bytes(need)}, but cpu has" in str(e.value)


def test_train_resume_never_refuses_an_out_dir_that_holds_a_checkpoint_saying_how_to_go_on(tmp_path):
    """The refusal comes before anything is read or prepared (the latest/ here is empty), names the out_dir
    and says both ways on: resume=auto, or another out_dir."""
    from training.checkpoint import LATEST
    from training.plan import resolve_run
    out = tmp_path / "run"
    (out / LATEST).mkdir(parents=True)
    rt = Runtime(device=torch.device("cpu"), autocast_dtype=None)
    with pytest.raises(UserError) as e:
        resolve_run(tiny_config(out, "train.resume=never"), rt, say=lambda line: None)
    assert str(e.value) == (f"out_dir '{out}' already holds a checkpoint and train.resume=never: set "
                            f"train.resume=auto to continue it, or choose another out_dir")


@pytest.mark.parametrize("vocab, size", [(65, 65), (1023, 1023), (1024, 1024), (1025, 1088), (50257, 50304)])
def test_a_scratch_model_takes_the_tokenizers_vocabulary_bpe_sized_ones_padded_to_a_multiple_of_64(tmp_path, vocab,
                                                                                                  size):
    from training.plan import with_vocab_size
    cfg = tiny_config(tmp_path)
    assert cfg.vocab_size_from_tokenizer
    shape = with_vocab_size(cfg, cfg.model, vocab)
    assert shape.vocab_size == size and size >= vocab and (size == vocab or size % 64 == 0)
    assert dataclasses.replace(shape, vocab_size=cfg.model.vocab_size) == cfg.model  # nothing else changes


def test_a_model_started_from_a_source_has_its_shape_with_this_configs_free_keys(tmp_path):
    """train.init_from: the source's shape, with the config's dropout, attention implementation and (cropped)
    block size."""
    from model.config import ModelConfig
    from training.plan import model_shape
    source = types.SimpleNamespace(config=ModelConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, d_model=32,
                                                      dropout=0.0, attn_impl="sdpa"))
    cfg = tiny_config(tmp_path, "train.init_from=/models/src", "model.block_size=16", "model.attn_impl=manual",
                      "model.dropout=0.1")
    assert model_shape(cfg, source) == dataclasses.replace(source.config, block_size=16, attn_impl="manual",
                                                           dropout=0.1)
    assert model_shape(cfg, None) == cfg.model


def test_the_model_line_of_a_resolved_run_counts_the_parameters_of_the_model_it_builds(tmp_path):
    """resolve_run counts parameters from the config alone; the count printed is that of the GPT the run builds
    (to the line's two decimals of millions: a model of ~1.7M parameters, so that a miscount shows)."""
    from model.gpt import GPT
    from training.plan import resolve_run
    cfg = tiny_config(tmp_path / "run", "model.d_model=128", "model.n_layer=8", "train.max_iters=1")
    lines = []
    plan = resolve_run(cfg, Runtime(device=torch.device("cpu"), autocast_dtype=None), say=lines.append)
    n_params = GPT(plan.model_config).num_params()
    assert n_params > 1e6 and lines[0].startswith(f"model: {n_params / 1e6:.2f}M parameters")


def test_a_run_on_another_device_is_refused_when_the_cpu_cannot_hold_its_weights_first(tmp_path, monkeypatch):
    """The model is built (and a resume's weights read) on the CPU, then moved: a device with room is not
    enough when the CPU lacks the weights' 4 bytes a parameter. The CPU is given exactly that, then one byte
    less."""
    cfg = tiny_config(tmp_path, "model.vocab_size=65")
    rt = Runtime(device=torch.device("cuda"), autocast_dtype=None)
    host = _needed(cfg.model, 4)
    monkeypatch.setattr(memory, "device_memory", lambda device: host if str(device) == "cpu" else 10**15)
    check_memory(cfg.model, rt, sharded=False)
    monkeypatch.setattr(memory, "device_memory", lambda device: host - 1 if str(device) == "cpu" else 10**15)
    with pytest.raises(UserError) as e:
        check_memory(cfg.model, rt, sharded=False)
    assert f"its weights, built on the CPU before they move to the device would need {memory.human_bytes(host)}" \
        in str(e.value)

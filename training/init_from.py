"""train.init_from: start a run from a pretrained model instead of random weights.

    train.init_from: scratch            the default: GPT-2's random initialisation (model/gpt.py)
    train.init_from: runs/small         an attngpt run (its best/, else latest/) or checkpoint folder
    train.init_from: path/to/hf_folder  what transformers' save_pretrained writes (GPT-2, Llama family)
    train.init_from: gpt2               a hub id, fetched once into the Hugging Face cache

What comes from the source, and what the config may still say:
- the model's shape: every `model:` key but dropout and attn_impl comes from it; a config that sets one to
  another value is refused naming the key (remove it, or set it to the source's value). One exception:
  `model.block_size` may be smaller than the source's, to fine-tune at a context the machine affords (GPT-2's
  1024 at 256, as nanoGPT's crop_block_size): learned positions keep their first block_size rows, RoPE needs
  nothing, and the run's checkpoints hold the smaller block_size, which sample.py and convert.py then use.
  A larger one is refused: the source has no positions beyond its own;
- the tokenizer: the data is encoded with the source's (GPT-2 BPE, its own tokenizer.json, or its exact char
  vocabulary, so that ids mean the same); a `data.tokenizer` that names another is refused;
- the weights, once: a fresh optimizer and learning-rate schedule start at step 0. When out_dir already holds
  a checkpoint the run resumes it as usual and reads nothing from the source: the shape and tokenizer are then
  those of out_dir/latest, which the run started from.
"""
from __future__ import annotations

from pathlib import Path

from common.errors import UserError
from data.tokenizer import CharTokenizer, TiktokenTokenizer
from model.config import ModelConfig
from pretrained.load import Pretrained, open_pretrained
from training.config import RunConfig, attn_layers_problem

SCRATCH = "scratch"
FREE_KEYS = ("dropout", "attn_impl")  # model settings that do not change the weights: the config may set them
CROPPABLE = "block_size"  # may be set below the source's (crop_block_size), never above


def init_source(cfg: RunConfig, latest: Path | None) -> Pretrained | None:
    """The source the run starts from (None for scratch); on a resume, the run's own latest checkpoint."""
    src = cfg.train.init_from
    if src == SCRATCH:
        return None
    if latest is not None:  # a resume: out_dir/latest holds the shape and tokenizer the run started from
        source = open_pretrained(latest, remedy=f"cannot resume from it: use another out_dir, or delete "
                                                f"'{Path(cfg.out_dir)}' to start over")
    else:
        source = open_pretrained(src, what="train.init_from")
    label = f"train.init_from '{src}'"
    check_model_keys(cfg, source.config, label)
    check_tokenizer(cfg, source.tokenizer, label)
    problem = attn_layers_problem(cfg.attn.layers, source.config.n_layer, f"the model of {label}")
    if problem:
        raise UserError(problem)
    return source


def check_model_keys(cfg: RunConfig, theirs: ModelConfig, label: str) -> None:
    for key, ours in cfg.model_set.items():
        if key in FREE_KEYS:
            continue
        value = getattr(theirs, key)
        if key == CROPPABLE and ours > value:
            raise UserError(f"model.block_size={ours} is longer than the {value} positions of {label}: a pretrained "
                            f"model has no positions beyond its own; set model.block_size to {value} or less "
                            f"(or remove it to train at {value})")
        # a shorter context is no contradiction: the source's positions cropped (plan.model_shape, crop_block_size)
        if ours != value and not (key == CROPPABLE and ours < value):
            raise UserError(f"model.{key}={ours!r} contradicts {label}, whose {key} is {value!r}: with "
                            f"train.init_from the model's shape comes from the source; remove model.{key} "
                            f"(only model.dropout, model.attn_impl and a smaller model.block_size may be set)")


def describe(tok: object) -> str:
    if isinstance(tok, TiktokenTokenizer):
        return f"the tiktoken encoding '{tok.name}'"
    if isinstance(tok, CharTokenizer):
        return f"a char vocabulary of {tok.vocab_size} characters"
    return "its own tokenizer.json"


def check_tokenizer(cfg: RunConfig, tok: object, label: str) -> None:
    """A data.tokenizer the config sets must be the source's: ids must mean what they meant in training."""
    if not cfg.data_tokenizer_set:
        return
    name = cfg.data.tokenizer
    same = (isinstance(tok, CharTokenizer) and name == "char") or (isinstance(tok, TiktokenTokenizer) and
                                                                     tok.name == name)
    if not same:
        raise UserError(f"data.tokenizer={name!r} but {label} uses {describe(tok)}: remove data.tokenizer (the "
                        f"data is then encoded with the source's tokenizer)")

"""The two conversions of convert.py.

    to_hf(CKPT, OUT_DIR)    an attngpt checkpoint -> a Hugging Face folder (GPT2LMHeadModel or LlamaForCausalLM,
                            tokenizer files where Hugging Face has an equivalent)
    from_hf(SRC, OUT_DIR)   a Hugging Face folder or hub id -> an attngpt checkpoint folder (model.safetensors,
                            config.json, and the tokenizer.json a Llama-family tokenizer needs)

Weights keep their stored dtype both ways (a bfloat16 hub checkpoint stays bfloat16 on disk; attngpt upcasts
when it loads). The output folder is written whole or not at all (pretrained/hf/export.py).
"""
from __future__ import annotations

from pathlib import Path

from data.hf_tokenizer import hf_tokenizer_files
from data.tokenizer import stored_tokenizer
from pretrained.checkpoint import CONFIG_FILE, weights_to_save
from pretrained.hf.config_map import hf_architecture
from pretrained.hf.export import check_out_dir, hf_files, write_model_folder
from pretrained.load import open_pretrained


def to_hf(ckpt: str, out_dir: str | Path, force: bool = False) -> tuple[Path, str]:
    """Returns (OUT_DIR, the architecture written)."""
    check_out_dir(Path(out_dir), force, _named(ckpt))  # before any heavy reading
    source = open_pretrained(ckpt, what="CKPT")
    kind = hf_architecture(source.config)  # a configuration with no HF equivalent fails here, naming the field
    model = source.build(dtype=None)
    json_tok, raw_tok, bos, eos = hf_tokenizer_files(source.tokenizer, model.config.block_size)
    tensors, json_files = hf_files(model, bos, eos)
    arch = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[kind]
    written = write_model_folder(out_dir, tensors, {**json_files, **json_tok}, raw_tok, force=force,
                                 sources=(*_named(ckpt), source.folder), about=f"to-hf: {arch} from {source.label}")
    return written, arch


def from_hf(src: str, out_dir: str | Path, force: bool = False) -> tuple[Path, str]:
    """Returns (OUT_DIR, a one-line description of the model)."""
    check_out_dir(Path(out_dir), force, _named(src))
    source = open_pretrained(src)
    model = source.build(dtype=None)
    spec, files = stored_tokenizer(source.tokenizer)
    payload = {"model": model.config.to_dict(), "tokenizer": spec, "source": source.label}
    written = write_model_folder(out_dir, weights_to_save(model), {CONFIG_FILE: payload}, files, force=force,
                                 sources=(*_named(src), source.folder), about=f"from-hf: attngpt from {source.label}")
    c = model.config
    return written, (f"{model.num_params() / 1e6:.1f}M parameters, {c.n_layer} layers, {c.n_head} heads "
                     f"({c.n_kv_head} kv), d_model {c.d_model}, block {c.block_size}, tokenizer {source.tokenizer!r}")


def _named(src: str | Path) -> tuple[Path, ...]:
    """The folder the user named as the source, when it is one here (not a hub id)."""
    path = Path(src).expanduser()
    return (path,) if path.exists() else ()

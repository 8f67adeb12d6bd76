"""Tiny random Hugging Face checkpoints, saved with save_pretrained as a hub download would hold them:
GPT-2 with GPT-2's real tokenizer (from the tiktoken files in ../shared), Llama (GQA, tied or not) with a small
Llama-style tokenizer.json made with the tokenizers library. Norm weights and biases are moved away from 1
and 0, and rope_theta / rms_norm_eps from their defaults, so a mapping that drops them fails the tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

GPT2_VOCAB = 50257
LLAMA_TEXT = ["The animal didn't cross the street because it was tired.", "To be, or not to be: that is the question.",
              "ROMEO: But, soft! what light through yonder window breaks?", "hello world 1234567890 ()[]{}<>"] * 20


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


QK_SCALE = 15.0  # random init gives near-uniform attention, blind to positions: sharpen it so RoPE matters


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Norm weights away from 1, biases away from 0 (random init leaves them at 1 and 0), and query/key
    projections scaled up so that attention is peaked and a wrong RoPE pairing changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * (0.3 if "norm" in name or "ln_" in name else 0.05))
            elif any(part in name for part in ("q_proj", "k_proj", "c_attn", "qkv_proj")):
                p.mul_(QK_SCALE)


def gpt2_tokenizer_dir(root: Path) -> Path:
    """GPT-2's vocab.json + merges.txt as transformers reads them, made from tiktoken's cached files."""
    from data.hf_tokenizer import gpt2_merges, gpt2_vocab
    root.mkdir(parents=True, exist_ok=True)
    (root / "vocab.json").write_text(json.dumps(gpt2_vocab()), encoding="utf-8")
    (root / "merges.txt").write_text("#version: 0.2\n" + "\n".join(gpt2_merges()) + "\n", encoding="utf-8")
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
         "unk_token": "<|endoftext|>", "add_prefix_space": False}), encoding="utf-8")
    return root


def make_gpt2(folder: Path, seed: int = 0, n_positions: int = 64, tokenizer: bool = True, **config) -> Path:
    transformers = transformers_or_skip()
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=GPT2_VOCAB, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4,
                                  layer_norm_epsilon=1e-5, **config)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    _perturb(model, seed)
    model.save_pretrained(folder)
    if tokenizer:
        tok = transformers.AutoTokenizer.from_pretrained(gpt2_tokenizer_dir(folder.parent / f"{folder.name}_tok"))
        tok.save_pretrained(folder)
    return folder


def llama_tokenizer_json() -> str:
    """A Llama-2-style tokenizer: BPE over metaspace pieces with byte fallback (<0x00>..<0xFF>), <unk> <s> </s>
    as ids 0 1 2, and a template that puts <s> first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    trainer_tk = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer_tk.train_from_iterator(LLAMA_TEXT, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    trained = json.loads(trainer_tk.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", 1)])
    return tk.to_str()


def make_llama(folder: Path, seed: int = 0, tied: bool = False, vocab_size: int = 448, **config) -> Path:
    transformers = transformers_or_skip()
    torch.manual_seed(seed)
    settings = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0, rms_norm_eps=1e-5,
                    bos_token_id=1, eos_token_id=2, tie_word_embeddings=tied)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, **{**settings, **config})
    model = transformers.LlamaForCausalLM(cfg).eval()
    _perturb(model, seed)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(llama_tokenizer_json(), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 64}), encoding="utf-8")
    return folder


def hf_logits(folder: Path, idx: torch.Tensor) -> torch.Tensor:
    transformers = transformers_or_skip()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(idx).logits

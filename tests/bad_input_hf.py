"""The bad-input matrix's Hugging Face cases (tests/bad_input_cases.py adds them to its table): checkpoints
convert.py, `sample.py --ckpt` and train.init_from cannot use, written as tiny config.json and safetensors
files. `hf_cases` takes the table's Case type and arguments, so this module needs nothing from it."""
from __future__ import annotations

import json
import math
import struct
from typing import Any


def _safetensors(shapes: dict[str, list[int]], dtypes: dict[str, str] | None = None) -> bytes:
    """A safetensors file of zeros, float32 unless `dtypes` names another (I32: 4 bytes too), written by hand
    (the table needs no torch)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": (dtypes or {}).get(name, "F32"), "shape": shape,
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + bytes(offset)


_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 16, "n_positions": 8,
         "n_embd": 8, "n_layer": 1, "n_head": 2}
_GPT2_SHAPES = {
    "wte.weight": [16, 8], "wpe.weight": [8, 8], "ln_f.weight": [8], "ln_f.bias": [8],
    **{f"h.0.{n}": s for n, s in [("ln_1.weight", [8]), ("ln_1.bias", [8]), ("attn.c_attn.weight", [8, 24]),
                                   ("attn.c_attn.bias", [24]), ("attn.c_proj.weight", [8, 8]),
                                   ("attn.c_proj.bias", [8]),
                                   ("ln_2.weight", [8]), ("ln_2.bias", [8]), ("mlp.c_fc.weight", [8, 32]),
                                   ("mlp.c_fc.bias", [32]), ("mlp.c_proj.weight", [32, 8]), ("mlp.c_proj.bias", [8])]}}
_GPT2_WEIGHTS = _safetensors(_GPT2_SHAPES)
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16, "hidden_size": 8,
          "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
          "max_position_embeddings": 8, "tie_word_embeddings": False}
_LLAMA_WEIGHTS = _safetensors({
    "model.embed_tokens.weight": [16, 8], "model.norm.weight": [8], "lm_head.weight": [16, 8],
    **{f"model.layers.0.{n}.weight": [8, 8] for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj")},
    "model.layers.0.input_layernorm.weight": [8], "model.layers.0.post_attention_layernorm.weight": [8]})
_WORD_LEVEL = json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}})  # a valid tokenizer.json
TERABYTE = 2**40  # a file of this many bytes is written sparse (truncate -s 1T): nothing is stored
_GPT2_NOT_GPT2_VOCAB = json.dumps({f"t{i}": i for i in range(16)})  # vocab.json of 16 tokens, not GPT-2's
NO_HUB = {"HF_HUB_OFFLINE": "1", "HF_HOME": "{tmp}/hf_home"}
FAKE_TOKENIZERS = 'raise ImportError("No module named \'tokenizers\' (simulated by tests/bad_input_hf.py)")\n'


def hf_cases(Case: Any, TRAIN: tuple[str, ...]) -> list[Any]:  # noqa: N803
    return [
        Case("convert-no-args", "convert.py", "flags", "no subcommand", (),
             ("the following arguments are required: {to-hf,from-hf}", "see convert.py --help")),
        Case("convert-hub-offline", "convert.py", "environment", "a hub id that is not cached, offline",
             ("from-hf", "nonexistent-org/no-such-model", "{out}"),
             ("could not fetch 'nonexistent-org/no-such-model' from the Hugging Face hub", "pass a local folder"),
             env=NO_HUB),
        Case("convert-unsupported-architecture", "convert.py", "checkpoint", "an architecture attngpt cannot be (BERT)",
             ("from-hf", "{tmp}/bert", "{out}"),
             ("unsupported architecture BertForMaskedLM", "attngpt converts GPT2LMHeadModel, LlamaForCausalLM"),
             files={"bert/config.json": json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"})}),
        Case("convert-qkv-bias", "convert.py", "checkpoint", "biases on q, k, v only (Qwen2)",
             ("from-hf", "{tmp}/qwen", "{out}"), ("unsupported architecture Qwen2ForCausalLM (biases on q, k, v only)",),
             files={"qwen/config.json": json.dumps({**_LLAMA, "architectures": ["Qwen2ForCausalLM"],
                                                    "model_type": "qwen2"})}),
        Case("convert-rope-scaling", "convert.py", "checkpoint", "Llama 3.1's rope scaling",
             ("from-hf", "{tmp}/llama", "{out}"), ("rope_scaling 'llama3' has no attngpt equivalent", "unscaled"),
             files={"llama/config.json": json.dumps({**_LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})}),
        Case("convert-sliding-window", "convert.py", "checkpoint", "Mistral with a sliding window shorter than its context",
             ("from-hf", "{tmp}/mistral", "{out}"), ("sliding_window=4 has no attngpt equivalent",),
             files={"mistral/config.json": json.dumps({**_LLAMA, "architectures": ["MistralForCausalLM"],
                                                       "model_type": "mistral", "sliding_window": 4})}),
        Case("convert-no-weights", "convert.py", "checkpoint", "only pytorch_model.bin (a pickle), no safetensors",
             ("from-hf", "{tmp}/gpt2", "{out}"),
             ("no model.safetensors or model.safetensors.index.json", "pickle files, which attngpt never loads"),
             files={"gpt2/config.json": json.dumps(_GPT2), "gpt2/pytorch_model.bin": b"PK\x03\x04 never unpickled"}),
        Case("convert-truncated-weights", "convert.py", "checkpoint", "model.safetensors cut short",
             ("from-hf", "{tmp}/gpt2", "{out}"), ("model.safetensors' is corrupted or truncated",),
             files={"gpt2/config.json": json.dumps(_GPT2), "gpt2/model.safetensors": _GPT2_WEIGHTS[:-100]}),
        Case("convert-config-contradicts-weights", "convert.py", "checkpoint",
             "config.json says n_embd 16, weights are 8 wide", ("from-hf", "{tmp}/gpt2", "{out}"),
             ("contradicts the weights beside it", "shape transformer.wte.weight (16, 8)"),
             files={"gpt2/config.json": json.dumps({**_GPT2, "n_embd": 16}), "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("convert-missing-shard", "convert.py", "checkpoint", "a sharded checkpoint missing one shard",
             ("from-hf", "{tmp}/gpt2", "{out}"), ("lacks shard(s) model-00002-of-00002.safetensors", "incomplete"),
             files={"gpt2/config.json": json.dumps(_GPT2), "gpt2/model-00001-of-00002.safetensors": _GPT2_WEIGHTS,
                    "gpt2/model.safetensors.index.json": json.dumps({"weight_map": {
                        "wte.weight": "model-00001-of-00002.safetensors", "wpe.weight": "model-00002-of-00002.safetensors"}})}),
        Case("convert-out-dir-not-empty", "convert.py", "environment", "OUT_DIR holds other files",
             ("to-hf", "{run}", "{tmp}/full"), ("exists and is not empty", "give a new folder, or pass --force"),
             files={"full/notes.txt": "keep me\n"}),
        Case("convert-no-hf-equivalent", "convert.py", "checkpoint", "RoPE with LayerNorm and GELU: no HF architecture",
             ("to-hf", "{tmp}/ckpt", "{out}"), ("pos='rope'", "has no Hugging Face equivalent",
                                               "GPT2LMHeadModel needs pos=learned"),
             files={"ckpt/config.json": json.dumps({"model": {"vocab_size": 2, "block_size": 8, "n_layer": 1, "n_head": 1,
                                                              "d_model": 8, "pos": "rope", "norm": "layernorm", "mlp": "gelu"},
                                                    "tokenizer": {"kind": "char", "chars": "ab"}})}),
        Case("train-init-from-contradicts", "train.py", "config", "a model key that contradicts train.init_from",
             (*TRAIN, "train.init_from={run}", "model.n_layer=3"),
             ("model.n_layer=3 contradicts train.init_from", "whose n_layer is 2", "remove model.n_layer")),
        Case("train-init-from-longer-context", "train.py", "config", "model.block_size longer than train.init_from's",
             (*TRAIN, "train.init_from={run}", "model.block_size=64"),
             ("model.block_size=64 is longer than the 32 positions of train.init_from", "set model.block_size to 32 or less")),
        Case("train-init-from-other-tokenizer", "train.py", "config", "data.tokenizer unlike train.init_from's",
             (*TRAIN, "train.init_from={run}", "data.tokenizer=gpt2"),
             ("data.tokenizer='gpt2' but train.init_from", "uses a char vocabulary of 65 characters", "remove data.tokenizer")),
        Case("train-init-from-missing", "train.py", "config", "train.init_from names nothing", (*TRAIN, "train.init_from={tmp}/nothing"),
             ("no checkpoint at", "pass train.init_from a run's out_dir, a checkpoint folder, a Hugging Face model folder")),
        Case("sample-hub-offline", "sample.py", "environment", "--ckpt a hub id that is not cached, offline",
             ("--ckpt", "nonexistent-org/no-such-model"), ("could not fetch", "pass a local folder"), env=NO_HUB),
        # --- a Hugging Face folder is untrusted input: config.json, weights headers, tokenizer files ---------------
        Case("convert-hf-config-wrong-type", "convert.py", "checkpoint",
             "config.json: architectures a string, not a list", ("from-hf", "{tmp}/gpt2", "{out}"),
             ("config.json: architectures is 'GPT2LMHeadModel' (a string), expected a list", "the file is damaged"),
             files={"gpt2/config.json": json.dumps({**_GPT2, "architectures": "GPT2LMHeadModel"}),
                    "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("sample-hf-config-float-size", "sample.py", "checkpoint", "config.json: vocab_size 16.5",
             ("--ckpt", "{tmp}/gpt2"), ("config.json: vocab_size is 16.5 (a number), expected a positive integer",),
             files={"gpt2/config.json": json.dumps({**_GPT2, "vocab_size": 16.5}),
                    "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("sample-hf-config-number-overflows", "sample.py", "checkpoint", "config.json: n_embd 1e400",
             ("--ckpt", "{tmp}/gpt2"), ("config.json' is corrupted", "the number 1e400 is too large for a float"),
             files={"gpt2/config.json": json.dumps(_GPT2).replace('"n_embd": 8', '"n_embd": 1e400'),
                    "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("convert-hf-deep-model", "convert.py", "checkpoint",
             "config.json: n_layer 10**7 (once: minutes at 7 GB building it on the meta device)",
             ("from-hf", "{tmp}/gpt2", "{out}"), ("config.json' has", "n_layer=10000000", "Is the config damaged?"),
             files={"gpt2/config.json": json.dumps({**_GPT2, "n_layer": 10**7}), "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("sample-hf-storage-overflow", "sample.py", "checkpoint",
             "config.json: vocab_size 2**62 x n_embd 1024 (a tensor whose storage size overflows, even on the meta device)",
             ("--ckpt", "{tmp}/gpt2"), ("config.json' has", "vocab_size=4611686018427387904", "Is the config damaged?"),
             files={"gpt2/config.json": json.dumps({**_GPT2, "vocab_size": 2**62, "n_embd": 1024}),
                    "gpt2/model.safetensors": _GPT2_WEIGHTS}),
        Case("sample-hf-int-weights", "sample.py", "checkpoint", "model.safetensors: the token embedding stored as int32",
             ("--ckpt", "{tmp}/gpt2"), ("store transformer.wte.weight (I32), not floating-point weights",),
             files={"gpt2/config.json": json.dumps(_GPT2),
                    "gpt2/model.safetensors": _safetensors(_GPT2_SHAPES, {"wte.weight": "I32"})}),
        Case("sample-hf-tokenizer-list", "sample.py", "checkpoint", "tokenizer.json holds a JSON list",
             ("--ckpt", "{tmp}/llama"), ("tokenizer.json", "the document is [] (a list), expected an object"),
             files={"llama/config.json": json.dumps(_LLAMA), "llama/model.safetensors": _LLAMA_WEIGHTS,
                    "llama/tokenizer.json": "[]"}),
        Case("convert-hf-vocab-json-list", "convert.py", "checkpoint", "vocab.json holds a JSON list (no tokenizer.json)",
             ("from-hf", "{tmp}/gpt2", "{out}"), ("vocab.json", "the document is [1] (a list), expected an object"),
             files={"gpt2/config.json": json.dumps(_GPT2), "gpt2/model.safetensors": _GPT2_WEIGHTS,
                    "gpt2/vocab.json": "[1]"}),
        Case("convert-hf-char-vocab-damaged", "convert.py", "checkpoint",
             "attngpt_char_vocab.json (a character model's export) whose characters repeat",
             ("from-hf", "{tmp}/llama", "{out}"), ("attngpt_char_vocab.json", "distinct characters",
                                                  "export the model again with convert.py to-hf"),
             files={"llama/config.json": json.dumps(_LLAMA), "llama/model.safetensors": _LLAMA_WEIGHTS,
                    "llama/attngpt_char_vocab.json": json.dumps({"kind": "char", "chars": "abca"})}),
        Case("convert-hf-merges-txt-damaged", "convert.py", "checkpoint", "merges.txt with a line of three tokens",
             ("from-hf", "{tmp}/gpt2", "{out}"), ("merges.txt", "line 3 is 'a b c', expected two tokens joined by one space"),
             files={"gpt2/config.json": json.dumps(_GPT2), "gpt2/model.safetensors": _GPT2_WEIGHTS,
                    "gpt2/vocab.json": _GPT2_NOT_GPT2_VOCAB, "gpt2/merges.txt": "#version: 0.2\nt1 t2\na b c\n"}),
        Case("train-init-from-hf-terabyte-tokenizer", "train.py", "checkpoint",
             "train.init_from a folder whose tokenizer.json is 1 TB (sparse)", (*TRAIN, "train.init_from={tmp}/llama"),
             ("tokenizer.json", "is 1.1 TB, more than the 64.0 MB such a file can be"),
             files={"llama/config.json": json.dumps(_LLAMA), "llama/model.safetensors": _LLAMA_WEIGHTS,
                    "llama/tokenizer.json": TERABYTE}),
        Case("sample-hf-without-tokenizers", "sample.py", "environment",
             "a Llama-family folder but `import tokenizers` fails (the hf extra is not installed)",
             ("--ckpt", "{tmp}/llama"), ("needs the tokenizers package", "pip install -e '.[hf]'"),
             env={"PYTHONPATH": "{tmp}/shadow"},
             files={"llama/config.json": json.dumps(_LLAMA), "llama/model.safetensors": _LLAMA_WEIGHTS,
                    "llama/tokenizer.json": _WORD_LEVEL, "shadow/tokenizers/__init__.py": FAKE_TOKENIZERS}),
    ]

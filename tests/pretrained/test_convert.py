"""pretrained/convert.py, Hugging Face checkpoints in and out, in-process: tiny random GPT2LMHeadModel /
LlamaForCausalLM folders (tests/hf_models.py, made in conftest.py) must give attngpt the same logits and the same
greedy tokens as transformers; attngpt models exported to the HF layout must load in transformers with the same
logits; HF -> attngpt -> HF must give back every tensor bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.hf_models import QK_SCALE, hf_logits, make_llama, transformers_or_skip

transformers = transformers_or_skip()

from common.errors import UserError  # noqa: E402
from data.tokenizer import CharTokenizer  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from pretrained.checkpoint import save_model  # noqa: E402
from model.generate import generate  # noqa: E402
from pretrained.hf.transformers_model import to_transformers  # noqa: E402
from pretrained.convert import from_hf, to_hf  # noqa: E402
from pretrained.load import open_pretrained  # noqa: E402

TOLERANCE = 1e-4  # max abs logit difference, float32


def prompt(source, text="The animal didn't cross the street because it was tired") -> torch.Tensor:
    return torch.tensor([source.tokenizer.prompt_ids(text)])


@pytest.mark.parametrize("name", ["gpt2", "llama", "llama_tied", "llama_bias"])
def test_logits_equal_transformers(folders, name):
    source = open_pretrained(str(folders[name]))
    model = source.build()
    idx = torch.cat([prompt(source), torch.randint(0, source.tokenizer.vocab_size, (1, 40))], dim=1)[:, :64]
    with torch.no_grad():
        ours, _ = model(idx)
    diff = (ours - hf_logits(folders[name], idx)).abs().max().item()
    assert diff <= TOLERANCE, diff
    # the settings that matter were read, not defaulted
    hf = json.loads((folders[name] / "config.json").read_text())
    if name.startswith("llama"):
        # transformers 5 nests it in rope_parameters; 4.x keeps it at the top
        assert model.config.rope_theta == hf.get("rope_parameters", hf)["rope_theta"] != 10000.0
        assert model.config.norm_eps == hf["rms_norm_eps"] != 1e-6
        assert model.config.n_kv_head == hf["num_key_value_heads"] < model.config.n_head
        assert model.config.tie_embeddings == (name == "llama_tied")


@pytest.mark.parametrize("name", ["gpt2", "llama", "llama_tied"])
def test_greedy_generation_through_the_kv_cache_equals_generate(folders, name):
    source = open_pretrained(str(folders[name]))
    model = source.build()
    idx = prompt(source, "ROMEO:")
    ours = generate(model, idx, max_new_tokens=40, temperature=0.0, use_kv_cache=True)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folders[name]).eval()
    hf_model.generation_config.eos_token_id = None  # never stop early: compare 40 tokens
    hf_model.generation_config.pad_token_id = 0
    theirs = hf_model.generate(idx, max_new_tokens=40, do_sample=False, attention_mask=torch.ones_like(idx))
    assert ours.tolist() == theirs.tolist()


def attngpt_checkpoint(folder: Path, config: ModelConfig, seed: int) -> tuple[Path, GPT]:
    """A random attngpt model with norms and biases away from 1 and 0, saved with a char tokenizer."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.3)
            elif "qkv_proj" in name:
                p.mul_(QK_SCALE)  # peaked attention: positions matter
    chars = "".join(chr(c) for c in range(32, 32 + config.vocab_size))
    save_model(model, folder, {"tokenizer": CharTokenizer(chars).to_json()})
    return folder, model


EXPORTABLE = {
    "gpt2-like": ModelConfig(vocab_size=70, block_size=48, n_layer=2, n_head=4, d_model=32, pos="learned",
                             norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True, norm_eps=1e-4),
    "gpt2-no-bias-untied": ModelConfig(vocab_size=70, block_size=48, n_layer=2, n_head=2, d_model=32, pos="learned",
                                       norm="layernorm", mlp="gelu", bias=False, tie_embeddings=False, mlp_hidden=40),
    "llama-gqa": ModelConfig(vocab_size=70, block_size=48, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pos="rope",
                             norm="rmsnorm", mlp="swiglu", rope_theta=3000.0, norm_eps=1e-5, tie_embeddings=False),
    "llama-mqa-bias-tied": ModelConfig(vocab_size=70, block_size=48, n_layer=2, n_head=4, n_kv_head=1, d_model=32,
                                       pos="rope", norm="rmsnorm", mlp="swiglu", bias=True, tie_embeddings=True),
}


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_exported_model_loads_in_transformers_with_equal_logits(tmp_path, name):
    ckpt, model = attngpt_checkpoint(tmp_path / "ckpt", EXPORTABLE[name], seed=len(name))
    out, arch = to_hf(str(ckpt), tmp_path / "hf")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf_model).__name__ == arch == ("GPT2LMHeadModel" if name.startswith("gpt2") else "LlamaForCausalLM")
    idx = torch.randint(0, 70, (2, 48))
    with torch.no_grad():
        diff = (model(idx)[0] - hf_model(idx).logits).abs().max().item()
        in_memory = (model(idx)[0] - to_transformers(model)(idx).logits).abs().max().item()
    assert diff <= TOLERANCE and in_memory <= TOLERANCE, (diff, in_memory)
    vocab = json.loads((out / "attngpt_char_vocab.json").read_text(encoding="utf-8"))
    assert vocab["chars"] == "".join(chr(c) for c in range(32, 102)) and "chars[i]" in vocab["about"]
    # the tokenizer path: AutoTokenizer reads the folder's tokenizer.json, giving CharTokenizer's ids, and the
    # logits on them agree (generated texts: tests/pretrained/hf/test_export_char_tokenizer.py)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    text = "ROMEO: a bad dace? [ACE] (1, 2; 3)"
    ids = theirs.encode(text)
    assert ids == CharTokenizer(vocab["chars"]).encode(text) and theirs.decode(ids) == text
    with torch.no_grad():
        diff = (model(torch.tensor([ids]))[0] - hf_model(torch.tensor([ids])).logits).abs().max().item()
    assert diff <= TOLERANCE, diff


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_a_char_model_exported_to_hf_comes_back_with_its_vocabulary_and_logits(tmp_path, name):
    """attngpt -> HF -> attngpt for a character vocabulary, which Hugging Face has no tokenizer for: the export's
    attngpt_char_vocab.json is read back (GPT-2 and Llama layouts alike), so the ids mean the same characters and
    the weights give the same logits."""
    ckpt, model = attngpt_checkpoint(tmp_path / "ckpt", EXPORTABLE[name], seed=len(name) + 7)
    exported, _ = to_hf(str(ckpt), tmp_path / "hf")
    back, _ = from_hf(str(exported), tmp_path / "back")
    source = open_pretrained(str(back))
    assert isinstance(source.tokenizer, CharTokenizer)
    assert source.tokenizer.chars == "".join(chr(c) for c in range(32, 102))
    text = "ROMEO: a bad dace? [ACE]"
    assert source.tokenizer.decode(source.tokenizer.encode(text)) == text
    idx = torch.tensor([source.tokenizer.encode(text)])
    with torch.no_grad():
        diff = (source.build()(idx)[0] - model(idx)[0]).abs().max().item()
    assert diff <= TOLERANCE, diff


@pytest.mark.parametrize("damage, fragment", [
    ({"chars": "aab"}, "distinct"), ({"chars": 7}, "chars is 7"), ({"kind": "bpe"}, "kind is 'bpe'"),
    ({"chars": "".join(chr(c) for c in range(32, 200))}, "168 tokens but the model's vocab_size is 70"),
])
def test_a_damaged_char_vocabulary_in_an_hf_folder_is_one_line(tmp_path, damage, fragment):
    ckpt, _ = attngpt_checkpoint(tmp_path / "ckpt", EXPORTABLE["llama-gqa"], seed=3)
    exported, _ = to_hf(str(ckpt), tmp_path / "hf")
    path = exported / "attngpt_char_vocab.json"
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **damage}), encoding="utf-8")
    with pytest.raises(UserError, match="attngpt_char_vocab.json") as err:
        from_hf(str(exported), tmp_path / "back")
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "back").exists()  # nothing written


@pytest.mark.parametrize("name", ["gpt2", "llama", "llama_tied", "llama_bias"])
def test_round_trip_hf_attngpt_hf_is_bit_equal(folders, tmp_path, name):
    ours, _ = from_hf(str(folders[name]), tmp_path / "attngpt")
    back, _ = to_hf(str(ours), tmp_path / "hf")
    original, exported = load_file(folders[name] / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(original) == sorted(exported)
    for key, tensor in original.items():
        assert tensor.dtype == exported[key].dtype and torch.equal(tensor, exported[key]), key
    a = transformers.AutoConfig.from_pretrained(folders[name]).to_dict()
    b = transformers.AutoConfig.from_pretrained(back).to_dict()
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "rms_norm_eps", "rope_parameters", "tie_word_embeddings", "attention_bias",
            "mlp_bias", "n_positions", "max_position_embeddings", "layer_norm_epsilon", "n_embd", "n_layer",
            "bos_token_id", "eos_token_id"]
    assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}


def test_mistral_without_a_sliding_window_is_llama(tmp_path):
    torch.manual_seed(7)
    config = transformers.MistralConfig(vocab_size=448, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                                        sliding_window=None, rope_theta=2000.0, rms_norm_eps=1e-5)
    hf_model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            p.add_(torch.randn_like(p) * 0.3) if p.ndim == 1 else p.mul_(QK_SCALE if ("q_proj" in name or "k_proj" in name) else 1.0)
    make_llama(tmp_path / "tok")  # for its tokenizer files
    hf_model.save_pretrained(tmp_path / "mistral")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "mistral" / name).write_bytes((tmp_path / "tok" / name).read_bytes())
    model = open_pretrained(str(tmp_path / "mistral")).build()
    idx = torch.randint(0, 448, (1, 50))
    with torch.no_grad():
        assert (model(idx)[0] - hf_model(idx).logits).abs().max().item() <= TOLERANCE


def test_tokenizers_round_trip_through_the_hf_layout(folders, tmp_path):
    text = "The animal didn't cross the street because it was tired. ROMEO: <s> naïve ½ 12345\n\n  x"
    for name in ("gpt2", "llama"):
        source = open_pretrained(str(folders[name]))
        exported, _ = to_hf(str(from_hf(str(folders[name]), tmp_path / f"{name}_a")[0]), tmp_path / f"{name}_hf")
        theirs = transformers.AutoTokenizer.from_pretrained(exported)
        expected = source.tokenizer.encode(text)
        if name == "llama":
            expected = source.tokenizer.prompt_ids(text)  # the tokenizer's template: <s> first
            assert expected[0] == theirs.bos_token_id == 1
        assert theirs(text, split_special_tokens=True)["input_ids"] == expected, name
        assert theirs.eos_token_id == source.tokenizer.eot


def test_gpt2_merges_rebuilt_from_tiktoken_equal_gpt2s_own_file():
    import hashlib
    import os
    from data.hf_tokenizer import gpt2_merges
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
    cached = Path(os.environ.get("TIKTOKEN_CACHE_DIR", "/nonexistent")) / hashlib.sha1(url.encode()).hexdigest()
    if not cached.is_file():
        pytest.skip("GPT-2's vocab.bpe is not in the tiktoken cache")
    lines = [line for line in cached.read_text(encoding="utf-8").split("\n")[1:] if line]
    assert list(gpt2_merges()) == lines


@pytest.mark.parametrize("change, fragment", [
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
     "unsupported architecture Qwen2ForCausalLM (biases on q, k, v only)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type 'llama3'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling 'linear'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"attention_bias": True}, "attention_bias=True with mlp_bias=False"),
    ({"num_hidden_layers": 3}, "contradicts the weights beside it (3 layers in the config, 2 in the weights)"),
    ({"intermediate_size": 64}, "shape model.layers.0.mlp.gate_proj.weight (48, 32) vs (64, 32)"),
])
def test_a_config_attngpt_cannot_be_is_refused_naming_the_setting(folders, tmp_path, change, fragment):
    folder = tmp_path / "changed"
    folder.mkdir()
    for path in folders["llama"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=None) as info:
        open_pretrained(str(folder)).build()
    assert fragment in str(info.value), str(info.value)


def test_a_configuration_without_an_hf_equivalent_is_refused_naming_the_field(tmp_path):
    config = ModelConfig(vocab_size=70, block_size=16, n_layer=1, n_head=2, d_model=16, pos="rope", norm="layernorm",
                         mlp="gelu")
    ckpt, _ = attngpt_checkpoint(tmp_path / "ckpt", config, seed=0)
    with pytest.raises(UserError, match="pos='rope' in this configuration .* has no Hugging Face equivalent"):
        to_hf(str(ckpt), tmp_path / "out")
    gqa = ModelConfig(vocab_size=70, block_size=16, n_layer=1, n_head=2, n_kv_head=1, d_model=16, pos="learned",
                      norm="layernorm", mlp="gelu")
    ckpt, _ = attngpt_checkpoint(tmp_path / "gqa", gqa, seed=0)
    with pytest.raises(UserError, match="n_kv_head=1 .* no Hugging Face equivalent in GPT2LMHeadModel"):
        to_hf(str(ckpt), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_long_context_model_samples_with_a_cache_sized_to_the_generation(monkeypatch):
    """A Hugging Face model may have 32K positions: sampling a few tokens must not allocate a cache (and a causal
    table) for all of them."""
    model = GPT(ModelConfig(vocab_size=50, block_size=32768, n_layer=1, n_head=2, d_model=16, pos="rope",
                            norm="rmsnorm", mlp="swiglu"))
    sizes = []
    original = model.setup_kv_cache
    monkeypatch.setattr(model, "setup_kv_cache", lambda b, max_len=None, **kw: sizes.append(max_len) or
                        original(b, max_len, **kw))
    out = generate(model, torch.zeros(1, 5, dtype=torch.long), max_new_tokens=7, temperature=0.0)
    assert out.shape == (1, 12) and sizes == [12]



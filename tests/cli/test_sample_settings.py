"""Every sample.py flag changes what it does: each test fails when its flag is ignored or off by one.

sample.main runs in this process (the same argument parsing and code path as the command line, ~0.1 s a
call instead of ~2 s) on a random checkpoint whose matrices are drawn with std 0.3, so that its text varies
(GPT-2's init repeats one character). Expected texts come from model.generate called directly with the
flags' values, or, for greedy decoding, from a loop of full forward passes that shares no code with it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sample
from data.tokenizer import CharTokenizer
from model import GPT, ModelConfig
from pretrained.checkpoint import load_model, save_model
from model.generate import generate

CHARS = "\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
PROMPT = "ROMEO: "


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("settings_sample") / "run" / "best"
    tokenizer = CharTokenizer(CHARS)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=24, n_layer=2, n_head=4, n_kv_head=2,
                         d_model=32, pos="rope", norm="rmsnorm", mlp="swiglu")
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    save_model(model, folder, extra={"tokenizer": tokenizer.to_json()})
    return folder


def run(capsys, ckpt: Path, *flags: str) -> tuple[str, str]:
    """sample.py's stdout and stderr for these flags (prompt ROMEO:, 30 new tokens unless the flags say)."""
    argv = ["--ckpt", str(ckpt), *flags]
    if not any(f.startswith("--prompt") for f in flags):
        argv += ["--prompt", PROMPT]
    if "--max-new-tokens" not in flags:
        argv += ["--max-new-tokens", "30"]
    assert sample.main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def expected(ckpt: Path, n_new: int, seed: int = 1337, num_samples: int = 1, **sampling) -> list[str]:
    """Each sample's text: the prompt and its continuation by model.generate with these settings."""
    model, payload = load_model(ckpt)
    tokenizer = CharTokenizer(payload["tokenizer"]["chars"])
    prompt = torch.tensor([tokenizer.encode(PROMPT)]).expand(num_samples, -1)
    out = generate(model, prompt, n_new, generator=torch.Generator().manual_seed(seed), **sampling)
    return [tokenizer.decode(row) for row in out.tolist()]


def test_output_is_generate_with_the_flags_values(capsys, ckpt):
    """--seed, --temperature, --top-k, --top-p and --max-new-tokens reach generate() as given: the text equals
    generate's with exactly those values (a seed or a bound off by one would draw other tokens)."""
    cases = [(["--seed", "7", "--temperature", "1.3", "--top-k", "5"], dict(seed=7, temperature=1.3, top_k=5)),
             (["--seed", "8", "--temperature", "0.9", "--top-p", "0.6"], dict(seed=8, temperature=0.9, top_p=0.6)),
             (["--max-new-tokens", "17"], dict(temperature=0.8))]  # the defaults: seed 1337, temperature 0.8
    for flags, settings in cases:
        n_new = int(flags[flags.index("--max-new-tokens") + 1]) if "--max-new-tokens" in flags else 30
        out, _ = run(capsys, ckpt, *flags)
        assert out == expected(ckpt, n_new, **settings)[0] + "\n", flags
        assert len(out) == len(PROMPT) + n_new + 1  # char tokens: one character each


@pytest.mark.parametrize("flag, a, b", [("--seed", "1", "2"), ("--temperature", "0.2", "3.0"),
                                        ("--top-k", "1", "60"), ("--top-p", "0.05", "1.0")])
def test_each_sampling_flag_changes_the_text(capsys, ckpt, flag, a, b):
    assert run(capsys, ckpt, flag, a)[0] != run(capsys, ckpt, flag, b)[0]


def greedy_by_full_forward(ckpt: Path, n_new: int) -> str:
    """Greedy decoding the slow, obvious way: the whole (sliding) window through forward, argmax, repeat."""
    model, payload = load_model(ckpt)
    tokenizer = CharTokenizer(payload["tokenizer"]["chars"])
    ids = tokenizer.encode(PROMPT)
    window, block = list(ids), model.config.block_size
    with torch.no_grad():
        for _ in range(n_new):
            if len(window) > block:  # generate's policy: keep the last block_size // 2 tokens
                window = window[-(block // 2):]
            logits, _ = model(torch.tensor([window]))
            token = int(logits[0, -1].argmax())
            ids.append(token)
            window.append(token)
    return tokenizer.decode(ids)


def test_temperature_zero_and_top_k_one_are_greedy(capsys, ckpt):
    greedy = greedy_by_full_forward(ckpt, 40) + "\n"
    assert run(capsys, ckpt, "--temperature", "0", "--max-new-tokens", "40")[0] == greedy
    assert run(capsys, ckpt, "--top-k", "1", "--seed", "3", "--max-new-tokens", "40")[0] == greedy
    assert run(capsys, ckpt, "--top-p", "1e-9", "--seed", "4", "--max-new-tokens", "40")[0] == greedy
    assert run(capsys, ckpt, "--temperature", "1e-9", "--max-new-tokens", "40")[0] == greedy


def test_num_samples_draws_that_many_rows_of_one_batch(capsys, ckpt):
    out, _ = run(capsys, ckpt, "--num-samples", "3", "--seed", "11", "--temperature", "1.5")
    rows = expected(ckpt, 30, seed=11, num_samples=3, temperature=1.5)
    assert out == "".join(f"--- sample {i + 1}\n{row}\n" for i, row in enumerate(rows))
    assert len(set(rows)) == 3


def test_no_kv_cache_recomputes_without_a_cache(capsys, ckpt, monkeypatch):
    setups = []
    real = GPT.setup_kv_cache
    monkeypatch.setattr(GPT, "setup_kv_cache", lambda self, *a, **k: setups.append(a) or real(self, *a, **k))
    cached, err_cached = run(capsys, ckpt, "--seed", "5")
    assert len(setups) == 1 and "KV cache" in err_cached and "no KV cache" not in err_cached
    uncached, err_uncached = run(capsys, ckpt, "--seed", "5", "--no-kv-cache")
    assert len(setups) == 1 and "no KV cache" in err_uncached
    assert cached == uncached  # the two paths draw the same tokens (tests/model/test_generate.py)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_attention_runs_on_our_kernel_where_it_timed_faster_and_the_speed_line_says_so(
        capsys, ckpt, monkeypatch, attention_lib, dtype):
    """The timing (model/decode_attention.py) is asked for the generation's rows and slots, prompt and new tokens;
    its answer decides the layers' kernel, which the speed line names; --no-kv-cache times nothing."""
    timed, kernels = [], []

    def answer(faster):
        def seconds(kernel, dtype, batch_size, n_head, n_kv_head, head_dim, length):
            timed.append((batch_size, length))
            return (1e-6, 2e-6) if faster else (2e-6, 1e-6)
        return seconds

    def spy(model, *args, **kwargs):
        kernels.append(model.blocks[0].attn.decode_kernel is not None)
        return generate(model, *args, **kwargs)
    monkeypatch.setattr("model.generate.generate", spy)
    monkeypatch.setattr("model.decode_attention.decode_attention_seconds", answer(True))
    faster_text, err = run(capsys, ckpt, "--dtype", dtype, "--num-samples", "2", "--max-new-tokens", "9")
    assert "attention on attngpt's decode kernel" in err
    monkeypatch.setattr("model.decode_attention.decode_attention_seconds", answer(False))
    slower_text, err = run(capsys, ckpt, "--dtype", dtype, "--num-samples", "2", "--max-new-tokens", "9")
    assert "decode kernel" not in err
    _, err = run(capsys, ckpt, "--dtype", dtype, "--no-kv-cache")
    assert "decode kernel" not in err
    assert timed == [(2, (len(PROMPT) + 9) // 2)] * 2 and kernels == [True, False, False]
    if dtype == "float32":  # drawn with one seed from logits within ~1e-6 of the fused kernel's: the same text
        assert faster_text == slower_text


def test_dtype_and_device_reach_the_model(capsys, ckpt, monkeypatch):
    seen = []

    def spy(model, *args, **kwargs):
        seen.append((model.tok_emb.weight.dtype, model.tok_emb.weight.device.type))
        return generate(model, *args, **kwargs)

    monkeypatch.setattr("model.generate.generate", spy)
    run(capsys, ckpt, "--dtype", "bfloat16", "--device", "cpu")
    run(capsys, ckpt)
    assert seen == [(torch.bfloat16, "cpu"), (torch.float32, "cpu")]


def test_compile_reaches_generate_where_it_repays_and_needs_the_kv_cache(capsys, ckpt, monkeypatch):
    """--compile asks generate() for the compiled decode step (whose equality with eager decoding
    tests/model/test_generate_compiled.py proves; here it runs eager, to stay fast) where compile_repays says the
    compile can pay for itself, and says so; where it cannot, sample.py says why and decodes eagerly."""
    seen, asked = [], []

    def spy(model, *args, **kwargs):
        seen.append(kwargs.get("compile"))
        return generate(model, *args, **{**kwargs, "compile": False})

    def repays(answer):
        def decide(model, batch_size, new_tokens):
            asked.append((batch_size, new_tokens))
            return answer, "the measured reason"
        return decide

    monkeypatch.setattr("model.generate.generate", spy)
    monkeypatch.setattr("model.generate.compile_repays", repays(True))
    _, err = run(capsys, ckpt, "--compile", "--num-samples", "2", "--max-new-tokens", "7")
    assert "compiled decode" in err and "not compiled" not in err
    monkeypatch.setattr("model.generate.compile_repays", repays(False))
    _, err = run(capsys, ckpt, "--compile")
    assert "note: --compile: not compiled, decoding eagerly: the measured reason" in err
    assert "compiled decode" not in err
    _, err = run(capsys, ckpt)
    assert "compiled decode" not in err and seen == [True, False, False]
    assert asked[0] == (2, 7) and len(asked) == 2  # without --compile nothing is timed
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--ckpt", str(ckpt), "--compile", "--no-kv-cache"])
    assert exit_info.value.code == 2 and "drop --no-kv-cache" in capsys.readouterr().err


def test_prompt_file_is_the_prompt(capsys, ckpt, tmp_path):
    (tmp_path / "p.txt").write_text(PROMPT)
    assert run(capsys, ckpt, "--prompt-file", str(tmp_path / "p.txt"))[0] == run(capsys, ckpt, "--prompt", PROMPT)[0]
    out, _ = run(capsys, ckpt, "--prompt", "JULIET:")
    assert out.startswith("JULIET:") and not out.startswith(PROMPT)


def test_ckpt_picks_the_folder_it_names(capsys, ckpt, tmp_path):
    """A run's out_dir reads its best/; a checkpoint folder is read as it is; each one's weights are used."""
    other = tmp_path / "other"
    model, payload = load_model(ckpt)
    with torch.no_grad():
        model.tok_emb.weight.mul_(-1.0)
    save_model(model, other, extra={"tokenizer": payload["tokenizer"]})
    from_run, err_run = run(capsys, ckpt.parent, "--seed", "9")
    from_folder, err_folder = run(capsys, ckpt, "--seed", "9")
    from_other, err_other = run(capsys, other, "--seed", "9")
    assert from_run == from_folder != from_other
    assert err_run.rstrip().endswith(f"{ckpt}]") and err_other.rstrip().endswith(f"{other}]")


def test_dump_attn_writes_the_selected_layers_into_dump_dir(capsys, ckpt, tmp_path):
    import numpy as np
    run(capsys, ckpt, "--dump-attn", "1:2", "--dump-dir", str(tmp_path / "d"), "--max-new-tokens", "1")
    with np.load(tmp_path / "d" / "attn.npz") as dump:
        assert sorted(k for k in dump.files if k.startswith("layer_")) == ["layer_1"]
        assert dump["heads_1"].tolist() == [2]

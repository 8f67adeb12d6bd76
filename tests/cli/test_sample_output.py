"""What sample.py prints for several samples of a BPE model, whose rows end at <|endoftext|> each on its own:
one `--- sample i` header per sample, in order, and under it that sample's prompt and continuation up to its
own first end-of-text token (never another row's, never the token itself, never what the model drew after it).

The checkpoint is a GPT-2-vocabulary model that draws from one fixed distribution over a few words and
<|endoftext|> (its final norm ignores the input: a constant hidden state), so rows stop at different steps.
The expected text is model.generate's, called directly with the same seed, cut by hand.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import sample
from data.tokenizer import TiktokenTokenizer
from model import GPT, ModelConfig
from pretrained.checkpoint import load_model, save_model
from model.generate import generate

WORDS = {" to": 0.2, " be": 0.2, " or": 0.15, " not": 0.15, ",": 0.1}  # and <|endoftext|>: the remaining 0.2
PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def bpe_ckpt(tmp_path_factory) -> Path:
    tokenizer = TiktokenTokenizer("gpt2")
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, n_kv_head=2,
                         d_model=16, pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=False)
    torch.manual_seed(0)
    model = GPT(config)
    logits = torch.full((tokenizer.vocab_size,), -40.0)
    for word, p in WORDS.items():
        (token,) = tokenizer.encode(word)
        logits[token] = math.log(p)
    logits[tokenizer.eot] = math.log(1 - sum(WORDS.values()))
    with torch.no_grad():
        model.final_norm.weight.zero_()
        model.final_norm.bias.zero_()
        model.final_norm.bias[0] = 1.0  # the hidden state is e_0 whatever the input
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = logits
    folder = tmp_path_factory.mktemp("sample_output") / "run" / "best"
    save_model(model, folder, extra={"tokenizer": tokenizer.to_json()})
    return folder


def expected_rows(ckpt: Path, prompt: str, n: int, n_new: int, seed: int) -> tuple[list[str], list[int]]:
    """Each sample's text (prompt ids + its continuation up to its own first <|endoftext|>, decoded), and how
    many tokens each row kept."""
    model, _ = load_model(ckpt)
    tokenizer = TiktokenTokenizer("gpt2")
    ids = tokenizer.encode(prompt) or [tokenizer.eot]
    out = generate(model, torch.tensor([ids]).expand(n, -1), n_new, temperature=0.8,
                   generator=torch.Generator().manual_seed(seed), stop_token=tokenizer.eot)
    texts, kept = [], []
    for row in out.tolist():
        new = row[len(ids):]
        cut = new[:new.index(tokenizer.eot)] if tokenizer.eot in new else new
        texts.append(tokenizer.decode(ids + cut))
        kept.append(len(cut))
    return texts, kept


def sample_text(capsys, ckpt: Path, *flags: str) -> tuple[str, str]:
    assert sample.main(["--ckpt", str(ckpt), *flags]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.parametrize("n, seed, prompt", [(2, 5, PROMPT), (5, 4, PROMPT), (4, 5, "")])
def test_each_sample_is_printed_under_its_header_up_to_its_own_end_of_text(capsys, bpe_ckpt, n, seed, prompt):
    texts, kept = expected_rows(bpe_ckpt, prompt, n, 12, seed)
    assert len(set(kept)) > 1, kept  # the rows stop at different steps: a shared cut would show
    assert min(kept) < 12, kept
    out, err = sample_text(capsys, bpe_ckpt, "--prompt", prompt, "--num-samples", str(n), "--seed", str(seed),
                           "--max-new-tokens", "12")
    assert out == "".join(f"--- sample {i + 1}\n{text}\n" for i, text in enumerate(texts))
    assert out.count("--- sample ") == n
    assert out.count("<|endoftext|>") == (n if prompt == "" else 0)  # only an empty prompt's start token
    columns = 12 if max(kept) == 12 else max(kept) + 1  # generation stops once every row has ended
    assert f"[{columns} tokens x {n} in " in err


def test_one_sample_streams_its_text_and_stops_at_its_end_of_text(capsys, bpe_ckpt):
    for seed in (1, 2, 3, 4):
        (text,), (kept,) = expected_rows(bpe_ckpt, PROMPT, 1, 12, seed)
        out, err = sample_text(capsys, bpe_ckpt, "--prompt", PROMPT, "--seed", str(seed), "--max-new-tokens", "12")
        assert out == text + "\n" and "--- sample" not in out
        assert f"[{min(kept + 1, 12)} tokens x 1 in " in err


# --- what goes to stderr, and the numbers in it ---------------------------------------------------------------

def test_the_dump_summary_goes_to_stderr_and_leaves_the_samples_alone(capsys, bpe_ckpt, tmp_path):
    flags = ["--prompt", PROMPT, "--num-samples", "2", "--seed", "5", "--max-new-tokens", "12"]
    plain, _ = sample_text(capsys, bpe_ckpt, *flags)
    dumped, err = sample_text(capsys, bpe_ckpt, *flags, "--dump-attn", "0", "--dump-dir", str(tmp_path / "d"))
    assert dumped == plain
    assert f"attention maps of layers 0 over 3 prompt tokens: {tmp_path / 'd' / 'attn.npz'}" in err


def test_tokens_per_second_count_every_sample_over_the_generation_time(capsys, bpe_ckpt, monkeypatch):
    """On a scripted clock the generation takes 0.25 s: the rate is new tokens x samples / 0.25 s."""
    import types
    clock = iter([100.0, 100.25])
    monkeypatch.setattr(sample, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    _, kept = expected_rows(bpe_ckpt, PROMPT, 5, 12, 4)
    columns = 12 if max(kept) == 12 else max(kept) + 1
    _, err = sample_text(capsys, bpe_ckpt, "--prompt", PROMPT, "--num-samples", "5", "--seed", "4",
                         "--max-new-tokens", "12")
    assert f"[{columns} tokens x 5 in 0.25s: {columns * 5 / 0.25:.1f} tokens/s, KV cache, " in err


def test_only_running_out_of_memory_becomes_the_lower_num_samples_message(capsys, bpe_ckpt, monkeypatch):
    for error in ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes",
                  "CUDA out of memory. Tried to allocate 2.00 GiB"):
        monkeypatch.setattr("model.generate.generate", lambda *a, e=error, **k: (_ for _ in ()).throw(RuntimeError(e)))
        with pytest.raises(SystemExit) as exit_info:
            sample.main(["--ckpt", str(bpe_ckpt), "--num-samples", "3"])
        assert exit_info.value.code == 2
        assert "not enough memory on cpu for 3 sample(s) at once: lower --num-samples" in capsys.readouterr().err
    monkeypatch.setattr("model.generate.generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # anything else is not the user's to fix: it propagates
        sample.main(["--ckpt", str(bpe_ckpt)])

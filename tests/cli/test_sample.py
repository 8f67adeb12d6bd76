"""sample.py through the real command line: every bad input is one clear line and exit status 2, and the
happy paths (prompt file, several samples, cache vs no cache, long prompts, attention dumps) work.

Each case starts a Python process (~2 s, most of it `import torch`), so checks are grouped where natural
and generations are short. The checkpoint is a tiny random model saved with pretrained.checkpoint.save_model:
no training needed. Its matrices are re-drawn with std 0.3 so greedy text is varied (GPT-2's init gives
one character repeated, which would make "same text with and without the cache" prove little).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from insight.value_weighted import value_norms
from model import GPT, ModelConfig
from pretrained.checkpoint import WEIGHTS_FILE, load_model, save_model

REPO = Path(__file__).resolve().parents[2]
CHARS = "\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tinyshakespeare's 65, less "&3$"
BLOCK = 32
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """A run out_dir holding best/ (what train.py writes), and broken copies of that checkpoint."""
    root = tmp_path_factory.mktemp("sample_cli")
    tokenizer = CharTokenizer(CHARS)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=2, n_head=4, n_kv_head=2,
                         d_model=32, pos="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa")
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    good = root / "run" / "best"
    save_model(model, good, extra={"tokenizer": tokenizer.to_json()})
    paths = {"run": root / "run", "good": good, "missing": root / "never_trained"}

    def broken(name: str, damage) -> None:
        shutil.copytree(good, root / name)
        damage(root / name)
        paths[name] = root / name

    weights_size = (good / WEIGHTS_FILE).stat().st_size
    broken("garbage_weights", lambda d: (d / WEIGHTS_FILE).write_bytes(os.urandom(weights_size)))
    broken("truncated_weights", lambda d: (d / WEIGHTS_FILE).write_bytes((good / WEIGHTS_FILE).read_bytes()[:weights_size // 2]))
    broken("corrupted_config", lambda d: (d / "config.json").write_text('{"model": {"vocab_size": 62, "block_'))
    broken("corrupted_tokenizer", lambda d: (d / "config.json").write_text(
        (good / "config.json").read_text().replace(json.dumps(CHARS), json.dumps("aab"))))
    paths["tmp"] = root
    return paths


def sample(*args: str) -> subprocess.CompletedProcess:
    # one intra-op thread: the model is tiny, and two spinning threads crawl when other jobs share the cores
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "sample.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit status 2, nothing on stdout, and stderr exactly one line 'sample.py: error: ...' containing
    every fragment; no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sample.py: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.stdout == ""


# (case, arguments with {name} standing for ckpts[name], fragments the message must contain)
BAD_INPUTS = [
    ("no checkpoint", ["--ckpt", "{missing}"], ["no checkpoint at", "never_trained", "python train.py"]),
    ("unknown characters", ["--prompt", "héllo #1"], ["3 character(s)", "'é'", "'#'", "'1'"]),
    ("layer out of range", ["--dump-attn", "2"], ["--dump-attn", "layer 2", "0..1"]),
    ("head out of range", ["--dump-attn", "1:4"], ["--dump-attn", "head 4", "0..3"]),
    ("malformed spec", ["--dump-attn", "1-3"], ["--dump-attn", "'1-3'"]),
    ("empty spec", ["--dump-attn", ""], ["--dump-attn", "selects no layer"]),
    ("dump dir is a file", ["--dump-attn", "all", "--dump-dir", "{good}/config.json/attn"], ["--dump-dir"]),
    ("negative temperature", ["--temperature", "-0.5"], ["--temperature", "-0.5"]),
    ("top-p zero", ["--top-p", "0"], ["--top-p", "(0, 1]"]),
    ("top-p above one", ["--top-p", "1.5"], ["--top-p", "1.5"]),
    ("top-k zero", ["--top-k", "0"], ["--top-k", ">= 1"]),
    ("negative max-new-tokens", ["--max-new-tokens", "-1"], ["--max-new-tokens", "-1"]),
    ("zero samples", ["--num-samples", "0"], ["--num-samples", ">= 1"]),
    ("garbage weights", ["--ckpt", "{garbage_weights}"], ["model.safetensors", "corrupted or truncated"]),
    ("truncated weights", ["--ckpt", "{truncated_weights}"], ["model.safetensors", "corrupted or truncated"]),
    ("corrupted config", ["--ckpt", "{corrupted_config}"], ["config.json", "corrupted"]),
    ("corrupted tokenizer", ["--ckpt", "{corrupted_tokenizer}"], ["tokenizer", "config.json", "intact checkpoint"]),
]


@pytest.mark.parametrize("case,args,fragments", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_status_2(ckpts, case, args, fragments):
    args = [a.format(**ckpts) for a in args]
    if "--ckpt" not in args:
        args = ["--ckpt", str(ckpts["good"]), *args]
    if "--max-new-tokens" not in args:
        args += ["--max-new-tokens", "3"]  # short, should a case wrongly go on to generate
    assert_user_error(sample(*args), *fragments)


def test_greedy_text_is_the_same_without_the_cache_and_dumps_are_written(ckpts):
    """The same greedy text (40 new tokens: the 32-token window slides) with and without the KV cache;
    `--dump-attn all` and `1:0,0` write attn.npz and one PNG per layer into --dump-dir, holding the
    maps of the checkpoint's model over the prompt. --ckpt takes the run's out_dir (-> best/) or the
    checkpoint folder itself."""
    prompt = "ROMEO: "
    d_all, d_some = ckpts["tmp"] / "dump_all", ckpts["tmp"] / "dump_some"
    common = ["--prompt", prompt, "--temperature", "0", "--max-new-tokens", "40"]
    cached = sample("--ckpt", str(ckpts["run"]), *common, "--dump-attn", "all", "--dump-dir", str(d_all))
    uncached = sample("--ckpt", str(ckpts["good"]), *common, "--no-kv-cache", "--dump-attn", "1:0,0",
                      "--dump-dir", str(d_some))
    for result in (cached, uncached):
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    text = cached.stdout
    assert text == uncached.stdout
    assert text.startswith(prompt) and text.endswith("\n") and len(text) == len(prompt) + 40 + 1
    assert len(set(text[len(prompt):])) >= 8, f"degenerate text {text!r}: the comparison would prove little"
    assert "KV cache" in cached.stderr and "no KV cache" in uncached.stderr

    model, _ = load_model(ckpts["good"])
    tokenizer = CharTokenizer(CHARS)
    ids = tokenizer.encode(prompt)
    expected = model.attention_maps(torch.tensor([ids]))
    internals = model.attention_internals(torch.tensor([ids]))
    T = len(ids)
    above = np.triu(np.ones((T, T), dtype=bool), k=1)
    for out_dir, heads in [(d_all, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}), (d_some, {0: [0, 1, 2, 3], 1: [0]})]:
        assert sorted(p.name for p in out_dir.iterdir()) == ["attention.html", "attn.npz", "layer_0.png", "layer_1.png"]
        assert '"labels": ["R", "O", "M", "E", "O", ":", "␣"]' in (out_dir / "attention.html").read_text(encoding="utf-8")
        with np.load(out_dir / "attn.npz") as npz:
            assert npz["tokens"].tolist() == tokenizer.token_strings(ids) == list(prompt)
            assert npz["token_ids"].tolist() == ids
            for layer, selected in heads.items():
                w = npz[f"layer_{layer}"]
                assert w.shape == (4, T, T)
                np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
                assert (w[:, above] == 0).all()
                np.testing.assert_allclose(w, expected[layer][0].numpy(), atol=1e-6, rtol=0)
                assert npz[f"heads_{layer}"].tolist() == selected
                norms = npz[f"value_norm_{layer}"]  # (n_head, T): ||v_j W_O^h||
                np.testing.assert_allclose(norms, value_norms(internals[layer].v, internals[layer].out_weight, 4)[0],
                                           rtol=1e-5)
                np.testing.assert_allclose(npz[f"value_weighted_{layer}"], w * norms[:, None, :], rtol=1e-6)
        for layer in heads:
            png = out_dir / f"layer_{layer}.png"
            assert png.read_bytes()[:8] == PNG_SIGNATURE
            assert matplotlib.image.imread(png).ndim == 3


def test_prompt_file_longer_than_block_size_and_two_samples(ckpts):
    """A prompt file of 61 characters: a warning names block_size, the last 32 characters are kept, and
    --num-samples 2 prints two labelled samples (filtered sampling: top-k and top-p together)."""
    prompt = "To be, or not to be, that is the question:\nWhether tis nobler "
    assert len(prompt) > BLOCK
    path = ckpts["tmp"] / "prompt.txt"
    path.write_text(prompt, encoding="utf-8")
    result = sample("--ckpt", str(ckpts["good"]), "--prompt-file", str(path), "--num-samples", "2",
                    "--max-new-tokens", "12", "--temperature", "1.0", "--top-k", "10", "--top-p", "0.95")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "warning:" in result.stderr and f"block_size={BLOCK}" in result.stderr
    chunks = result.stdout.split("--- sample ")
    assert chunks[0] == "" and len(chunks) == 3, result.stdout
    samples = []
    for number, chunk in zip(("1", "2"), chunks[1:]):
        label, _, body = chunk.partition("\n")
        assert label == number
        body = body.removesuffix("\n")
        assert body.startswith(prompt[-BLOCK:]) and len(body) == BLOCK + 12
        samples.append(body)
    assert samples[0] != samples[1], "two samples of a batch should differ"


def test_empty_prompt_starts_from_a_newline(ckpts):
    result = sample("--ckpt", str(ckpts["good"]), "--prompt", "", "--max-new-tokens", "6")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith("\n") and len(result.stdout) == 1 + 6 + 1


@pytest.mark.parametrize("prompt", ["-x", "- a list item", "--- ACT II", "-", "-1.5", "--"])
def test_a_prompt_may_start_with_a_dash(prompt):
    import sample as sample_cli
    if prompt != "--":  # alone after --prompt, "--" is the end-of-options marker: the value is missing
        assert sample_cli.parse_args(["--prompt", prompt]).prompt == prompt
        assert sample_cli.parse_args(["--prompt", prompt, "--seed", "3"]).seed == 3
    # joined, any text is the prompt (argparse before Python 3.12 turned "--prompt=--" into an empty list)
    assert sample_cli.parse_args([f"--prompt={prompt}", "--seed", "3"]).prompt == prompt


@pytest.mark.parametrize("args", [["--prompt", "--seed", "3"], ["--prompt", "--se"], ["--prompt"]])
def test_a_missing_prompt_is_still_an_error(args, capsys):
    import sample as sample_cli
    with pytest.raises(SystemExit) as exit_info:
        sample_cli.parse_args(args)
    assert exit_info.value.code == 2
    assert "argument --prompt: expected one argument" in capsys.readouterr().err


def test_dash_prompt_through_the_command_line(ckpts):
    result = sample("--ckpt", str(ckpts["good"]), "--prompt", "- a", "--max-new-tokens", "4")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith("- a") and len(result.stdout) == 3 + 4 + 1


HEAD_ARRAYS = ("head_prev_token", "head_duplicate_token", "head_induction", "head_ablation_dloss")


def expected_head_scores(source_path: str, prompt: str) -> tuple[dict[str, np.ndarray], list[int]]:
    """What the dump's head_* arrays must hold, computed in this process from the same source."""
    from insight.dump import prompt_head_scores
    from pretrained.load import open_pretrained
    source = open_pretrained(source_path)
    ids = source.tokenizer.prompt_ids(prompt)
    scores, _ = prompt_head_scores(source.build(), torch.tensor([ids]), source.tokenizer)
    return {f"head_{name}": a for name, a in scores.items()}, ids


def test_dump_holds_every_layers_head_scores_even_for_one_layer(ckpts):
    """--dump-attn 1 writes layer 1's maps only, but the head scores of both layers, (n_layer, n_head)
    float32, the numbers prompt_head_scores gives for the checkpoint's model; the page shows them."""
    out = ckpts["tmp"] / "dump_scores"
    prompt = "ROMEO: what light"
    result = sample("--ckpt", str(ckpts["run"]), "--prompt", prompt, "--max-new-tokens", "0", "--dump-attn", "1",
                    "--dump-dir", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "note:" not in result.stderr
    expected, ids = expected_head_scores(str(ckpts["good"]), prompt)
    with np.load(out / "attn.npz") as npz:
        assert "layer_1" in npz.files and "layer_0" not in npz.files
        for name in HEAD_ARRAYS:
            assert npz[name].shape == (2, 4) and npz[name].dtype == np.float32, name
            np.testing.assert_allclose(npz[name], expected[name], atol=1e-6, rtol=0, err_msg=name)
            assert np.isfinite(npz[name]).all()
    html = (out / "attention.html").read_text(encoding="utf-8")
    assert '"score_names": ["prev_token", "duplicate_token", "induction", "ablation_dloss"]' in html
    assert f"over the prompt's {len(ids)} tokens" in html


def test_no_circuit_leaves_the_circuit_out_of_the_dump_and_needs_a_dump(ckpts):
    out = ckpts["tmp"] / "dump_no_circuit"
    args = ["--ckpt", str(ckpts["run"]), "--prompt", "ROMEO: what", "--max-new-tokens", "0"]
    result = sample(*args, "--dump-attn", "all", "--dump-dir", str(out), "--no-circuit")
    assert result.returncode == 0, result.stderr
    with np.load(out / "attn.npz") as npz:
        assert "head_induction" in npz.files
        assert not [name for name in npz.files if name.startswith("circuit_") or name == "head_description"]
    assert '"circuit": null' in (out / "attention.html").read_text(encoding="utf-8")
    result = sample(*args, "--no-circuit")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("--no-circuit changes what --dump-attn writes: add --dump-attn SPEC, or "
                                          "drop --no-circuit")


def test_a_one_token_prompt_dumps_nan_prev_token_ablation_and_circuit_paths_and_says_why(ckpts):
    out = ckpts["tmp"] / "dump_one"
    result = sample("--ckpt", str(ckpts["good"]), "--prompt", "R", "--max-new-tokens", "0", "--dump-attn", "all",
                    "--dump-dir", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "note: prev_token and ablation Δloss are NaN: a 1-token prompt" in result.stderr
    with np.load(out / "attn.npz") as npz:
        assert np.isnan(npz["head_prev_token"]).all() and np.isnan(npz["head_ablation_dloss"]).all()
        assert np.isfinite(npz["head_induction"]).all() and np.isfinite(npz["head_duplicate_token"]).all()
        # the circuit: what needs a next token NaN, what the weights give alone there
        assert np.isnan(npz["circuit_path_dloss"]).all() and np.isnan(npz["head_direct_logit"]).all()
        assert np.isfinite(npz["circuit_z"][:, 0, :, 1]).all()
    assert "note: circuit path ablation and direct logit attribution are NaN: a 1-token prompt" in result.stderr


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    from tests.hf_models import make_gpt2, make_llama
    root = tmp_path_factory.mktemp("hf_dump")
    return {"gpt2": make_gpt2(root / "gpt2", seed=7), "llama": make_llama(root / "llama", seed=8)}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_dump_of_a_hugging_face_folder_holds_its_head_scores(hf_folders, tmp_path, name):
    """A GPT-2 and a Llama folder (converted in memory): the same four arrays, over every layer, from the
    model and its tokenizer (the role probe draws that tokenizer's ordinary tokens)."""
    out = tmp_path / "dump"
    prompt = "The animal didn't cross the street because it was tired"
    result = sample("--ckpt", str(hf_folders[name]), "--prompt", prompt, "--max-new-tokens", "0",
                    "--dump-attn", "0:1", "--dump-dir", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    expected, _ = expected_head_scores(str(hf_folders[name]), prompt)
    with np.load(out / "attn.npz") as npz:
        for key in HEAD_ARRAYS:
            assert npz[key].shape == (2, 4) and npz[key].dtype == np.float32
            np.testing.assert_allclose(npz[key], expected[key], atol=1e-5, rtol=1e-5, err_msg=key)
        assert np.abs(npz["head_ablation_dloss"]).max() > 1e-4  # the perturbed heads matter

"""Property-based fuzzing (hypothesis): tokenizers round-trip what they accept; no override, config file or
prompt makes a command crash -- bad input is a UserError (one line, exit status 2), never a traceback."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import tempfile
import typing
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from common.errors import UserError
from data.tokenizer import CharTokenizer, TiktokenTokenizer
from model import GPT, ModelConfig
from pretrained.checkpoint import save_model
from tests.helpers import TINY
from training.config import RunConfig, load_run_config

SURROGATES = re.compile("[\ud800-\udfff]")
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- tokenizers ----------------------------------------------------------------------------------------

@FUZZ
@given(vocab=st.sets(st.characters(), min_size=1, max_size=80), data=st.data())
def test_char_tokenizer_round_trips_text_over_its_vocabulary(vocab, data):
    tok = CharTokenizer("".join(vocab))
    text = data.draw(st.text(alphabet=st.sampled_from(sorted(vocab)), max_size=200))
    ids = tok.encode(text)
    assert len(ids) == len(text) and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert CharTokenizer(tok.to_json()["chars"]).encode(text) == ids  # what a checkpoint rebuilds


@FUZZ
@given(vocab=st.sets(st.characters(), min_size=1, max_size=30), text=st.text(st.characters(), max_size=100))
def test_char_tokenizer_refuses_unknown_characters_with_a_user_error(vocab, text):
    tok = CharTokenizer("".join(vocab))
    unknown = tok.unknown_chars(text)
    if not unknown:
        assert tok.decode(tok.encode(text)) == text
        return
    with pytest.raises(UserError) as e:
        tok.encode(text)
    assert f"{len(unknown)} character(s)" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def gpt2() -> TiktokenTokenizer:
    try:
        return TiktokenTokenizer("gpt2")
    except UserError as e:
        pytest.skip(f"the GPT-2 vocabulary is not cached on this machine ({e})")


@FUZZ
@given(text=st.text(st.characters(), max_size=300))
def test_bpe_round_trips_any_unicode_text(gpt2, text):
    """Any string, lone surrogates included: tiktoken encodes a surrogate (not valid Unicode, so not UTF-8)
    as U+FFFD; everything else comes back exactly. Special-token text is ordinary text."""
    ids = gpt2.encode(text)
    assert all(0 <= i < gpt2.vocab_size for i in ids) and gpt2.eot not in ids
    assert gpt2.decode(ids) == SURROGATES.sub("\ufffd", text)


def test_bpe_special_token_text_is_ordinary_text(gpt2):
    ids = gpt2.encode("a<|endoftext|>b")
    assert gpt2.eot not in ids and gpt2.decode(ids) == "a<|endoftext|>b"


# --- config overrides and files -------------------------------------------------------------------------

def dotted_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            keys.append(prefix + f.name)
            keys += dotted_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


KEYS = dotted_keys()


@st.composite
def typo(draw, key: str) -> str:
    i = draw(st.integers(0, len(key) - 1))
    edit = draw(st.sampled_from(["drop", "swap", "insert", "case"]))
    if edit == "drop":
        return key[:i] + key[i + 1:]
    if edit == "swap" and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    if edit == "insert":
        return key[:i] + draw(st.sampled_from("._x1 ")) + key[i:]
    return key.upper()


override_keys = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(KEYS).flatmap(typo),
    st.sampled_from(KEYS).map(lambda k: k + ".sub"),
    st.text(max_size=20),
)
scalars = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["null", "~", "true", "false", "yes", "no", "on", ".nan", "-.inf", ".inf", "1e-3", "1.0e+400",
                     "0x1F", "0o17", "1_000", "''", '""', "[]", "{}", "!!binary aGVsbG8=", "!!python/object:os.system",
                     "&a [1, *a]", "*undefined", "{a: [1, {b: null}]}", "[1, [2, [3, [4]]]]", "- 1\n- 2", "cpu",
                     "cuda:0", "adamw", "muon", "gpt2", "char", "text", "hub", "float16", "bfloat16", "auto"]),
    st.text(max_size=30),
)
yaml_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5), inner, max_size=3).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}")), max_leaves=8)
overrides = st.lists(st.one_of(st.tuples(override_keys, yaml_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
                               st.text(max_size=40)), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(overrides=overrides)
def test_random_overrides_give_a_config_or_one_user_error_line(overrides):
    try:
        config = load_run_config(TINY, overrides)
    except UserError as e:
        assert str(e)  # the command lines print it as one line
        return
    assert isinstance(config, RunConfig)


@FUZZ
@given(content=st.one_of(st.binary(max_size=300),
                         st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
                         st.dictionaries(st.sampled_from(["model", "train", "data", "eval", "x", "out_dir"]),
                                         yaml_values, max_size=4).map(
                             lambda d: "\n".join(f"{k}: {v}" for k, v in d.items()).encode())))
def test_random_config_files_give_a_config_or_a_user_error(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_bytes(content)
        try:
            config = load_run_config(path)
        except UserError as e:
            assert str(e)
            return
    assert isinstance(config, RunConfig)


# --- prompts through sample.py (in-process) ----------------------------------------------------------------

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, gpt2) -> dict[str, Path]:
    """Two tiny random models saved as sample.py reads them: a char one and a GPT-2 BPE one."""
    root = tmp_path_factory.mktemp("fuzz_ckpts")
    torch.manual_seed(0)
    out = {}
    for name, tok, vocab in (("char", CharTokenizer(CHARS), len(CHARS)), ("bpe", gpt2, 50304)):
        config = ModelConfig(vocab_size=vocab, block_size=16, n_layer=1, n_head=2, d_model=16)
        save_model(GPT(config), root / name, extra={"tokenizer": tok.to_json()})
        out[name] = root / name
    return out


def run_sample(argv: list[str]) -> tuple[int, str, str]:
    """sample.main in this process, its output through strict UTF-8 streams (as a real terminal would)."""
    import sample
    stdout, stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    code, threads = 0, torch.get_num_threads()
    torch.set_num_threads(1)  # a 16-wide model: more threads only cost when the machine is shared
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = sample.main(argv)
        except SystemExit as e:
            code = e.code
        finally:
            torch.set_num_threads(threads)
    stdout.flush()
    return code, stdout.buffer.getvalue().decode("utf-8"), stderr.getvalue()


prompts = st.one_of(st.text(st.characters(), max_size=40), st.text(alphabet=CHARS, max_size=40),
                    st.text(st.characters(), min_size=200, max_size=3000),
                    st.text(st.characters(max_codepoint=0x1F), max_size=20))  # control characters


@FUZZ
@given(prompt=prompts, kind=st.sampled_from(["char", "bpe"]), cache=st.booleans())
def test_any_prompt_samples_or_is_refused_in_one_line(checkpoints, prompt, kind, cache):
    argv = ["--ckpt", str(checkpoints[kind]), f"--prompt={prompt}", "--max-new-tokens", "3", "--temperature", "0"]
    code, stdout, stderr = run_sample(argv + ([] if cache else ["--no-kv-cache"]))
    assert code in (0, 2), (code, stderr[-2000:])
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sample.py: error: "), stderr
        assert kind == "char", stderr  # a BPE model takes any text
    else:
        assert stdout.endswith("\n") and "tokens/s" in stderr


@FUZZ
@given(content=st.binary(max_size=400))
def test_any_prompt_file_samples_or_is_refused_in_one_line(checkpoints, content):
    assume(content)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompt.txt"
        path.write_bytes(content)
        code, _, stderr = run_sample(["--ckpt", str(checkpoints["bpe"]), "--prompt-file", str(path),
                                      "--max-new-tokens", "2", "--temperature", "0"])
    assert code in (0, 2), (code, stderr[-2000:])
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot read --prompt-file" in lines[0], stderr

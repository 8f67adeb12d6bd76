"""What an override's text means (common/config_io.py): the literal text for string keys, YAML
for the others, refused when YAML would cut or fold it; null's spellings are null; `~` is the home folder in
every path setting. Generated override strings against the rule, then one real run whose out_dir is
`~/runs/exp #2`, sampled with the command the run prints."""
from __future__ import annotations

import dataclasses
import os
import shlex
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.config_io import NULL_TEXTS, PATH, annotation_at, apply_overrides
from common.errors import UserError
from data.prepare import read_data_section
from tests.helpers import TINY, prepared_shakespeare_dir, run_cli
from training.config import RunConfig, load_run_config

# string keys, with what they need beside them to be valid at all
STRING_KEYS = {"out_dir": [], "device": [], "train.init_from": [], "wandb.project": [], "wandb.entity": [],
               "wandb.run_name": [], "attn.probe_text": [], "data.path": ["data.source=text"],
               "data.name": ["data.source=hub"], "data.config_name": ["data.source=hub", "data.name=x"],
               "data.data_files": ["data.source=hub", "data.name=x"], "data.split": [], "data.text_column": []}


def field_of(key: str) -> dataclasses.Field:
    *sections, name = key.split(".")
    cls = annotation_at(RunConfig, sections) if sections else RunConfig
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def value_of(config: RunConfig, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_the_string_keys_are_every_string_setting():
    """STRING_KEYS lists every setting whose type takes free text (so the property below covers them all)."""
    def walk(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], f"{prefix}{f.name}.")
            elif str in (hints[f.name], *typing.get_args(hints[f.name])):
                yield prefix + f.name
    assert set(walk(RunConfig)) - {"data.tokenizer"} == set(STRING_KEYS)  # a tokenizer name is checked by name


texts = st.one_of(st.text(max_size=40), st.sampled_from(["runs/exp #2", "a #b", "x\ny", " lead", "trail ", "'q'",
                                                          '"dq"', "[not, a list", "~/runs/x", "~", "null", "Null",
                                                          "yes", "1e-3", "0x1F", "{a: 1}", "&a x", "*b", "- item",
                                                          "a: b", "key=value=more", "#all comment"]))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(STRING_KEYS)), text=texts)
def test_a_string_key_takes_the_override_text_literally(key, text):
    overrides = [*STRING_KEYS[key], f"{key}={text}"]
    is_path = field_of(key).metadata.get("path", False)
    optional = type(None) in typing.get_args(field_of_type(key))
    try:
        config = load_run_config(TINY, overrides)
    except UserError as e:
        message = str(e)
        assert "\n" not in message
        if text.strip() in NULL_TEXTS:
            assert not optional or key in ("data.path", "data.name"), message  # these two need a value here
        elif "\x00" in text and is_path:
            assert "NUL character" in message
        elif key in ("data.split", "data.text_column"):
            assert text.strip() == "" or "non-empty" in message, message
        elif key in ("data.path", "data.data_files") and text.lstrip().startswith("["):
            pass  # a list in YAML's flow syntax: its items are checked as paths
        else:
            raise AssertionError(f"{key}={text!r} refused: {message}")
        return
    value = value_of(config, key)
    if text.strip() in NULL_TEXTS:
        assert value is None
    elif key in ("data.path", "data.data_files") and text.lstrip().startswith("[") and isinstance(value, list):
        pass  # YAML's list, as the key's type allows
    else:
        assert value == (os.path.expanduser(text) if is_path else text), (key, text, value)


def field_of_type(key: str):
    *sections, name = key.split(".")
    cls = annotation_at(RunConfig, sections) if sections else RunConfig
    return typing.get_type_hints(cls)[name]


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["train.max_iters", "train.lr", "seed", "model.n_layer", "attn.layers", "model.norm_eps",
                            "eval.batch_size", "model.bias"]),
       value=st.sampled_from(["3", "2e-3", "true", "[0, 1]", "null", "5"]),
       tail=st.sampled_from([" #c", "  # why", "\n7", " 1\n2", "#x", ""]))
def test_a_typed_key_is_refused_when_yaml_would_cut_or_fold_its_text(key, value, tail):
    import yaml
    text = value + tail
    try:
        expected, valid = yaml.safe_load(text), True
    except yaml.YAMLError:
        expected, valid = None, False
    try:
        raw = apply_overrides({}, [f"{key}={text}"], RunConfig)
    except UserError as e:
        assert f"override '{key}'" in str(e) and ("comment" in str(e) or "line break" in str(e)), str(e)
        assert "#" in text or "\n" in text, text
        return
    node = raw
    for part in key.split("."):
        node = node[part]
    if valid:  # YAML read it, and dropped or folded nothing: a '#' it kept is inside a scalar ("3#x")
        assert node == expected and "\n" not in tail and (" #" not in text and "]#" not in text), (key, text, node)
    else:  # not YAML: the literal text, which the type check then refuses by name
        assert node == text


def test_null_spellings_and_quotes(monkeypatch):
    assert load_run_config(TINY, ["attn.probe_text=null"]).attn.probe_text is None
    assert load_run_config(TINY, ["attn.probe_text=~"]).attn.probe_text is None
    assert load_run_config(TINY, ["attn.probe_text="]).attn.probe_text is None
    assert load_run_config(TINY, ["attn.probe_text='null'"]).attn.probe_text == "'null'"  # quotes are text
    assert load_run_config(TINY, ["attn.probe_text=null pointer"]).attn.probe_text == "null pointer"
    with pytest.raises(UserError, match="'out_dir' got nothing"):
        load_run_config(TINY, ["out_dir=null"])
    assert load_run_config(TINY, ["train.compile=true"]).train.compile is True
    assert load_run_config(TINY, ["train.compile=auto"]).train.compile == "auto"
    assert load_run_config(TINY, ["data.source=text", "data.path=[a.txt, b #1.txt]"]).data.path == \
        "[a.txt, b #1.txt]"  # not YAML (the comment would cut it): the literal text, one path


def test_tilde_is_the_home_folder_in_every_path_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = str(tmp_path / "home")
    config_file = tmp_path / "c.yaml"
    config_file.write_text("out_dir: ~/runs/from_file\ndata:\n  source: text\n  path: [~/a.txt, b.txt]\n"
                           "train:\n  init_from: ~/runs/base\n")
    cfg = load_run_config(config_file)
    assert cfg.out_dir == f"{home}/runs/from_file" and cfg.data.path == [f"{home}/a.txt", "b.txt"]
    assert cfg.train.init_from == f"{home}/runs/base"
    cfg = load_run_config(TINY, ["out_dir=~/runs/x", "data.source=hub", "data.name=~/ds",
                                 "data.data_files=~/shards/*.parquet"])
    assert (cfg.out_dir, cfg.data.name, cfg.data.data_files) == (f"{home}/runs/x", f"{home}/ds",
                                                                 f"{home}/shards/*.parquet")
    assert load_run_config(TINY, ["train.init_from=gpt2"]).train.init_from == "gpt2"  # a hub id stays one
    marked = {f.name for cls in (RunConfig, *[typing.get_type_hints(RunConfig)[s] for s in ("data", "train")])
              for f in dataclasses.fields(cls) if f.metadata is PATH or f.metadata.get("path")}
    assert marked == {"out_dir", "path", "name", "data_files", "init_from"}


def test_data_prepare_reads_only_the_overrides_of_what_it_prepares(tmp_path):
    data, block = read_data_section(str(TINY), ["out_dir=runs/exp #2", "train.lr=1 #not read", "model.block_size=8",
                                                "data.source=text", "data.path=notes/a #1.txt"])
    assert data.path == "notes/a #1.txt" and block == 8
    with pytest.raises(UserError, match="override 'model.block_size': its value holds a YAML comment"):
        read_data_section(str(TINY), ["model.block_size=8 #eight"])


# --- the real command line ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def test_a_run_in_home_runs_exp_2_lands_there_and_its_printed_sample_command_works(tmp_path, data_dir):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {"HOME": str(home), "ATTNGPT_DATA_DIR": str(data_dir)}
    proc = run_cli(["train.py", str(TINY), "out_dir=~/runs/exp #2", "train.max_iters=2", "eval.interval=2",
                    "eval.iters=1", "attn.enabled=false", "train.peak_flops=1e12"], env_extra=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (home / "runs" / "exp #2" / "latest" / "model.safetensors").is_file()
    assert not (cwd / "~").exists() and not (home / "runs" / "exp").exists()
    printed = proc.stdout.strip().splitlines()[-1].split("Sample with: ", 1)[1]
    argv = shlex.split(printed)
    assert argv[:3] == ["python", "sample.py", "--ckpt"] and argv[3] == str(home / "runs" / "exp #2")
    sampled = run_cli([argv[1], *argv[2:], "--max-new-tokens", "3"], env_extra=env, cwd=cwd)
    assert sampled.returncode == 0 and sampled.stdout.startswith("..."), sampled.stderr[-2000:]

"""data/repeated.py, the repeated source: seeded random sequences each followed by its copy, prepared like any
corpus. Every setting changes the text it should (and only as it should); the rules on the settings themselves
(defaults, bad values in one line): test_config_repeated.py."""
from __future__ import annotations

import string
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.config_io import from_dict
from data.config import DataConfig
from data.prepare import prepare_data
from data.repeated import MAX_ALPHABET_SIZE, SEPARATOR, alphabet, repeated_lines


def split_line(line: str) -> str:
    """The sequence of a line `s s \\n`, checking the line is exactly that."""
    assert line.endswith(SEPARATOR) and (len(line) - 1) % 2 == 0, line
    body = line[:-1]
    half = len(body) // 2
    assert body[:half] == body[half:], line
    return body[:half]


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200), low=st.integers(1, 12), extra=st.integers(0, 12), n=st.integers(1, 60),
       seed=st.integers(0, 2**63 - 1))
def test_every_line_is_a_sequence_of_the_alphabet_twice(size, low, extra, n, seed):
    lines = repeated_lines(size, low, low + extra, n, seed)
    assert len(lines) == n
    chars = set(alphabet(size))
    for line in lines:
        sequence = split_line(line)
        assert low <= len(sequence) <= low + extra and set(sequence) <= chars
    assert repeated_lines(size, low, low + extra, n, seed) == lines  # the seed alone decides


def test_characters_and_lengths_are_uniform_and_the_seed_matters():
    lines = repeated_lines(8, 3, 6, 4000, seed=1)
    lengths = np.array([len(split_line(line)) for line in lines])
    assert set(lengths) == {3, 4, 5, 6} and abs(lengths.mean() - 4.5) < 0.1
    text = "".join(split_line(line) for line in lines)
    counts = np.array([text.count(c) for c in alphabet(8)])
    assert abs(counts / len(text) - 1 / 8).max() < 0.01  # 18,000 draws: 4 sigma is 0.01
    assert repeated_lines(8, 3, 6, 4000, seed=2) != lines
    assert {len(split_line(line)) for line in repeated_lines(8, 5, 5, 50, seed=1)} == {5}  # one length: all equal


def test_the_alphabet_is_distinct_printable_characters_ascii_first():
    full = alphabet(MAX_ALPHABET_SIZE)
    assert len(full) == len(set(full)) == MAX_ALPHABET_SIZE
    assert full[:62] == string.ascii_lowercase + string.ascii_uppercase + string.digits
    assert full[62:94] == string.punctuation
    assert SEPARATOR not in full
    for ch in full:
        assert ch.isprintable() and not ch.isspace() and unicodedata.category(ch)[0] in "LNPS", repr(ch)
    assert alphabet(10) == full[:10]
    with pytest.raises(ValueError):
        alphabet(0)


def repeated_config(**settings_) -> DataConfig:
    return from_dict(DataConfig, {"source": "repeated", **settings_}, "data.")


@pytest.fixture
def data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def prepared_text(prepared) -> str:
    tok = prepared.tokenizer
    return "".join(tok.decode(prepared.stream(split).read(0, prepared.split_tokens(split)).tolist())
                   for split in ("train", "val"))


def test_prepared_like_any_text_and_each_setting_changes_the_corpus(data_folder):
    settings_ = {"alphabet_size": 12, "sequence_length": [3, 9], "num_sequences": 300, "seed": 5}
    cfg = repeated_config(**settings_)
    prepared = prepare_data(cfg, quiet=True)
    lines = repeated_lines(12, 3, 9, 300, 5)
    assert prepared_text(prepared) == "".join(lines)  # every character, in order, across the split
    assert prepared.tokenizer.chars == "".join(sorted(alphabet(12) + SEPARATOR))  # 12 characters and the line break
    assert prepared.val_tokens == len("".join(lines)) - int(len("".join(lines)) * 0.9)  # the text split
    assert prepare_data(cfg, quiet=True).reused  # the same settings: the same folder, reused
    folders = {prepared.dir}
    for name, value in (("alphabet_size", 13), ("sequence_length", [3, 10]), ("num_sequences", 301), ("seed", 6)):
        other = prepare_data(repeated_config(**{**settings_, name: value}), quiet=True)
        assert not other.reused and other.dir not in folders, name
        folders.add(other.dir)
        expected = repeated_lines(**{"alphabet_size": 12, "min_length": 3, "max_length": 9, "num_sequences": 300,
                                     "seed": 5, **_argument(name, value)})
        assert prepared_text(other) == "".join(expected), name


def _argument(name: str, value) -> dict:
    if name == "sequence_length":
        return {"min_length": value[0], "max_length": value[1]}
    return {name: value}


def test_streaming_and_num_proc_give_the_same_tokens(data_folder):
    base = prepare_data(repeated_config(num_sequences=400), quiet=True)
    tokens = {split: base.stream(split).read(0, base.split_tokens(split)).tolist() for split in ("train", "val")}
    for extra in ({"streaming": True}, {"num_proc": 2}):
        again = prepare_data(repeated_config(num_sequences=400, **extra), quiet=True, force=True)
        assert {split: again.stream(split).read(0, again.split_tokens(split)).tolist()
                for split in ("train", "val")} == tokens, extra

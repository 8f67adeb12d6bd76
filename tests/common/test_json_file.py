"""common/json_file.py: reading a file someone else may have written. Its size is bounded before a byte is read
(from the file system, or up to the limit for a device), its JSON parsed strictly (no NaN, no infinity, no float
overflow, no nesting past the parser's stack, no lone surrogate), and what Python writes for finite values read
back equal."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.json_file import FileContentError, parse_json, read_bounded, read_json


def test_a_file_is_refused_from_its_size_before_it_is_read(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"1" * 100)
    assert read_bounded(path, 100, "config.json") == b"1" * 100
    with pytest.raises(FileContentError, match=r"config.json '.*' is 101 bytes, more than the 100 bytes"):
        path.write_bytes(b"1" * 101)
        read_bounded(path, 100, "config.json")
    os.truncate(path, 2**40)  # sparse: read, it would take a terabyte of memory
    with pytest.raises(FileContentError, match=r"is 1.1 TB, more than the 4.0 MB such a file can be"):
        read_json(path, 4_000_000, "config.json")


def test_a_device_without_a_size_is_read_only_up_to_the_limit():
    with pytest.raises(FileContentError, match="holds more, more than the 1.0 kB"):
        read_bounded("/dev/zero", 1000, "tokenizer.json")  # endless: st_size is 0


@pytest.mark.parametrize("text, fragment", [
    ("NaN", "NaN is not a JSON number"), ('{"a": [Infinity]}', "Infinity is not a JSON number"),
    ('{"n_embd": 1e400}', "the number 1e400 is too large for a float"), ("-1e400", "too large for a float"),
    ("1" * 5000, "is not valid JSON"), ("[" * 100_000 + "]" * 100_000, "nests lists or objects too deeply"),
    (b'{"a": "\xff"}', "is not UTF-8 text (byte 0xff at offset 7)"), ('{"a": 1,}', "is not valid JSON: Expecting"),
])
def test_json_is_parsed_strictly(text, fragment):
    with pytest.raises(FileContentError) as e:
        parse_json(text, "config.json", "/x/config.json")
    assert fragment in str(e.value) and str(e.value).startswith("config.json '/x/config.json' ")


def test_json_that_python_writes_for_finite_values_is_read_back_equal():
    value = {"a": [1, 2.5, 1e308, -0.0, None, True, "é"], "b": {"c": 10**30}}
    assert parse_json(json.dumps(value), "x.json", "x.json") == value


def _lone_surrogates(value) -> bool:
    """Whether any string in a JSON value (keys too) holds a code point UTF-8 cannot encode (independent of
    json_file: by code point)."""
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(map(_lone_surrogates, value))
    if isinstance(value, dict):
        return any(_lone_surrogates(k) or _lone_surrogates(v) for k, v in value.items())
    return False


json_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8)
json_values = st.recursive(json_text | st.integers() | st.booleans() | st.none(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
                           max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans())
def test_json_whose_strings_no_utf8_can_hold_is_refused_and_any_other_read_back_equal(value, ascii_only):
    """A lone surrogate can only come in as a \\udXXX escape (json.dumps writes one); a pair of escapes is one
    character, and a vocabulary read from such a file must always be printable and savable."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # ensure_ascii=False keeps a lone surrogate as itself: no file can hold that
        return
    if _lone_surrogates(value):
        with pytest.raises(FileContentError, match=r"holds a string that is not Unicode text \(a lone surrogate, U\+D"):
            parse_json(data, "tokenizer.json", "t.json")
    else:
        assert parse_json(data, "tokenizer.json", "t.json") == value

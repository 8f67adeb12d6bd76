"""The rules every reader of a file from elsewhere applies (common/json_file.py, common/schema.py, ModelConfig):
a size bound before any reading, strict JSON, and each value's type and range -- checked against independent
predicates over random values (hypothesis), so that the rule, not a list of cases, is what is tested."""
from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from common.json_file import FileContentError, parse_json, read_bounded, read_json
from common.schema import AnyOf, Bool, DictOf, Fields, Float, Int, Invalid, ListOf, Nullable, Str, check
from model.config import ModelConfig


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


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.integers(-2, 12)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    max_leaves=6)


def is_int(v) -> bool:
    return type(v) is int


def is_number(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


SCHEMAS = [
    (Int(1), lambda v: is_int(v) and v >= 1),
    (Int(0, 10), lambda v: is_int(v) and 0 <= v <= 10),
    (Float(above=0, below=1), lambda v: is_number(v) and 0 < v < 1),
    (Float(low=0), lambda v: is_number(v) and v >= 0),
    (Bool(), lambda v: type(v) is bool),
    (Str(), lambda v: type(v) is str),
    (Str(choices=("a", "b")), lambda v: v in ("a", "b") and type(v) is str),
    (Nullable(Int(0)), lambda v: v is None or (is_int(v) and v >= 0)),
    (ListOf(Str()), lambda v: type(v) is list and all(type(x) is str for x in v)),
    (ListOf(Int(0), length=2), lambda v: type(v) is list and len(v) == 2 and all(is_int(x) and x >= 0 for x in v)),
    (DictOf(Int(0)), lambda v: type(v) is dict and all(is_int(x) and x >= 0 for x in v.values())),
    (AnyOf(Int(0), ListOf(Int(0))), lambda v: (is_int(v) and v >= 0)
     or (type(v) is list and all(is_int(x) and x >= 0 for x in v))),
    (Fields({"a": Int(1), "b": Nullable(Bool())}, required=("a",)),
     lambda v: type(v) is dict and "a" in v and is_int(v["a"]) and v["a"] >= 1
     and (v.get("b") is None or type(v["b"]) is bool)),
]


@settings(max_examples=300, deadline=None)
@given(value=json_values, which=st.integers(0, len(SCHEMAS) - 1))
def test_a_schema_accepts_exactly_the_values_of_its_type_and_range(value, which):
    schema, predicate = SCHEMAS[which]
    try:
        schema.check(value, "key")
        accepted = True
    except Invalid as e:
        accepted = False
        assert str(e).startswith("key") and ", expected " in str(e)
    assert accepted == predicate(value), (schema, value)


def test_a_refusal_names_the_file_the_key_and_what_was_expected():
    schema = Fields({"rope_scaling": Nullable(Fields({"rope_type": Str()}))})
    with pytest.raises(UserError) as e:
        check({"rope_scaling": {"rope_type": 3}}, schema, "'/m/config.json'", "fetch it again")
    assert str(e.value) == ("'/m/config.json': rope_scaling.rope_type is 3 (an integer), expected a string; "
                            "fetch it again")
    with pytest.raises(UserError, match=r"n_layer is missing, expected a positive integer"):
        check({}, Fields({"n_layer": Int(1)}, required=("n_layer",)), "f")


BASE = dict(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8)
KINDS = {"vocab_size": "size", "block_size": "size", "n_layer": "size", "n_head": "size", "d_model": "size",
         "n_kv_head": "size", "mlp_hidden": "size", "bias": "bool", "tie_embeddings": "bool", "rope_theta": "positive",
         "dropout": "fraction", "norm_eps": "eps", "mlp": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm"),
         "pos": ("rope", "learned"), "attn_impl": ("manual", "sdpa")}


def well_typed(key: str, v) -> bool:
    kind = KINDS[key]
    if isinstance(kind, tuple):
        return type(v) is str and v in kind
    return {"size": is_int(v) and v >= 1, "bool": type(v) is bool, "positive": is_number(v) and v > 0,
            "fraction": is_number(v) and 0 <= v < 1, "eps": is_number(v) and 0 < v < 1}[kind]


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(KINDS)), value=json_values | st.sampled_from(["gelu", "rope", "sdpa", "rmsnorm"]))
def test_model_config_takes_a_value_only_of_its_fields_type_and_range(key, value):
    """What a checkpoint's config.json holds becomes a ModelConfig: a bool is no size, 16.0 is no size, inf is
    no rope_theta. Constraints between fields (d_model divisible by n_head, ...) may refuse well-typed values."""
    try:
        ModelConfig(**{**BASE, key: value})
        accepted = True
    except ValueError:
        accepted = False
    if accepted:
        assert well_typed(key, value) or (value is None and key in ("n_kv_head", "mlp_hidden", "norm_eps")), \
            (key, value)
    elif well_typed(key, value):  # refused for a reason across fields: d_model % n_head, n_head % n_kv_head
        assert key in ("n_head", "n_kv_head", "d_model"), (key, value)


def test_every_model_config_field_is_covered_by_the_property():
    assert set(KINDS) == {f.name for f in dataclasses.fields(ModelConfig)}


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

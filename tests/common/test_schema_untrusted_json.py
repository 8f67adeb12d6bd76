"""The rules every reader of a file from elsewhere applies to the values in it (common/schema.py, ModelConfig): each
value's type and range -- checked against independent predicates over random values (hypothesis), so that the rule,
not a list of cases, is what is tested. The size bound and the strict JSON before it: tests/common/test_json_file.py."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from common.schema import AnyOf, Bool, DictOf, Fields, Float, Int, Invalid, ListOf, Nullable, Str, check
from model.config import ModelConfig

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

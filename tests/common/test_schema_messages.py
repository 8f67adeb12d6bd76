"""common/schema.py's messages, written out: each rule's words for what it expects, where in a document the
value sits (a field, a list item, an object's value), and how the value is shown (its JSON type, cut at 40
characters). A config or a file's refusal is these words, so each is checked as the user reads it."""
from __future__ import annotations

import pytest

from common.errors import UserError
from common.schema import AnyOf, Bool, DictOf, Fields, Float, Int, Invalid, ListOf, Nullable, Str, check, range_text, show


@pytest.mark.parametrize("rule, words", [
    (Int(), "an integer"), (Int(0), "an integer >= 0"), (Int(1), "a positive integer"), (Int(2), "an integer >= 2"),
    (Int(high=5), "an integer <= 5"), (Int(1, 8), "an integer from 1 to 8"),
    (Float(), "a finite number"), (Float(low=0, below=1), "a finite number >= 0 and < 1"),
    (Float(above=0, high=2.5), "a finite number > 0 and <= 2.5"),
    (Bool(), "true or false"), (Str(), "a string"), (Str(("a", "b")), "one of 'a', 'b'"),
    (Nullable(Str()), "a string or null"), (AnyOf(Int(1)), "a positive integer"),
    (AnyOf(Int(1), Str(("auto",))), "a positive integer or one of 'auto'"),
    (AnyOf(Bool(), Int(), Str()), "true or false, an integer or a string"),
    (ListOf(Int(1)), "a list (each item a positive integer)"), (ListOf(Bool(), 3), "a list of 3 (each item true or false)"),
    (DictOf(Str()), "an object (each value a string)"), (Fields({}), "an object")])
def test_each_rule_says_what_it_expects(rule, words):
    assert rule.describe() == words
    value = 1j  # a complex number is nothing any rule accepts
    with pytest.raises(UserError) as e:
        check(value, rule, "'f.json'")
    assert str(e.value) == f"'f.json': the document is 1j (complex), expected {words}"


@pytest.mark.parametrize("value, shown", [
    (True, "True (a boolean)"), (3, "3 (an integer)"), (2.5, "2.5 (a number)"), ("s", "'s' (a string)"),
    ([1], "[1] (a list)"), ({"a": 1}, "{'a': 1} (an object)"), (None, "null"), (b"x", "b'x' (bytes)"),
    ("x" * 38, f"'{'x' * 38}' (a string)"),  # a repr of 40 characters is shown whole
    ("x" * 39, f"'{'x' * 36}... (a string)")])  # one more: its first 37 and '...'
def test_a_value_is_shown_short_with_its_json_type(value, shown):
    assert show(value) == shown


def test_a_refusal_names_where_the_value_is_and_the_value_itself():
    schema = Fields({"sizes": ListOf(Int(1)), "flag": Bool(), "table": DictOf(Float(low=0)), "name": Str()},
                    required=("name",))
    cases = [({"name": "n", "sizes": [1, 2, 0]}, "sizes[2] is 0 (an integer), expected a positive integer"),
             ({"name": "n", "flag": "yes"}, "flag is 'yes' (a string), expected true or false"),
             ({"name": "n", "table": {"k": -1.0}}, "table['k'] is -1.0 (a number), expected a finite number >= 0"),
             ({"sizes": [1]}, "name is missing, expected a string"),
             ({"name": "n", "sizes": "12"}, "sizes is '12' (a string), expected a list (each item a positive integer)")]
    for value, message in cases:
        with pytest.raises(UserError) as e:
            check(value, schema, "where", "the fix")
        assert str(e.value) == f"where: {message}; the fix"
    with pytest.raises(Invalid) as e:
        Fields({"inner": Fields({"x": Bool()})}).check({"inner": {"x": 1}}, "outer")
    assert e.value.key == "outer.inner.x" and str(e.value) == "outer.inner.x is 1 (an integer), expected true or false"
    with pytest.raises(Invalid) as e:
        Fields({"x": Int()}, required=("x",)).check({}, "top")
    assert e.value.key == "top.x" and str(e.value) == "top.x is missing, expected an integer"


@pytest.mark.parametrize("rule, text", [(Int(high=5), "<= 5"), (Int(3), ">= 3"), (Float(high=1), "<= 1"),
                                        (Float(below=1), "< 1"), (Float(low=0.5, high=1), "in [0.5, 1]"),
                                        (Float(above=0, below=2), "in (0, 2)")])
def test_one_sided_and_closed_ranges_are_said_with_their_own_signs(rule, text):
    assert range_text(rule) == text

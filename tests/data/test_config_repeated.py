"""data/config.py's rules for the repeated source's settings (data/repeated.py makes the text): unset ones take their
defaults, bad values are one line, they belong to that source only, and the rules accept exactly the settings an
independent predicate accepts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.config_io import from_dict
from common.errors import UserError
from data.config import DataConfig, REPEATED_DEFAULTS
from data.repeated import MAX_ALPHABET_SIZE, MAX_REPEATED_CHARS
from tests.data.test_repeated import repeated_config


def test_unset_settings_take_their_defaults():
    cfg = repeated_config()
    assert {name: getattr(cfg, name) for name in REPEATED_DEFAULTS} == REPEATED_DEFAULTS
    assert repeated_config(sequence_length=7).length_range() == (7, 7)


@pytest.mark.parametrize("raw, fragments", [
    ({"alphabet_size": 0}, ["alphabet_size must be from 1 to 20000, got 0"]),
    ({"alphabet_size": MAX_ALPHABET_SIZE + 1}, ["alphabet_size"]),
    ({"alphabet_size": "64"}, ["'data.alphabet_size' got '64'"]),
    ({"sequence_length": [5]}, ["sequence_length must be one length or a list [min, max] of two"]),
    ({"sequence_length": [9, 4]}, ["1 <= min <= max", "[9, 4]"]),
    ({"sequence_length": 0}, ["sequence_length"]),
    ({"sequence_length": [2.5, 4]}, ["'data.sequence_length' got [2.5, 4]"]),
    ({"num_sequences": 0}, ["num_sequences must be at least 1"]),
    ({"num_sequences": MAX_REPEATED_CHARS}, ["more than 100,000,000 characters", "lower num_sequences"]),
    ({"seed": -1}, ["seed must be an integer from 0"]),
    ({"seed": True}, ["'data.seed' got True"]),
])
def test_bad_repeated_settings_are_one_clear_line(raw, fragments):
    with pytest.raises(UserError) as info:
        repeated_config(**raw)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("name, value", [("alphabet_size", 10), ("sequence_length", 4), ("num_sequences", 5),
                                         ("seed", 1)])
def test_repeated_settings_belong_to_the_repeated_source(name, value):
    with pytest.raises(UserError, match=f"{name} is only used with source 'repeated', not 'tinyshakespeare'"):
        from_dict(DataConfig, {name: value}, "data.")


@settings(max_examples=100, deadline=None)
@given(size=st.integers(-5, MAX_ALPHABET_SIZE + 5), low=st.integers(-3, 40), high=st.integers(-3, 40),
       n=st.integers(-3, 10**7))
def test_the_rules_decide_exactly_which_settings_are_accepted(size, low, high, n):
    ok = 1 <= size <= MAX_ALPHABET_SIZE and 1 <= low <= high and n >= 1 and n * (2 * high + 1) <= MAX_REPEATED_CHARS
    try:
        repeated_config(alphabet_size=size, sequence_length=[low, high], num_sequences=n)
    except UserError as e:
        assert not ok and "\n" not in str(e)
    else:
        assert ok

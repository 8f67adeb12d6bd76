"""The config sections' ranges as data (common/config_io.py check_ranges, common/schema.py range_text): a value is
refused exactly when it lies outside its rule's bounds, with one line naming the setting, its value and the
range; a null always passes. Checked on generated rules and values against a plain comparison of the bounds."""
from __future__ import annotations

import math
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.config_io import check_ranges
from common.schema import Float, Int, range_text
from training.config import AttnConfig, EvalConfig, TrainConfig, WandbConfig

bounds = st.one_of(st.none(), st.integers(-5, 5))


@settings(max_examples=300, derandomize=True)
@given(low=bounds, high=bounds, value=st.integers(-8, 8))
def test_an_integer_rule_refuses_exactly_the_values_outside_it(low, high, value):
    if low is None and high is None:
        low = 0
    rule = Int(low, high)
    inside = (low is None or value >= low) and (high is None or value <= high)
    section = types.SimpleNamespace(n=value)
    if inside:
        check_ranges(section, {"n": rule})
    else:
        with pytest.raises(ValueError) as e:
            check_ranges(section, {"n": rule})
        assert str(e.value) == f"n={value}: must be {range_text(rule)}"


@settings(max_examples=300, derandomize=True)
@given(low=bounds, above=bounds, high=bounds, below=bounds,
       value=st.one_of(st.floats(-8, 8), st.sampled_from([math.inf, -math.inf, math.nan])))
def test_a_number_rule_refuses_exactly_the_values_outside_it(low, above, high, below, value):
    low = None if above is not None else low  # one lower and one upper bound at most, as the sections state them
    high = None if below is not None else high
    if all(b is None for b in (low, above, high, below)):
        above = 0
    rule = Float(low=low, high=high, above=above, below=below)
    inside = math.isfinite(value) and (low is None or value >= low) and (above is None or value > above) and \
        (high is None or value <= high) and (below is None or value < below)
    section = types.SimpleNamespace(x=value)
    if inside:
        check_ranges(section, {"x": (rule, " (unit)")})
    else:
        with pytest.raises(ValueError) as e:
            check_ranges(section, {"x": (rule, " (unit)")})
        assert str(e.value) == f"x={value}: must be {range_text(rule)} (unit)"
    check_ranges(types.SimpleNamespace(x=None), {"x": rule})  # a null passes


@pytest.mark.parametrize("rule, text", [(Int(1), ">= 1"), (Int(0), ">= 0"), (Int(1, 1024), "from 1 to 1024"),
                                        (Float(above=0), "> 0"), (Float(low=0), ">= 0"),
                                        (Float(low=0, below=1), "in [0, 1)"), (Float(above=0, high=1), "in (0, 1]"),
                                        (Float(above=0, high=3600), "in (0, 3600]")])
def test_the_range_texts_the_sections_print(rule, text):
    assert range_text(rule) == text


@pytest.mark.parametrize("cls", [TrainConfig, EvalConfig, WandbConfig, AttnConfig])
def test_every_range_a_section_states_names_one_of_its_settings_and_passes_its_default(cls):
    fields = set(cls.__dataclass_fields__)
    assert cls.RANGES and set(cls.RANGES) <= fields
    check_ranges(cls(), cls.RANGES)  # the defaults are in range
    for name, rule in cls.RANGES.items():
        rule = rule[0] if isinstance(rule, tuple) else rule
        low = rule.low if rule.low is not None else getattr(rule, "above", None)
        if low is None:
            continue
        with pytest.raises(ValueError, match=rf"^{name}="):  # just below the lower bound: refused by that section
            cls(**{name: low - 1 if isinstance(rule, Int) else low - 0.5})

"""What a JSON document must hold, as data: each value's type and range, checked before anything is built from it.

    Int(low, high)           an integer (a bool is not one, nor is 16.0: `is_int`); within [low, high]
    Float(low, high, above, below)  a finite number (an integer is fine, a bool is not); above/below: open bounds
    Bool(), Str(choices)     true/false; a string (one of `choices` when given)
    Nullable(s)              null, or what s accepts
    AnyOf(s1, s2, ...)       what one of them accepts
    ListOf(s, length)        a list of what s accepts (exactly `length` items when given)
    DictOf(s)                an object of any keys, every value what s accepts
    Fields({key: s}, required)  an object whose listed keys hold what their schema accepts; other keys are
                             left alone (a Hugging Face config.json has dozens attngpt never reads)

    check(value, schema, where, fix)   raise UserError "<where>: <key> is <value>, expected <what>; <fix>" on
                                  the first value that breaks the schema; key is dotted ("rope_scaling.rope_type",
                                  "added_tokens[3].id")
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common.errors import UserError


class Invalid(ValueError):
    """A value that breaks its schema: `key` says where, `expected` what was wanted."""

    def __init__(self, key: str, value: Any, expected: str, missing: bool = False) -> None:
        what = "is missing" if missing else f"is {show(value)}"
        super().__init__(f"{key or 'the document'} {what}, expected {expected}")
        self.key = key


def is_int(value: Any) -> bool:
    """An integer: Python counts a bool as one, a config or a JSON file does not (nor 16.0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float: not a bool (Python counts one as an int), not inf or NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def show(value: Any) -> str:
    """A value as a message shows it: short, with its JSON type."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)
    if value is None:
        return kind
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({kind})"


def _at(key: str, part: str | int) -> str:
    return f"{key}[{part}]" if isinstance(part, int) else (f"{key}.{part}" if key else part)


class Schema:
    def check(self, value: Any, key: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def check_fields(record: Any, rules: dict[str, "Schema | tuple[Schema, str]"]) -> None:
    """Each field of `record` (a config dataclass) that `rules` names, by its rule: a Schema, or (Schema, the
    words a message says it in; by default the rule's own describe()). The first field that breaks its rule
    raises ValueError "name=value: must be <words>", which a config's reader turns into one line naming the
    section. Config sections and model configs (model/config.py, common/config_io.py: check_ranges) are checked
    by the same rule objects as untrusted JSON."""
    for name, rule in rules.items():
        rule, words = rule if isinstance(rule, tuple) else (rule, rule.describe())
        value = getattr(record, name)
        try:
            rule.check(value, name)
        except Invalid:
            raise ValueError(f"{name}={value!r}: must be {words}") from None


@dataclass(frozen=True)
class Int(Schema):
    low: int | None = None
    high: int | None = None

    def check(self, value: Any, key: str) -> None:
        if not is_int(value) or (self.low is not None and value < self.low) or \
                (self.high is not None and value > self.high):
            raise Invalid(key, value, self.describe())

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"an integer from {self.low} to {self.high}"
        if self.low is not None:
            return {0: "an integer >= 0", 1: "a positive integer"}.get(self.low, f"an integer >= {self.low}")
        return "an integer" if self.high is None else f"an integer <= {self.high}"


@dataclass(frozen=True)
class Float(Schema):
    low: float | None = None  # closed bounds
    high: float | None = None
    above: float | None = None  # open bounds
    below: float | None = None

    def check(self, value: Any, key: str) -> None:
        ok = is_number(value) and \
            (self.low is None or value >= self.low) and (self.high is None or value <= self.high) and \
            (self.above is None or value > self.above) and (self.below is None or value < self.below)
        if not ok:
            raise Invalid(key, value, self.describe())

    def describe(self) -> str:
        bounds = [f"{sign} {bound}" for sign, bound in ((">=", self.low), (">", self.above), ("<=", self.high),
                                                         ("<", self.below)) if bound is not None]
        return "a finite number" + (f" {' and '.join(bounds)}" if bounds else "")


def range_text(rule: Int | Float) -> str:
    """The bounds of a number rule as a config message says them: '>= 1', '> 0', 'in [0, 1)', 'from 1 to 8'."""
    if isinstance(rule, Int):
        if rule.low is not None and rule.high is not None:
            return f"from {rule.low} to {rule.high}"
        return f">= {rule.low}" if rule.low is not None else f"<= {rule.high}"
    lower = (f"[{rule.low:g}", ">=", rule.low) if rule.low is not None else \
        (f"({rule.above:g}", ">", rule.above) if rule.above is not None else None
    upper = (f"{rule.high:g}]", "<=", rule.high) if rule.high is not None else \
        (f"{rule.below:g})", "<", rule.below) if rule.below is not None else None
    if lower and upper:
        return f"in {lower[0]}, {upper[0]}"
    sign, bound = (lower or upper)[1:]
    return f"{sign} {bound:g}"


@dataclass(frozen=True)
class Bool(Schema):
    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, bool):
            raise Invalid(key, value, self.describe())

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Str(Schema):
    choices: tuple[str, ...] | None = None

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
            raise Invalid(key, value, self.describe())

    def describe(self) -> str:
        return "a string" if self.choices is None else f"one of {', '.join(map(repr, self.choices))}"


@dataclass(frozen=True)
class Nullable(Schema):
    inner: Schema

    def check(self, value: Any, key: str) -> None:
        if value is not None:
            try:
                self.inner.check(value, key)
            except Invalid as e:
                if e.key != key:  # deeper inside: that message says more
                    raise
                raise Invalid(key, value, self.describe()) from None

    def describe(self) -> str:
        return f"{self.inner.describe()} or null"


@dataclass(frozen=True)
class AnyOf(Schema):
    options: tuple[Schema, ...]

    def __init__(self, *options: Schema) -> None:
        object.__setattr__(self, "options", options)

    def check(self, value: Any, key: str) -> None:
        for option in self.options:
            try:
                option.check(value, key)
                return
            except Invalid:
                continue
        raise Invalid(key, value, self.describe())

    def describe(self) -> str:
        names = [o.describe() for o in self.options]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class ListOf(Schema):
    item: Schema
    length: int | None = None

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            raise Invalid(key, value, self.describe())
        for i, item in enumerate(value):
            self.item.check(item, _at(key, i))

    def describe(self) -> str:
        count = f" of {self.length}" if self.length is not None else ""
        return f"a list{count} (each item {self.item.describe()})"


@dataclass(frozen=True)
class DictOf(Schema):
    value: Schema

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(key, value, self.describe())
        for name, item in value.items():
            self.value.check(item, f"{key}[{name!r}]")

    def describe(self) -> str:
        return f"an object (each value {self.value.describe()})"


@dataclass(frozen=True)
class Fields(Schema):
    fields: dict[str, Schema]
    required: tuple[str, ...] = field(default=())

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(key, value, self.describe())
        for name in self.required:
            if name not in value:
                raise Invalid(_at(key, name), None, self.fields[name].describe(), missing=True)
        for name, schema in self.fields.items():
            if name in value:
                schema.check(value[name], _at(key, name))

    def describe(self) -> str:
        return "an object"


def check(value: Any, schema: Schema, where: str, fix: str = "") -> None:
    """UserError '<where>: <key> is <value>, expected <what>[; <fix>]' for the first value that breaks `schema`."""
    try:
        schema.check(value, "")
    except Invalid as e:
        raise UserError(f"{where}: {e}{'; ' + fix if fix else ''}") from None

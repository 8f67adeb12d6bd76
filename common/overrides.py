"""Dotted `key=value` overrides of a config, read as their key's type says.

What an override's text means (`parse_override`), by the type of its key:
- YAML's spellings of nothing -- an empty value, `null`, `Null`, `NULL`, `~` -- are null, for every key (an
  optional string such as `attn.probe_text=null` is then None; a required one is refused as null);
- any other value of a key that takes a string (`str`, a choice of strings) is the literal text, as the shell
  passed it: `out_dir=runs/exp #2` is out_dir "runs/exp #2", quotes and spaces included. Except where the key
  also takes another type the text spells in YAML: a list (`data.path=[a.txt, b.txt]`, text starting with `[`),
  or true/false (`train.compile=true`);
- a key of another type (numbers, booleans, lists, null, sections) is read as YAML, which is refused, naming the
  key, when YAML would drop or change part of the text: a comment (`#...`) or a line break inside a value
  (which YAML folds into a space);
- a key the schema does not know keeps its literal text: it is refused by name when the config is built.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import yaml

from common.config_io import DuplicateKeyError, UniqueKeyLoader, check_shape, parse_yaml
from common.errors import UserError

NULL_TEXTS = ("", "null", "Null", "NULL", "~")  # YAML's spellings of null


def parse_override(text: str, schema: type | None = None) -> tuple[list[str], Any]:
    """'train.max_iters=200' -> (['train', 'max_iters'], 200): the value as its key's type in the dataclass
    `schema` reads it (module doc); schema None: every value is read as YAML."""
    if "=" not in text:
        raise UserError(f"override '{text}' must look like section.key=value, e.g. train.max_iters=200")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise UserError(f"override '{text}' has an empty key: write section.key=value, e.g. train.max_iters=200")
    path = key.split(".")
    if raw.strip() in NULL_TEXTS:
        return path, None
    annotation = annotation_at(schema, path) if schema is not None else Any
    if annotation is None:  # not a key of the schema: from_dict names it (and the closest valid one)
        return path, raw
    accepted = _accepted_kinds(annotation)
    if "str" in accepted:
        if "list" in accepted and raw.lstrip().startswith("["):
            value = _yaml_value(key, raw)
            return path, value if isinstance(value, list) else raw
        if "bool" in accepted:
            value = _yaml_value(key, raw)
            return path, value if isinstance(value, bool) else raw
        return path, raw
    return path, _yaml_value(key, raw)


def annotation_at(schema: type, path: list[str]) -> Any:
    """The annotation of the dotted key `path` in dataclass `schema` (a section's dataclass for a section),
    or None when the key is not one of it."""
    node: Any = schema
    for part in path:
        if not dataclasses.is_dataclass(node):
            return None
        fields = {f.name: f for f in dataclasses.fields(node) if f.init}
        if part not in fields:
            return None
        node = typing.get_type_hints(node)[part]
    return node


def _accepted_kinds(annotation: Any) -> set[str]:
    """Which kinds of value `annotation` takes: str, bool, int, float, list, mapping, any."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(_accepted_kinds(a) for a in typing.get_args(annotation) if a is not type(None)))
    if origin is typing.Literal:
        return {type(c).__name__ for c in typing.get_args(annotation)}
    if origin is list:
        return {"list"}
    if origin is dict or dataclasses.is_dataclass(annotation):
        return {"mapping"}
    if annotation is Any:
        return {"any"}
    return {getattr(annotation, "__name__", str(annotation))}


def _yaml_value(key: str, raw: str) -> Any:
    """`raw` read as YAML, refusing (UserError naming the key) a value of which YAML would drop or change part:
    a comment, or a line break inside a scalar (folded into a space). Text that is not YAML stays the literal
    string (the type check then says what the key wants)."""
    try:
        node = yaml.compose(raw, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        _check_lossless(key, raw, node)
        value = parse_yaml(raw)
    except UserError:
        raise
    except DuplicateKeyError as e:
        raise UserError(f"override '{key}': {e}") from None
    except (yaml.YAMLError, RecursionError):  # RecursionError: brackets nested thousands deep
        value = raw
    check_shape(value, f"the value of override '{key}'")
    return value


def _check_lossless(key: str, raw: str, root: yaml.Node | None) -> None:
    """Refuse a YAML value whose reading would lose part of its text (see _yaml_value)."""
    spans: list[tuple[int, int]] = []
    stack, seen = ([root] if root is not None else []), set()
    while stack:
        node = stack.pop()
        if id(node) in seen:  # an alias: the same node again (maybe inside itself, `&a [*a]`)
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            start, end = node.start_mark.index, node.end_mark.index
            spans.append((start, end))
            if "\n" in raw[start:end].rstrip("\n") and node.style != "|":
                raise UserError(f"override '{key}': its value has a line break inside {raw[start:end][:40]!r}, "
                                f"which YAML would fold into a space: give the value on one line")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(child for pair in node.value for child in pair)
    for i, char in enumerate(raw):
        if char == "#" and not any(start <= i < end for start, end in spans):
            raise UserError(f"override '{key}': its value holds a YAML comment ({raw[i:][:40]!r}), which YAML "
                            f"would drop: remove it, or quote the text that holds the '#'")


def apply_overrides(raw: dict[str, Any], overrides: list[str], schema: type | None = None) -> dict[str, Any]:
    """Set each dotted key in a copy of the nested mapping (sections are created when missing); each value is
    read as its key's type in the dataclass `schema` (parse_override)."""
    out = _deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text, schema)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"override '{text}': '{part}' is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d

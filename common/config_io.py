"""YAML configs mapped onto dataclasses, with dotted `key=value` overrides.

Every value is checked against the dataclass field's annotation; an unknown key names itself and the
closest valid key; a wrong type says which key, what it got and what it wants. All of it raises
`UserError`, so a command line prints one line and exits 2.

What an override's text means, by the type of its key (`parse_override`; docs/bad_inputs.md has examples):
- YAML's spellings of nothing (NULL_TEXTS: empty, null, Null, NULL, ~) are null for every key (refused where required);
- a key that takes a string (`str`, a choice of strings) gets the literal text, as the shell passed it
  (`out_dir=runs/exp #2`), unless the text spells another type the key takes: a list (`[...]`) or true/false;
- a key of another type reads the text as YAML, refused, naming the key, when YAML would drop or change part
  of it: a comment (`#...`) or a line break inside a value (which YAML folds into a space);
- a key the schema does not know keeps its literal text: it is refused by name when the config is built.

Fields marked as paths (`field(metadata=PATH)`) have `~` expanded when the config is built, wherever the value
came from (common/paths.py: expand_path).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from common.errors import UserError
from common.path_kind import path_kind
from common.paths import expand_path
from common.schema import Float, Int, Nullable, check_fields, is_int, range_text

PATH = {"path": True}  # dataclass field metadata: the value is a path (or a list of paths): `~` is expanded


def check_ranges(section: Any, ranges: dict[str, Int | Float | tuple[Int | Float, str]]) -> None:
    """Each field of `section` that `ranges` names within its range: a common/schema.py number rule, or (rule,
    what a null or the unit means) whose text follows the range; a null passes (the annotation says whether one
    may be given). Else ValueError "name=value: must be <range>" (common/schema.py: check_fields)."""
    rules = {}
    for name, rule in ranges.items():
        rule, note = rule if isinstance(rule, tuple) else (rule, "")
        rules[name] = (Nullable(rule), f"{range_text(rule)}{note}")
    check_fields(section, rules)


def closest(name: str, choices: list[str], prefix: str = "") -> str:
    """' (did you mean 'prefix.x'?)' for the nearest valid name, else the list of valid names."""
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if match:
        return f" (did you mean '{prefix}{match[0]}'?)"
    return f" (valid keys: {', '.join(prefix + c for c in sorted(choices))})"


MAX_CONFIG_BYTES = 1_000_000  # a real config is a few kB; parsing 10 MB of YAML takes a minute


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (plain PyYAML keeps the last silently:
    a second `train:` section would replace the first). Merge keys (`<<: *base`) may still override."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(f"'{key}' is given twice in one mapping (lines {seen[key]} and {line}): "
                                        f"keep one of them")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping."""


def parse_yaml(text: str) -> Any:
    """yaml.safe_load, refusing duplicate keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing, oversized or unreadable file, a syntax error or a duplicate key is one line."""
    p = Path(expand_path(str(path), "the config file's path"))
    found = path_kind(p)  # a regular file, or a stream (<(cat ...), /dev/stdin) read up to the limit below
    if found.kind not in ("file", "stream"):
        says = "not found" if found.kind == "missing" else found.says
        in_it = " in it" if found.kind == "directory" else ""
        raise UserError(f"config file '{path}' {says}: pass the path to a YAML file{in_it}, e.g. configs/small.yaml")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise UserError(f"cannot read config file '{path}' ({e.strerror or e})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"config file '{path}' is larger than {MAX_CONFIG_BYTES // 1_000_000} MB (configs are a "
                        f"few kB): is it the right file?")
    try:
        loaded = parse_yaml(data.decode("utf-8"))
    except DuplicateKeyError as e:
        raise UserError(f"config file '{path}': {e}") from None
    except RecursionError:
        raise UserError(f"config file '{path}' nests lists or mappings too deeply to read") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"config file '{path}' is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"config file '{path}' is not UTF-8 text") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections (model:, data:, ...), "
                        f"not a {type(loaded).__name__}")
    check_shape(loaded, f"config file '{path}'")
    return loaded


MAX_DEPTH, MAX_VALUES = 64, 100_000  # far beyond any real config, far below what breaks recursion or memory


def check_shape(value: Any, what: str) -> None:
    """Refuse YAML that only aliases make possible: a list or mapping inside itself (`&a [*a]`), nesting
    deeper than MAX_DEPTH, or more than MAX_VALUES values once aliases are expanded. Iterative, so that
    checking cannot itself overflow the stack."""
    stack, count = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise UserError(f"{what} nests lists or mappings more than {MAX_DEPTH} deep (a YAML alias inside "
                            f"its own anchor, like &a [*a]?): no setting needs that")
        if count > MAX_VALUES:
            raise UserError(f"{what} holds more than {MAX_VALUES:,} values once its YAML aliases are expanded")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)


def from_dict(cls: type, raw: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a mapping, checking keys and value types recursively; `where` is the dotted
    prefix that messages put before a key ('train.'). A ValueError from the dataclass's __post_init__ becomes a
    UserError too."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise UserError(f"'{where.rstrip('.') or 'config'}' must be a mapping of keys, got {_show(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in raw.items():
        if not isinstance(key, str) or key not in fields:
            raise UserError(f"unknown config key '{where}{key}'{closest(str(key), list(fields), where)}")
        kwargs[key] = coerce(hints[key], value, f"{where}{key}")
        if fields[key].metadata.get("path"):
            kwargs[key] = _expanded(kwargs[key], f"{where}{key}")
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise UserError(f"invalid config in '{where.rstrip('.') or 'config'}': {e}") from None


def _expanded(value: Any, key: str) -> Any:
    """A path setting's value (a string or a list of strings) with `~` expanded."""
    if isinstance(value, str):
        return expand_path(value, f"'{key}'")
    if isinstance(value, list):
        return [expand_path(v, f"'{key}'") if isinstance(v, str) else v for v in value]
    return value


def coerce(annotation: Any, value: Any, key: str) -> Any:
    """Check (and gently convert: int -> float, '1e-3' -> float) `value` against a type annotation."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value, key + ".")
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in (o for o in options if o is not type(None)):
            try:
                return coerce(option, value, key)
            except UserError:
                pass
        raise UserError(f"'{key}' got {_show(value)}; expected {_type_name(annotation)}")
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        if value in choices:
            return value
        hint = closest(str(value), [str(c) for c in choices]) if isinstance(value, str) else ""
        raise UserError(f"'{key}' got {_show(value)}; expected one of {', '.join(map(repr, choices))}{hint}")
    if origin is list:
        (item_type,) = typing.get_args(annotation) or (Any,)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and item_type is not Any:
            value = [value]  # a single value where a list is expected: `layers=0` means [0]
        if not isinstance(value, list):
            raise UserError(f"'{key}' got {_show(value)}; expected a list")
        return [coerce(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"'{key}' got {_show(value)}; expected a mapping")
        return value
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"'{key}' got {_show(value)}; expected true or false")
    if annotation is int:
        if is_int(value):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"'{key}' got {_show(value)}; expected an integer")
    if annotation is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
        elif isinstance(value, str):  # YAML 1.1 reads '6e-4' as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise UserError(f"'{key}' got {_show(value)}; expected a number")
        if not math.isfinite(number):  # .nan / .inf / 1e999 would only surface later as a NaN loss
            raise UserError(f"'{key}' got {_show(value)}; expected a finite number")
        return number
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)  # a number where text is expected (`name: 2024`) is its text
        raise UserError(f"'{key}' got {_show(value)}; expected a string")
    raise TypeError(f"config_io cannot check annotation {annotation!r} of '{key}'")  # a bug, not user input


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain dicts/lists (for JSON and YAML dumps)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def _show(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _type_name(annotation: Any) -> str:
    """A union in words: `bool | Literal["auto"]` -> "true, false or 'auto'"."""
    names = []
    for option in typing.get_args(annotation):
        if option is type(None):
            names.append("null")
        elif typing.get_origin(option) is list:
            names.append("a list")
        elif option is bool:
            names += ["true", "false"]
        elif typing.get_origin(option) is typing.Literal:
            names += [repr(c) for c in typing.get_args(option)]
        else:
            names.append(getattr(option, "__name__", str(option)))
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


# --- dotted overrides ---------------------------------------------------------------------------------------

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
    if "str" not in accepted:
        return path, _yaml_value(key, raw)
    # text, unless it spells in YAML the other type the key takes: a list ([...]) or true/false
    other = list if "list" in accepted and raw.lstrip().startswith("[") else bool if "bool" in accepted else None
    value = _yaml_value(key, raw) if other else raw
    return path, value if other and isinstance(value, other) else raw


def annotation_at(schema: type, path: list[str]) -> Any:
    """The annotation of the dotted key `path` in dataclass `schema` (a section's: its dataclass), or None if none."""
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

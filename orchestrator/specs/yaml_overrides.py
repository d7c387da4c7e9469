"""YAML files and ``--set key=value`` overrides (dotted keys reach into nested mappings).

Numbers are read as YAML 1.2's core schema reads them, in files and in ``--set`` alike: ``1e-3``, ``3E-4``, ``1e5``,
``-2.5e-4`` and ``.5`` are floats (PyYAML's YAML 1.1 rules read a float without a dot as a string), ``42`` is an int,
and ``1_000``, ``0b101`` or ``1:30`` are strings. Booleans and null keep PyYAML's rules."""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from orchestrator.errors import UserError

INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2.2, 10.3.2 "Tag Resolution" of the core schema; ints are tried first ("1" matches both).
INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
FLOAT_12 = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _core_schema_numbers(cls):
    """``cls`` (a SafeLoader or SafeDumper subclass) with PyYAML's int and float resolvers replaced by YAML 1.2's."""
    cls.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (INT_TAG, FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    cls.add_implicit_resolver(INT_TAG, INT_12, list("-+0123456789"))
    cls.add_implicit_resolver(FLOAT_TAG, FLOAT_12, list("-+0123456789."))
    return cls


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 int: decimal (``010`` is ten, not YAML 1.1's octal eight), ``0o`` octal or ``0x`` hexadecimal."""
    text = loader.construct_scalar(node)
    try:
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text)
    except ValueError:  # an explicit ``!!int`` on something else
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not an int", node.start_mark) from None


@_core_schema_numbers
class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2's numbers that refuses a key given twice in one mapping (plain PyYAML keeps
    the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first}); keep one", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(INT_TAG, _construct_int)


class QuotingDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes every string YAML 1.1 or 1.2 would read as a number (``"1e-3"``,
    ``"1_000"``), so that a saved spec reads back as it was with `UniqueKeyLoader` and with plain PyYAML."""


QuotingDumper.add_implicit_resolver(INT_TAG, INT_12, list("-+0123456789"))
QuotingDumper.add_implicit_resolver(FLOAT_TAG, FLOAT_12, list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    """``data`` as YAML that `parse_yaml` reads back unchanged (keys in their order)."""
    return yaml.dump(data, Dumper=QuotingDumper, sort_keys=False)


def parse_yaml(text: str, source: str, *, allow_empty: bool = True) -> dict:
    """The mapping of a YAML document, loaded with `UniqueKeyLoader`; one UserError line for anything else."""
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{source}:{where} is not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if data is None and allow_empty:
        return {}
    if data is None:
        raise UserError(f"{source}: the file is empty; give at least the keys you mean (see examples/)")
    if not isinstance(data, dict):
        raise UserError(f"{source}: top level must be a mapping of keys to values")
    return data


def load_yaml(path: str, *, allow_empty: bool = True) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file; pass a YAML config (see examples/)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    return parse_yaml(text, path, allow_empty=allow_empty)


def apply_overrides(data: dict, assignments: list[str]) -> dict:
    """``["lr=3e-4", "fixed.max_steps=50"]`` -> a new dict; values parsed as YAML scalars."""
    out = _deepcopy(data)
    for a in assignments or []:
        if "=" not in a:
            raise UserError(f"--set {a!r}: expected key=value")
        key, raw = a.split("=", 1)
        try:
            value: Any = yaml.load(raw, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        if not all(parts):
            raise UserError(f"--set {a!r}: empty key name; expected key=value or section.key=value")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {a!r}: {p!r} is not a mapping")
        node[parts[-1]] = value
    return out


def _deepcopy(d):
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d

"""YAML files and ``--set key=value`` overrides (dotted keys reach into nested mappings)."""

from __future__ import annotations

import os
from typing import Any

import yaml

from orchestrator.errors import UserError


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain PyYAML keeps the last silently)."""

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

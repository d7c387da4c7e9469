"""YAML files and ``--set key=value`` overrides (dotted keys reach into nested mappings)."""

from __future__ import annotations

import os
from typing import Any

import yaml


class UserError(ValueError):
    """A user mistake: the CLI prints its one-line message and exits with code 2."""


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file; pass a YAML config (see examples/)")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{where} is not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a mapping of keys to values")
    return data


def apply_overrides(data: dict, assignments: list[str]) -> dict:
    """``["lr=3e-4", "fixed.max_steps=50"]`` -> a new dict; values parsed as YAML scalars."""
    out = _deepcopy(data)
    for a in assignments or []:
        if "=" not in a:
            raise UserError(f"--set {a!r}: expected key=value")
        key, raw = a.split("=", 1)
        try:
            value: Any = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
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

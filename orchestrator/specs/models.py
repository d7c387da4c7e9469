"""The base of the typed spec models (pydantic 2): types, ranges and unknown keys checked by the model, every
mistake turned into the project's one UserError line.

A model's fields carry their fix in ``json_schema_extra={"fix": ...}`` (the words after the key: ``must be an integer
>= 1``); a field error reads ``<where>.<key> <fix>, got <value>``, an unknown key ``unknown key <where>.<key>; valid
keys[ of <where>]: [...]``, and a cross-field rule raises `rule` (its message is the line as written). Strict: YAML
already reads numbers (orchestrator.specs.yaml_overrides), so a string is never taken for a number here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from orchestrator.errors import UserError

RULE = "spec_rule"


class SpecModel(BaseModel):
    """A spec section: strict types, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def field(default: Any = ..., *, fix: str, **kw: Any) -> Any:
    """A model field whose error line is ``<key> <fix>, got <value>``."""
    return Field(default, description=kw.pop("description", fix), json_schema_extra={"fix": fix}, **kw)


def rule(message: str) -> PydanticCustomError:
    """A cross-field rule's error (raise it in a validator): the line is ``message`` as written."""
    return PydanticCustomError(RULE, message)


def validate(model: type[SpecModel], data: Any, where: str, *, scoped: bool = False, **context: Any) -> Any:
    """``model`` validated from ``data`` (a section at ``where``), or one UserError line. ``scoped``: an unknown key's
    line names its section (``valid keys of <where>``)."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        raise UserError(one_line(model, data, where, e.errors()[0], scoped=scoped)) from None


def one_line(model: type[SpecModel], data: Any, where: str, err: dict, *, scoped: bool = False) -> str:
    """The first error of a ValidationError in the project's wording."""
    if err["type"] == RULE:
        return err["msg"]
    loc = list(err["loc"])
    path = [where] if where else []
    while loc and isinstance(data, dict) and isinstance(loc[0], str) and loc[0] in model.model_fields:
        name = loc.pop(0)
        sub = model.model_fields[name].annotation
        path.append(name)
        if not (isinstance(sub, type) and issubclass(sub, SpecModel)) or not loc:
            value = data.get(name, model.model_fields[name].default)
            fix = (model.model_fields[name].json_schema_extra or {}).get("fix", "has a wrong value")
            return f"{'.'.join(path)} {fix}, got {value!r}"
        model, data = sub, data.get(name)
    key = ".".join([*path, str(loc[0])]) if loc else ".".join(path)
    if err["type"] == "extra_forbidden":
        scope = f" of {'.'.join(path)}" if scoped and path else ""
        return f"unknown key {key}; valid keys{scope}: {list(model.model_fields)}"
    return f"{key or 'spec'}: {err['msg']}"

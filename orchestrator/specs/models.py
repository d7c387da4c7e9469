"""The base of the typed spec models (pydantic 2): types, ranges and unknown keys checked by the model, every
mistake turned into the project's one UserError line.

A model's fields carry their fix as their description (the words after the key, ``must be an integer >= 1``, also
what an editor shows from the JSON Schema). A field error reads ``<where>.<key> <fix>, got <value>``; an unknown key
``unknown key <where>.<key>; valid keys[ of <where>]: [...]``; a cross-field rule raises `rule` (its message is the
line as written). Strict: YAML already reads numbers (orchestrator.specs.yaml_overrides), so a string is never taken
for a number here."""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from analysis.core.bcrit_error import did_you_mean
from orchestrator.errors import UserError

RULE = "spec_rule"


class SpecModel(BaseModel):
    """A spec section: strict types, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        """A section given as null is the section left out."""
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or not _is_section(cls, k)}


def required(*keys: str) -> ConfigDict:
    """A model's config whose JSON Schema requires ``keys``: keys the spec parser checks (a value of Any type in the
    model, so that its message is the parser's), required all the same."""
    return ConfigDict(**SpecModel.model_config, json_schema_extra={"required": list(keys)})


def field(default: Any = ..., *, fix: str, **kw: Any) -> Any:
    """A model field whose error line is ``<key> <fix>, got <value>``."""
    return Field(default, description=fix, **kw)


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
        path.append(name)
        info = model.model_fields[name]
        value = data.get(name, None if info.is_required() else info.default)  # a missing key: None
        layers, sub = _layers(info.annotation)
        for layer in layers if sub is not None else ():  # into list items ([i]) and mapping values (.key)
            if not loc or not isinstance(value, (list, dict)):
                break
            if layer == "list" and isinstance(value, list) and isinstance(loc[0], int) and loc[0] < len(value):
                path[-1] += f"[{loc[0]}]"
                value = value[loc.pop(0)]
            elif layer == "dict" and isinstance(value, dict) and str(loc[0]) in map(str, value):
                key = str(loc.pop(0))
                path.append(key)
                value = next(v for k, v in value.items() if str(k) == key)
            else:
                break
        if sub is not None and not loc and err["type"] == "missing":
            return f"missing section '{'.'.join(path)}'; see examples/tiny.yaml"
        if sub is None or not loc or not isinstance(value, dict):
            if sub is not None and not loc and err["type"] == "model_type":
                return f"{'.'.join(path)} must be a mapping of keys to values"
            fix = info.description or "has a wrong value"
            return f"{'.'.join(path)} {fix}, got {value!r}"
        model, data = sub, value
    key = ".".join([*path, str(loc[0])]) if loc else ".".join(path)
    if err["type"] == "extra_forbidden":
        scope = f" of {'.'.join(path)}" if scoped and path else ""
        hint = did_you_mean([str(loc[0])], model.model_fields)
        return f"unknown key {key}{hint}; valid keys{scope}: {list(model.model_fields)}"
    if err["type"] in ("model_type", "dict_type"):
        return f"{key or 'spec'} must be a mapping of keys to values"
    return f"{key or 'spec'}: {err['msg']}"


def _is_section(model: type[SpecModel], key: str) -> bool:
    """Whether ``key`` of ``model`` is a section (a SpecModel itself, not in a list or a mapping)."""
    info = model.model_fields.get(key)
    layers, sub = _layers(info.annotation) if info is not None else ([], None)
    return sub is not None and not layers


def _layers(annotation: Any) -> tuple[list[str], type[SpecModel] | None]:
    """The containers (``list``, ``dict``) around the SpecModel an annotation holds, and that model (None: none):
    ``Goal | None`` -> ([], Goal); ``dict[int, list[SplitModel]]`` -> (["dict", "list"], SplitModel)."""
    if isinstance(annotation, type) and issubclass(annotation, SpecModel):
        return [], annotation
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _layers(args[0])
    if origin in (list, dict):
        inner, model = _layers(args[-1])
        return [origin.__name__, *inner], model
    for arg in args:  # a union
        layers, model = _layers(arg)
        if model is not None:
            return layers, model
    return [], None

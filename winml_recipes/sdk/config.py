"""Typed pass configs: a frozen dataclass is the one definition of a pass's options.

`config_schema(Config)` derives the JSON Schema the recipe schema composes in (types,
defaults, enums from `Literal`, bounds and descriptions from `field(metadata=...)` or
`Annotated[T, Schema(...)]`, nested dataclasses as closed objects), and `build_config(Config,
options)` turns options the schema accepted into the config object a pass receives.

Conventions: a field without a default is required; a field typed `T | None` with the
default None is optional and absent from the schema's defaults (None means "not given":
a preset or the library decides); any other default is the schema's `default`. A dataclass
may add object-level keywords (e.g. oneOf) in a `schema_extra` class variable.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from winml_recipes.sdk.errors import PlanError

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


class Schema:
    """JSON Schema keywords for a type inside a container: `Annotated[int, Schema(minimum=1)]`."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __repr__(self) -> str:
        return f"Schema({self.keywords!r})"


def option(default: Any = dataclasses.MISSING, description: str = "", **schema: Any) -> Any:
    """A config field with its description and JSON Schema bounds (minimum, maximum, ...)."""
    metadata = schema | ({"description": description} if description else {})
    if isinstance(default, list | dict | set):
        raise TypeError("mutable defaults: use a tuple (or None)")
    return dataclasses.field(default=default, metadata=metadata)


def config_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of config dataclass `cls` (a fresh copy each call)."""
    import copy

    return copy.deepcopy(_object_schema(cls))


@cache
def _object_schema(cls: type) -> dict[str, Any]:
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls, include_extras=True)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        optional = _is_optional(hint)
        schema = _type_schema(_strip_none(hint) if optional else hint)
        schema.update(f.metadata)
        if f.default is not dataclasses.MISSING:
            if f.default is not None:
                schema["default"] = _json_value(f.default)
            elif not optional:
                raise TypeError(f"{cls.__name__}.{f.name}: default None needs `T | None`")
        elif f.default_factory is not dataclasses.MISSING:
            schema["default"] = _json_value(f.default_factory())
        else:
            required.append(f.name)
        props[f.name] = schema
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = required
    out["properties"] = props
    out.update(getattr(cls, "schema_extra", {}))
    return out


def _type_schema(hint: Any) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        schema = _type_schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, Schema):
                schema.update(extra.keywords)
        return schema
    if hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (tuple, list) or origin is Sequence:
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"{hint}: use tuple[T, ...]")
        return {"type": "array", "items": _type_schema(args[0])}
    if origin in (dict, Mapping) or origin is typing.Mapping:
        if args[0] is not str:
            raise TypeError(f"{hint}: JSON object keys are strings")
        return {"type": "object", "additionalProperties": _type_schema(args[1])}
    if origin in (Union, types.UnionType):
        if type(None) in args:
            raise TypeError(f"{hint}: None is only allowed as `T | None = None`")
        return {"anyOf": [_type_schema(a) for a in args]}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return dict(_object_schema(hint))
    raise TypeError(f"no JSON Schema for {hint!r}")


def _is_optional(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def _strip_none(hint: Any) -> Any:
    rest = tuple(a for a in get_args(hint) if a is not type(None))
    return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (a runtime union)


def _json_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {k: _json_value(v) for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


# ------------------------------------------------------------------------ building


def build_config(cls: type, options: Mapping[str, Any] | None, where: str = "") -> Any:
    """The config object for `options` (already validated against `config_schema(cls)`:
    this converts, it checks only what it must to convert, e.g. unknown keys)."""
    return _build(cls, dict(options or {}), where or cls.__name__)


def _build(cls: type, options: Mapping[str, Any], where: str) -> Any:
    hints = get_type_hints(cls, include_extras=True)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise PlanError(
            f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    values = {k: _convert(hints[k], v, f"{where}.{k}") for k, v in options.items()}
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise PlanError(f"{where}: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        return _convert(args[0], value, where)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        candidates = [a for a in args if a is not type(None)]
        for a in candidates:
            if _fits(a, value):
                return _convert(a, value, where)
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise PlanError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _build(hint, value, where)
    if origin in (tuple, list) or origin is Sequence:
        return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or origin is typing.Mapping:
        return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    return value  # numbers stay as written (250 is a valid float; messages show 250)


def _fits(hint: Any, value: Any) -> bool:
    """Whether `value` has the JSON shape of `hint` (to pick a union member)."""
    origin = get_origin(hint)
    if origin is typing.Annotated:
        return _fits(get_args(hint)[0], value)
    if dataclasses.is_dataclass(hint) or origin in (dict, Mapping) or origin is typing.Mapping:
        return isinstance(value, Mapping)
    if origin in (tuple, list) or origin is Sequence:
        return isinstance(value, list | tuple)
    if origin is Literal:
        return value in get_args(hint)
    if hint in _SCALARS:
        if hint is float:
            return isinstance(value, int | float) and not isinstance(value, bool)
        if hint is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, hint)
    return True

"""Safe YAML loading that remembers line numbers, and JSON Schema errors as FILE:LINE lines."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jsonschema
import yaml

from winml_recipes.sdk.errors import WinmlError

JsonPath = tuple[str | int, ...]


@dataclass
class LoadedYaml:
    data: Any
    lines: dict[JsonPath, int]  # value path -> 1-based line
    key_lines: dict[JsonPath, int]  # mapping key path -> line of the key itself
    text: str = ""


# A recipe or catalog entry has a few thousand nodes at most; more means an alias bomb
# ("billion laughs") that would hang validation.
MAX_NODES = 100_000
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_yaml(text: str, filename: str, error: type[WinmlError]) -> LoadedYaml:
    """Parse with the safe loader; a syntax error becomes `FILE:LINE: message`.

    Duplicate keys and non-string keys are errors (PyYAML silently keeps the last of two
    equal keys, and `1:` would become an int key that never matches a name).
    """
    lines: dict[JsonPath, int] = {}
    key_lines: dict[JsonPath, int] = {}
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            # Walked before construction: constructing flattens `<<` merges into the
            # mapping, and a key that overrides a merged one (as YAML allows) would then
            # look like a duplicate.
            if node is not None:
                try:
                    problem = _walk(node, (), lines, key_lines, [0])
                except RecursionError:
                    problem = (1, "nested too deeply (hundreds of levels)")
                if problem is not None:
                    line, message = problem
                    raise error(message, where=f"{filename}:{line}")
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except RecursionError:
        raise error(
            "invalid YAML: nested too deeply (hundreds of levels)", where=f"{filename}:1"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"invalid YAML: {problem}", where=f"{filename}:{line}") from None
    return LoadedYaml(data, lines, key_lines, text)


def _walk(
    node: yaml.Node, path: JsonPath, lines: dict, key_lines: dict, count: list[int]
) -> tuple[int, str] | None:
    """Record lines; return (line, message) for the first structural problem found."""
    count[0] += 1
    if count[0] > MAX_NODES:
        return (
            node.start_mark.line + 1,
            f"{json_path(path)}: more than {MAX_NODES} values after expanding YAML aliases; "
            "is an alias (*name) repeated recursively?",
        )
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                return line, (
                    f"{json_path(path)}: key {shown} is not a string; quote it ('{shown}')"
                )
            if key_node.value in seen:
                return line, (
                    f"{json_path(path)}: duplicate key '{key_node.value}' "
                    f"(first at line {seen[key_node.value]})"
                )
            seen[key_node.value] = line
            child = (*path, key_node.value)
            key_lines.setdefault(child, line)
            problem = _walk(value_node, child, lines, key_lines, count)
            if problem is not None:
                return problem
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problem = _walk(item, (*path, i), lines, key_lines, count)
            if problem is not None:
                return problem
    return None


def json_path(path: Iterable[str | int]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _line_for(loaded: LoadedYaml, path: JsonPath, prefer_key: bool = False) -> int:
    if prefer_key and path in loaded.key_lines:
        return loaded.key_lines[path]
    while path and path not in loaded.lines:
        path = path[:-1]
    return loaded.lines.get(path, 1)


def _is_finite_number(checker: Any, instance: Any) -> bool:
    """JSON Schema's `number`, without YAML's .nan and .inf (JSON has no such numbers)."""
    number = jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number")
    return number and (not isinstance(instance, float) or math.isfinite(instance))


# The validator every recipe, catalog entry and config is checked with: `type: number`
# means a finite one, so no NaN/Infinity reaches a budget, a threshold or the manifest.
FiniteValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _is_finite_number),
)


def _is_nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _message(err: jsonschema.ValidationError) -> tuple[str, JsonPath, bool]:
    """A readable message, the path it belongs to, and whether to point at a key."""
    path: JsonPath = tuple(err.absolute_path)
    if _is_nonfinite(err.instance):
        return f"{err.instance} is not a finite number; give a finite value", path, False
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = list(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed]
        key = str(extra[0]) if extra else "?"
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        known = f"; allowed: {', '.join(allowed)}" if not close and allowed else ""
        return f"unknown key '{key}'{hint}{known}", (*path, key), True
    if err.validator == "enum" and isinstance(err.instance, str):
        options = [str(v) for v in err.validator_value]
        close = difflib.get_close_matches(err.instance, options, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return (
            f"unknown value '{err.instance}'{hint}; expected one of: {', '.join(options)}",
            (path),
            False,
        )
    if err.validator == "required":
        return err.message.replace("is a required property", "is required"), path, False
    return err.message, path, False


def validate(loaded: LoadedYaml, schema: dict, filename: str, error: type[WinmlError]) -> None:
    """Validate against a JSON Schema; raise the first error as `FILE:LINE: path: message`."""
    validator = FiniteValidator(schema)
    errors = sorted(validator.iter_errors(loaded.data), key=_error_order)
    if not errors:
        return
    err = _deepest(errors[0])
    message, path, prefer_key = _message(err)
    line = _line_for(loaded, path, prefer_key)
    shown = path[:-1] if prefer_key else path
    raise error(f"{json_path(shown)}: {message}", where=f"{filename}:{line}")


def first_schema_error(data: object, schema: dict) -> str | None:
    """The first error of `data` against `schema` as `$.path: message` (None: valid), for
    JSON read from outside (a build folder's manifest)."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=_error_order)
    if not errors:
        return None
    message, path, prefer_key = _message(_deepest(errors[0]))
    return f"{json_path(path[:-1] if prefer_key else path)}: {message}"


def _error_order(err: jsonschema.ValidationError) -> tuple:
    return (tuple(str(p) for p in err.absolute_path), err.validator != "additionalProperties")


def _deepest(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For combinators (anyOf/oneOf), report the most specific sub-error."""
    if err.context:
        # A non-finite number is the cause wherever it sits (not the branch it missed).
        nonfinite = [e for e in err.context if _is_nonfinite(e.instance)]
        if nonfinite:
            return _deepest(nonfinite[0])
        # A value of the right type that breaks a bound says more than "not a string" from
        # the branch it was never meant for (0 in [int >= 1 | name]).
        right_type = [e for e in err.context if e.validator != "type"]
        return _deepest(jsonschema.exceptions.best_match(right_type or err.context))
    return err

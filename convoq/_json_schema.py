"""Checking a JSON value against a JSON schema: the part of JSON Schema that structured
outputs use (the keywords OpenAI's strict mode accepts, and what pydantic emits).

A schema with a keyword outside that part, or one Draft 2020-12's metaschema refuses, is
refused when it is given (:func:`check_schema`), so no constraint is ever silently left
unchecked. Values are checked by ``jsonschema`` (:func:`errors_of`), with ``pattern`` on
pydantic-core's linear-time regex engine instead of Python's backtracking one.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from pydantic import StringConstraints, TypeAdapter, ValidationError
from pydantic_core import SchemaError

from convoq.errors import InvalidOutputTypeError

# Words that describe and never constrain: skipped when checking a value.
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment",
     "deprecated", "readOnly", "writeOnly", "format", "$defs", "definitions",
     "discriminator"}
)  # fmt: skip
_CHECKED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems",
     "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
     "pattern"}
)  # fmt: skip
# Annotations whose values the metaschema would judge; they hold no subschema.
_DESCRIBING = _ANNOTATIONS - {"$defs", "definitions"}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
}
_MAX_DEPTH = 64


def check_schema(schema: Any, path: str = "#", depth: int = 0) -> None:
    """Refuse a schema this module cannot check in full (the keyword and place named), or
    nested deeper than it checks values."""
    if depth > _MAX_DEPTH:
        raise InvalidOutputTypeError(
            f"the JSON schema is nested deeper than {_MAX_DEPTH} at {path[:200]}"
        )
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidOutputTypeError(f"the JSON schema at {path} is not an object")
    unknown = sorted(set(schema) - _ANNOTATIONS - _CHECKED)
    if unknown:
        raise InvalidOutputTypeError(
            f"the JSON schema at {path} uses {unknown}, which convoq does not check; use"
            f" only {sorted(_CHECKED)} (or a pydantic model as output_type)",
            keywords=unknown,
        )
    kinds = schema.get("type", [])
    for kind in (
        [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else [kinds]
    ):
        if kind not in _TYPES:
            raise InvalidOutputTypeError(f"the JSON schema at {path} has an unknown type {kind!r}")
    ref = schema.get("$ref")
    if ref is not None and not _is_local_ref(ref):
        raise InvalidOutputTypeError(
            f"the JSON schema at {path} refers to {ref!r}; only '#/$defs/NAME' is supported"
        )
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise InvalidOutputTypeError(
                f"the JSON schema at {path} has a pattern that is no string"
            )
        _pattern(schema["pattern"], path)
    for key, sub in _subschemas(schema):
        check_schema(sub, f"{path}/{key}", depth + 1)
    if depth == 0:
        _check_against_the_metaschema(schema)


def _check_against_the_metaschema(schema: Any) -> None:
    """Refuse a value a keyword cannot take (``"minLength": "five"``), as Draft 2020-12's
    metaschema says, naming where."""
    try:
        text = json.dumps(_constraints(schema), sort_keys=True)
    except (TypeError, ValueError):
        raise InvalidOutputTypeError("the JSON schema is not JSON") from None
    problem = _metaschema_problem(text)
    if problem is not None:
        raise InvalidOutputTypeError(problem)


@functools.lru_cache(maxsize=256)
def _metaschema_problem(text: str) -> str | None:
    # Cached by the schema's text: checking against the metaschema costs milliseconds, and
    # a worker sees the same few output schemas turn after turn.
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped, unused-ignore]

    try:
        _validator_class().check_schema(json.loads(text))
    except SchemaError as exc:
        where = "/".join(["#", *(str(part) for part in exc.path)])
        return f"the JSON schema at {where} is not a valid JSON schema: {exc.message[:200]}"
    return None


def _constraints(schema: Any) -> Any:
    """``schema`` without its annotations (a ``"description": null`` constrains nothing,
    and is skipped when values are checked as well)."""
    if not isinstance(schema, dict):
        return schema
    kept = {key: sub for key, sub in schema.items() if key not in _DESCRIBING}
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            kept[key] = {name: _constraints(sub) for name, sub in schema[key].items()}
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            kept[key] = [_constraints(sub) for sub in schema[key]]
    for key in ("items", "additionalProperties"):
        if key in schema:
            kept[key] = _constraints(schema[key])
    return kept


def _subschemas(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        found += [(f"{key}/{name}", sub) for name, sub in (schema.get(key) or {}).items()]
    for key in ("anyOf", "oneOf", "allOf"):
        found += [(f"{key}/{i}", sub) for i, sub in enumerate(schema.get(key) or [])]
    for key in ("items", "additionalProperties"):
        if key in schema:
            found.append((key, schema[key]))
    return found


@functools.lru_cache(maxsize=256)
def _pattern(pattern: Any, path: str = "#") -> TypeAdapter[str]:
    """A matcher for ``pattern`` on pydantic-core's regex engine, which runs in linear
    time: a pattern sent with a turn cannot stall a worker by backtracking."""
    if not isinstance(pattern, str):
        raise InvalidOutputTypeError(f"the JSON schema at {path} has a pattern that is no string")
    try:
        return TypeAdapter(Annotated[str, StringConstraints(pattern=pattern)])
    except (SchemaError, TypeError) as exc:
        raise InvalidOutputTypeError(
            f"the JSON schema at {path} has a pattern that cannot be used ({pattern!r}:"
            f" {str(exc).splitlines()[0][:200]}); lookarounds and backreferences are not"
            " supported"
        ) from None


def _is_local_ref(ref: Any) -> bool:
    return isinstance(ref, str) and (ref.startswith(("#/$defs/", "#/definitions/")))


def errors_of(value: Any, schema: dict[str, Any]) -> list[str]:
    """What is wrong with ``value`` against ``schema`` (checked by :func:`check_schema`),
    one line each with its place (``$.items[2].name``) and the reason; empty when it fits.
    The schema is enforced by ``jsonschema`` (Draft 2020-12), except ``pattern``, matched
    on a regex engine that runs in linear time."""
    from referencing.exceptions import Unresolvable

    found = [f"{at}: {number!r} is not a finite number" for at, number in _non_finite(value)]
    if found:  # not JSON: the keywords' arithmetic is not meant for it
        return found
    try:
        for error in _validator_class()(schema).iter_errors(value):
            found.append(_line(error))
    except Unresolvable as exc:
        found.append(f"the schema refers to {_ref_of(exc)!r}, which it does not define")
    except RecursionError:  # a recursive schema ($ref) and a value nested past the stack
        found.append("$: nested too deep to check")
    return found


def _line(error: Any) -> str:
    message = str(error.message)
    if error.validator in _BOUNDS:  # said by size (jsonschema's wording varies by release)
        unit = "chars" if isinstance(error.instance, str) else "items"
        side = "below" if error.validator.startswith("min") else "above"
        size = len(error.instance)
        message = f"{size} {unit}, {side} {error.validator} {error.validator_value!r}"
    elif error.validator == "const":
        message += f", got {error.instance!r}"
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return f"{error.json_path}: {message}"


# Keywords whose message does not name the bound itself.
_BOUNDS = frozenset({"minItems", "maxItems", "minLength", "maxLength"})
# An error names the value it is about: a huge one is cut.
_MAX_MESSAGE = 300


def _ref_of(exc: Any) -> str:
    ref = str(getattr(exc, "ref", "") or exc)
    return f"#{ref}" if ref.startswith("/") else ref  # a JSON pointer into this schema


@functools.cache
def _validator_class() -> Any:
    """Draft 2020-12 with ``pattern`` on the linear-time engine (imported on first use:
    most processes never check a dict schema)."""
    from jsonschema import Draft202012Validator, validators  # type: ignore[import-untyped, unused-ignore]
    from jsonschema.exceptions import ValidationError as Invalid  # type: ignore[import-untyped, unused-ignore]

    def pattern(validator: Any, wanted: str, instance: Any, schema: Any) -> Iterator[Any]:
        if not isinstance(instance, str):
            return
        try:
            _pattern(wanted).validate_python(instance)
        except ValidationError:
            yield Invalid(f"{instance!r} does not match {wanted!r}")

    return validators.extend(Draft202012Validator, {"pattern": pattern})


def _non_finite(value: Any, at: str = "$", depth: int = 0) -> Iterator[tuple[str, float]]:
    """NaN and infinities anywhere in ``value`` (JSON has none; Python's parser reads them)."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, float) and not math.isfinite(value):
        yield at, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _non_finite(item, f"{at}.{name}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{at}[{index}]", depth + 1)

"""Checking a JSON value against a JSON schema: the part of JSON Schema that structured
outputs use (the keywords OpenAI's strict mode accepts, and what pydantic emits).

A schema with a keyword outside that part is refused when it is given
(:func:`check_schema`), so no constraint is ever silently left unchecked.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
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
    one line each with its place (``$.items[2].name``); empty when it fits."""
    found: list[str] = []
    _Checker(schema, found).check(value, schema, "$", 0)
    return found


class _Checker:
    def __init__(self, root: dict[str, Any], found: list[str]) -> None:
        self.root = root
        self.found = found

    def check(self, value: Any, schema: Any, at: str, depth: int) -> None:
        if schema is True:
            return
        if schema is False or depth > _MAX_DEPTH:
            self.found.append(f"{at}: not allowed here" if schema is False else f"{at}: too deep")
            return
        if "$ref" in schema:
            self.check(value, self._resolve(schema["$ref"]), at, depth + 1)
        if not self._typed(value, schema, at):
            return
        self._choices(value, schema, at, depth)
        if isinstance(value, dict):
            self._object(value, schema, at, depth)
        elif isinstance(value, list):
            self._array(value, schema, at, depth)
        elif isinstance(value, str):
            self._string(value, schema, at)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self._number(value, schema, at)

    def _resolve(self, ref: str) -> Any:
        where, _, name = ref[2:].partition("/")
        target = (self.root.get(where) or {}).get(name)
        if target is None:
            self.found.append(f"the schema refers to {ref!r}, which it does not define")
            return True
        return target

    def _typed(self, value: Any, schema: dict[str, Any], at: str) -> bool:
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else list(kinds)
            if not any(_TYPES[k](value) for k in kinds):
                self.found.append(f"{at}: expected {' or '.join(kinds)}, got {_kind(value)}")
                return False
        if "enum" in schema and value not in schema["enum"]:
            self.found.append(f"{at}: {value!r} is not one of {schema['enum']!r}")
        if "const" in schema and value != schema["const"]:
            self.found.append(f"{at}: expected {schema['const']!r}, got {value!r}")
        return True

    def _choices(self, value: Any, schema: dict[str, Any], at: str, depth: int) -> None:
        for sub in schema.get("allOf") or []:
            self.check(value, sub, at, depth + 1)
        for key, wanted in (("anyOf", "at least one"), ("oneOf", "exactly one")):
            options = schema.get(key)
            if not options:
                continue
            fits = sum(1 for sub in options if not errors_of_in(value, sub, self.root))
            if fits == 0 or (key == "oneOf" and fits > 1):
                self.found.append(f"{at}: fits {fits} of the {key} choices, not {wanted}")

    def _object(self, value: dict[str, Any], schema: dict[str, Any], at: str, depth: int) -> None:
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                self.found.append(f"{at}: missing required property {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                self.check(item, properties[name], f"{at}.{name}", depth + 1)
            elif extra is False:
                self.found.append(f"{at}: property {name!r} is not allowed")
            else:
                self.check(item, extra, f"{at}.{name}", depth + 1)

    def _array(self, value: list[Any], schema: dict[str, Any], at: str, depth: int) -> None:
        self._bounds(len(value), schema, "minItems", "maxItems", f"{at}: {len(value)} items")
        if "items" in schema:
            for index, item in enumerate(value):
                self.check(item, schema["items"], f"{at}[{index}]", depth + 1)

    def _string(self, value: str, schema: dict[str, Any], at: str) -> None:
        self._bounds(len(value), schema, "minLength", "maxLength", f"{at}: {len(value)} chars")
        pattern = schema.get("pattern")
        if pattern is not None:
            try:
                _pattern(pattern).validate_python(value)
            except ValidationError:
                self.found.append(f"{at}: {value!r} does not match {pattern!r}")

    def _number(self, value: float, schema: dict[str, Any], at: str) -> None:
        if not math.isfinite(value):
            self.found.append(f"{at}: {value!r} is not a finite number")
            return
        self._bounds(value, schema, "minimum", "maximum", f"{at}: {value!r}")
        low, high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if low is not None and not value > low:
            self.found.append(f"{at}: {value!r} is not > {low!r}")
        if high is not None and not value < high:
            self.found.append(f"{at}: {value!r} is not < {high!r}")
        step = schema.get("multipleOf")
        if step and not float(value / step).is_integer():
            self.found.append(f"{at}: {value!r} is not a multiple of {step!r}")

    def _bounds(self, size: float, schema: dict[str, Any], low: str, high: str, what: str) -> None:
        if low in schema and size < schema[low]:
            self.found.append(f"{what}, below {low} {schema[low]!r}")
        if high in schema and size > schema[high]:
            self.found.append(f"{what}, above {high} {schema[high]!r}")


def errors_of_in(value: Any, schema: Any, root: dict[str, Any]) -> list[str]:
    """:func:`errors_of` for a part of ``root`` (its ``$ref`` resolve against the root)."""
    found: list[str] = []
    _Checker(root, found).check(value, schema, "$", 0)
    return found


def _kind(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__

"""The JSON schema check behind output schemas given as dicts (and checked on workers):
every keyword it accepts is enforced, and one it does not enforce is refused up front."""

from __future__ import annotations

from typing import Any

import pytest

from convoq._json_schema import check_schema, errors_of
from convoq.errors import InvalidOutputTypeError

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
        "score": {"type": "number", "multipleOf": 0.5, "maximum": 10, "exclusiveMinimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
        "kind": {"const": "person"},
        "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
        "one": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "both": {"allOf": [{"type": "string"}, {"maxLength": 2}]},
        "extra": {"type": "object", "additionalProperties": {"type": "boolean"}},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {
        "Pet": {"type": "object", "properties": {"legs": {"type": "integer"}}, "required": ["legs"]}
    },
}

GOOD: dict[str, Any] = {
    "name": "ada", "age": 36, "score": 9.5, "tags": ["a"], "kind": "person",
    "pet": {"legs": 4}, "one": 1.5, "both": "ok", "extra": {"x": True},
}  # fmt: skip


def test_a_fitting_value_has_no_errors() -> None:
    check_schema(SCHEMA)
    assert errors_of(GOOD, SCHEMA) == []
    assert errors_of({**GOOD, "pet": None, "age": 3.0}, SCHEMA) == []  # 3.0 is an integer


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": ""}, "$.name: 0 chars, below minLength 1"),
        ({"name": "abcdef"}, "$.name: 6 chars, above maxLength 5"),
        ({"name": "Ada"}, "$.name: 'Ada' does not match '^[a-z]+$'"),
        ({"age": -1}, "$.age: -1, below minimum 0"),
        ({"age": 150}, "$.age: 150 is not < 150"),
        ({"age": True}, "$.age: expected integer, got boolean"),
        ({"age": 1.5}, "$.age: expected integer, got number"),
        ({"score": 0}, "$.score: 0 is not > 0"),
        ({"score": 11}, "$.score: 11, above maximum 10"),
        ({"score": 1.25}, "$.score: 1.25 is not a multiple of 0.5"),
        ({"tags": []}, "$.tags: 0 items, below minItems 1"),
        ({"tags": ["a", "b", "a"]}, "$.tags: 3 items, above maxItems 2"),
        ({"tags": ["c"]}, "$.tags[0]: 'c' is not one of ['a', 'b']"),
        ({"kind": "robot"}, "$.kind: expected 'person', got 'robot'"),
        ({"pet": {"legs": "four"}}, "$.pet: fits 0 of the anyOf choices, not at least one"),
        ({"one": 1}, "$.one: fits 2 of the oneOf choices, not exactly one"),
        ({"both": "long"}, "$.both: 4 chars, above maxLength 2"),
        ({"extra": {"x": 1}}, "$.extra.x: expected boolean, got integer"),
        ({"surprise": 1}, "$: property 'surprise' is not allowed"),
    ],
)
def test_each_keyword_is_enforced(change: dict[str, Any], expected: str) -> None:
    assert expected in errors_of({**GOOD, **change}, SCHEMA)


def test_missing_properties_and_wrong_top_level_are_named() -> None:
    assert errors_of({"name": "ada"}, SCHEMA) == ["$: missing required property 'age'"]
    assert errors_of([], SCHEMA) == ["$: expected object, got array"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "if": {}},
        {"type": "object", "properties": {"a": {"uniqueItems": True}}},
        {"type": "object", "properties": {"a": {"type": ["string", "date"]}}},
        {"type": "object", "properties": {"a": {"pattern": "(a)\\1"}}},  # backreference
        {"type": "object", "properties": {"a": {"pattern": 5}}},
        {"type": "object", "properties": {"a": []}},
        {"$ref": "other.json#/x"},
    ],
)
def test_schemas_with_keywords_it_cannot_enforce_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidOutputTypeError):
        check_schema(schema)


def test_a_pattern_runs_in_linear_time() -> None:
    # Catastrophic for a backtracking engine; the check uses one that does not backtrack.
    schema = {"type": "string", "pattern": "^(a+)+$"}
    check_schema(schema)
    assert errors_of("a" * 5000 + "!", schema) != []

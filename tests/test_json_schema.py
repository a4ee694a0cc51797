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
        ({"age": -1}, "$.age: -1 is less than the minimum of 0"),
        ({"age": 150}, "$.age: 150 is greater than or equal to the maximum of 150"),
        ({"age": True}, "$.age: True is not of type 'integer'"),
        ({"age": 1.5}, "$.age: 1.5 is not of type 'integer'"),
        ({"score": 0}, "$.score: 0 is less than or equal to the minimum of 0"),
        ({"score": 11}, "$.score: 11 is greater than the maximum of 10"),
        ({"score": 1.25}, "$.score: 1.25 is not a multiple of 0.5"),
        ({"tags": []}, "$.tags: 0 items, below minItems 1"),
        ({"tags": ["a", "b", "a"]}, "$.tags: 3 items, above maxItems 2"),
        ({"tags": ["c"]}, "$.tags[0]: 'c' is not one of ['a', 'b']"),
        ({"kind": "robot"}, "$.kind: 'person' was expected, got 'robot'"),
        (
            {"pet": {"legs": "four"}},
            "$.pet: {'legs': 'four'} is not valid under any of the given schemas",
        ),
        (
            {"one": 1},
            "$.one: 1 is valid under each of {'type': 'number'}, {'type': 'integer'}",
        ),
        ({"both": "long"}, "$.both: 4 chars, above maxLength 2"),
        ({"extra": {"x": 1}}, "$.extra.x: 1 is not of type 'boolean'"),
        (
            {"surprise": 1},
            "$: Additional properties are not allowed ('surprise' was unexpected)",
        ),
    ],
)
def test_each_keyword_is_enforced(change: dict[str, Any], expected: str) -> None:
    assert expected in errors_of({**GOOD, **change}, SCHEMA)


def test_missing_properties_and_wrong_top_level_are_named() -> None:
    assert errors_of({"name": "ada"}, SCHEMA) == ["$: 'age' is a required property"]
    assert errors_of([], SCHEMA) == ["$: [] is not of type 'object'"]


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


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (
            {"type": "object", "properties": {"a": {"minLength": "five"}}},
            "#/properties/a/minLength",
        ),
        ({"type": "array", "items": {"maxItems": -1}}, "#/items/maxItems"),
        ({"type": "object", "required": "a"}, "#/required"),
        ({"enum": "abc"}, "#/enum"),
    ],
)
def test_a_keyword_with_a_value_it_cannot_take_is_refused_with_its_place(
    schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(InvalidOutputTypeError, match=f"at {where} is not a valid JSON schema"):
        check_schema(schema)


def test_numbers_json_cannot_carry_are_named() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5}}}
    assert errors_of({"x": float("nan")}, schema) == ["$.x: nan is not a finite number"]
    assert errors_of([1, float("inf")], {"type": "array"}) == ["$[1]: inf is not a finite number"]


def test_a_reference_to_a_missing_definition_is_named() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Gone"}}}
    check_schema(schema)
    assert errors_of({"a": 1}, schema) == [
        "the schema refers to '#/$defs/Gone', which it does not define"
    ]


def test_a_long_value_is_cut_in_its_message() -> None:
    (line,) = errors_of("x" * 5000, {"type": "string", "enum": ["a"]})
    assert line.startswith("$: 'xxx") and line.endswith("...") and len(line) < 320


def test_annotations_are_not_judged_by_the_metaschema() -> None:
    """They constrain nothing and are skipped when values are checked; a generator that
    writes ``"description": null`` is not refused for it."""
    schema = {
        "type": "object",
        "title": None,
        "properties": {"title": {"type": "string", "description": None}},
        "$defs": {"X": {"type": "integer", "examples": "not a list"}},
    }
    check_schema(schema)
    assert errors_of({"title": 1}, schema) == ["$.title: 1 is not of type 'string'"]


def test_a_value_nested_past_what_can_be_checked_is_an_error_not_a_crash() -> None:
    nested = {"type": "array", "items": {"$ref": "#/$defs/N"}}
    schema = {"$ref": "#/$defs/N", "$defs": {"N": nested}}
    check_schema(schema)
    value: list[Any] = []
    for _ in range(5000):
        value = [value]
    assert errors_of(value, schema) == ["$: nested too deep to check"]
    assert errors_of([[[]]], schema) == []

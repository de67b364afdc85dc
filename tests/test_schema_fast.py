"""The schema check's fast way (``mesh._schema_check``): it vouches for the values a caller
usually sends without jsonschema, and never answers other than jsonschema's way would."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, Field

import mesh._schema_check as schema_check
from mesh._schema_check import SchemaViolation, check


class Tier(StrEnum):
    A = "A"
    B = "B"


class Address(BaseModel):
    city: str = Field(min_length=1)
    zip: str = Field(pattern=r"^\d{6}$")


class Request(BaseModel):
    applicant_id: str = Field(pattern=r"^APP-\d+$")
    amount: float = Field(ge=1000, le=10_000_000, multiple_of=0.01)
    months: int = Field(default=12, ge=1, le=360)
    tier: Tier | None = None
    tags: list[str] = Field(default_factory=list, max_length=3)
    address: Address | None = None
    scores: list[int] = Field(default_factory=list)


REQUEST = Request.model_json_schema()
VALID = {"applicant_id": "APP-1", "amount": 250000.0}

CASES: list[tuple[dict[str, Any], Any]] = [
    (REQUEST, VALID),
    (REQUEST, {**VALID, "months": 12.0, "scores": [1.0, 2, 3.0]}),
    (REQUEST, {**VALID, "months": 12.5}),
    (REQUEST, {**VALID, "tier": "A", "tags": ["x"], "address": {"city": "Oslo", "zip": "123456"}}),
    (REQUEST, {**VALID, "tier": "C"}),
    (REQUEST, {**VALID, "tags": ["a", "b", "c", "d"]}),
    (REQUEST, {**VALID, "address": {"city": "", "zip": "12"}}),
    (REQUEST, {**VALID, "address": None, "tier": None}),
    (REQUEST, {**VALID, "amount": True}),
    (REQUEST, {**VALID, "amount": 0.3}),
    (REQUEST, {**VALID, "amount": 1000.005}),
    (REQUEST, {**VALID, "unknown": 1}),
    (REQUEST, {"amount": 5000}),
    (REQUEST, {**VALID, "applicant_id": "X-1"}),
    (REQUEST, [VALID]),
    # Not an object where "type": "object" has properties (its object step refuses it itself).
    (REQUEST, "x"),
    (REQUEST, None),
    ({"type": "object", "properties": {"a": {}}}, [1]),
    ({"type": "object", "required": ["a"]}, 3.0),
    ({"type": "object"}, 3),
    (REQUEST, {**VALID, "scores": (1, 2)}),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, 3.0),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, 3),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, None),
    ({"type": ["integer", "string"]}, 3.0),
    ({"type": ["integer", "number"]}, 3.0),
    ({"enum": [1.0, 2.0]}, 2),
    ({"enum": [1, 2]}, 2.0),
    ({"enum": [0, 1]}, False),
    ({"const": "x"}, "x"),
    ({"type": "number", "multipleOf": 0.1}, 0.3),
    ({"type": "string", "pattern": r"^\p{L}+$"}, "abc"),
    ({"type": "object", "additionalProperties": False, "properties": {"a": {}}}, {"a": 1}),
    ({"type": "object", "additionalProperties": False, "properties": {"a": {}}}, {"b": 1}),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"b": 1.0, "c": 2}),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"b": "x"}),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1}, []),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    ({"type": "integer", "minimum": 1, "exclusiveMaximum": 10}, 10),
    ({"type": "integer", "minimum": 1.0, "maximum": 9.0}, 9.0),
    ({"type": "string", "minLength": 2, "maxLength": 3, "format": "email"}, "abcd"),
]


def reference(value: Any, schema: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the check answers without its fast way: the value, or the violation's errors."""
    with monkeypatch.context() as patch:
        patch.setattr(schema_check, "_fast_check", lambda schema: None)
        patch.setattr(schema_check, "_cache", type(schema_check._cache)())
        try:
            return check(value, schema)
        except SchemaViolation as exc:
            return exc


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (3 is not 3.0 here)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(("schema", "value"), CASES)
def test_the_fast_way_answers_as_jsonschema_or_defers(
    schema: dict[str, Any], value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = reference(value, schema, monkeypatch)
    fast = schema_check._fast_check(schema)
    assert fast is not None, "every keyword here is one the fast way does"
    found = fast(value)
    if isinstance(expected, SchemaViolation):
        assert found is schema_check._SLOW, f"vouched for an invalid value: {found!r}"
        with pytest.raises(SchemaViolation) as info:
            check(value, schema)
        assert info.value.errors == expected.errors
        return
    if found is not schema_check._SLOW:
        assert same(found, expected)
        assert (found is value) == (expected is value)
    assert same(check(value, schema), expected)


@pytest.mark.parametrize(
    "value",
    [
        VALID,
        {**VALID, "months": 12.0, "scores": [1.0, 2]},
        {**VALID, "tier": "B", "address": {"city": "Oslo", "zip": "123456"}, "tags": []},
    ],
)
def test_a_valid_value_of_a_pydantic_schema_does_not_go_through_jsonschema(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("jsonschema was asked")

    check(VALID, REQUEST)  # compiled (and cached) before iter_errors is refused
    validator = schema_check._compiled(REQUEST)[0]
    monkeypatch.setattr(type(validator), "iter_errors", refuse)
    checked = check(value, REQUEST)
    assert checked["months"] == 12 if "months" in value else True
    assert all(type(s) is int for s in checked.get("scores", []))


def test_schemas_the_fast_way_does_not_do_still_get_checked() -> None:
    recursive = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    assert schema_check._fast_check(recursive) is None
    assert schema_check._fast_check({"type": "object", "not": {"required": ["a"]}}) is None
    with pytest.raises(SchemaViolation):
        check({"next": {"next": 1}}, recursive)
    with pytest.raises(SchemaViolation):
        check({"a": 1}, {"type": "object", "not": {"required": ["a"]}})


def test_a_fixed_schema_is_checked_as_its_content_says_and_a_bad_one_every_time() -> None:
    # ``fixed``: the compiled check is found by the schema object (a remote tool's schemas),
    # each object its own check; a schema that is no JSON Schema is refused at every call.
    needs_name = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    }
    needs_age = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    for _ in range(2):
        assert check({"name": "a"}, needs_name, fixed=True) == {"name": "a"}
        assert check({"age": 3.0}, needs_age, fixed=True) == {"age": 3}
        with pytest.raises(SchemaViolation, match="name"):
            check({"age": 3}, needs_name, fixed=True)
        with pytest.raises(SchemaViolation, match="age"):
            check({"name": "a"}, needs_age, fixed=True)
        with pytest.raises(SchemaViolation, match="not valid JSON Schema"):
            check({}, {"type": 12}, fixed=True)
    assert check({"name": "a"}, dict(needs_name), fixed=True) == {"name": "a"}

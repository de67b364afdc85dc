"""Checking remote arguments and results against skill schemas taken from a card."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, Field

from mesh.schema_check import SchemaViolation, check


class Tier(StrEnum):
    A = "A"
    B = "B"


class Address(BaseModel):
    city: str = Field(min_length=1)
    zip: str = Field(pattern=r"^\d{6}$")


class Request(BaseModel):
    applicant_id: str = Field(pattern=r"^APP-\d+$")
    amount: float = Field(ge=1000, le=10_000_000)
    months: int = Field(default=12, ge=1, le=360)
    tier: Tier | None = None
    tags: list[str] = Field(default_factory=list, max_length=3)
    address: Address | None = None


SCHEMA = Request.model_json_schema()


def problems(value: Any) -> dict[str, str]:
    with pytest.raises(SchemaViolation) as info:
        check(value, SCHEMA)
    return {e["field"]: e["message"] for e in info.value.errors}


def test_valid_value_passes_and_integral_floats_become_ints() -> None:
    value = check(
        {
            "applicant_id": "APP-501",
            "amount": 250000.0,
            "months": 36.0,
            "tier": "A",
            "address": {"city": "Pune", "zip": "411001"},
        },
        SCHEMA,
    )
    assert value["months"] == 36
    assert isinstance(value["months"], int)
    assert isinstance(value["amount"], float)
    # every value pydantic accepts, the checker accepts
    Request.model_validate(value)


def test_each_problem_names_its_field() -> None:
    found = problems(
        {
            "amount": "lots",
            "months": 2.5,
            "tier": "Z",
            "tags": ["a", "b", "c", "d"],
            "address": {"zip": "12"},
        }
    )
    assert found["applicant_id"] == "is required"
    assert "must be number" in found["amount"]
    assert "must be integer" in found["months"]
    assert "tier" in found
    assert "at most 3" in found["tags"]
    assert found["address.city"] == "is required"
    assert "must match" in found["address.zip"]


def test_bounds_and_patterns() -> None:
    found = problems({"applicant_id": "XYZ", "amount": 10, "months": 0})
    assert "must match" in found["applicant_id"]
    assert found["amount"] == "must be >= 1000"
    assert found["months"] == "must be >= 1"


def test_booleans_are_not_numbers_and_extra_fields_follow_the_schema() -> None:
    assert "must be number" in problems({"applicant_id": "APP-1", "amount": True})["amount"]
    closed = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": False,
    }
    with pytest.raises(SchemaViolation, match="b: is not an allowed field"):
        check({"a": "x", "b": 1}, closed)


def test_schema_numbers_may_be_floats_as_a_card_delivers_them() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3.0}}}
    with pytest.raises(SchemaViolation, match="at most 3 characters"):
        check({"s": "abcd"}, schema)

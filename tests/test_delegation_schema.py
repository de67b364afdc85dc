"""Checking remote arguments and results against skill schemas taken from a card."""

from __future__ import annotations

import threading
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, StringConstraints

from mesh._schema_check import SchemaViolation, check


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


# -- what jsonschema checks, and what mesh adds to it -----------------------------------------


class Line(BaseModel):
    qty: int
    labels: set[str] = Field(default_factory=set)


class Order(BaseModel):
    lines: list[Line]
    discount: int | None = None
    step: float = Field(default=0.3, multiple_of=0.1)
    limits: dict[Annotated[str, StringConstraints(pattern=r"^[a-z]+$")], int] = Field(
        default_factory=lambda: {"a": 1}, min_length=1
    )


ORDER = Order.model_json_schema()


def test_integral_floats_become_ints_wherever_the_schema_wants_integers() -> None:
    # What a data part delivers: every number a double, in lists, optionals and maps too.
    sent = {"lines": [{"qty": 2.0}, {"qty": 3}], "discount": 5.0, "limits": {"b": 7.0}}
    value = check(sent, ORDER)
    assert value == {"lines": [{"qty": 2}, {"qty": 3}], "discount": 5, "limits": {"b": 7}}
    assert [type(x["qty"]) for x in value["lines"]] == [int, int]
    assert type(value["discount"]) is int
    assert type(value["limits"]["b"]) is int
    assert type(sent["lines"][0]["qty"]) is float  # the caller's value is not changed
    Order.model_validate(value)


def test_an_integral_float_is_an_integer_wherever_the_schema_asks() -> None:
    # JSON Schema counts 3.0 as an integer, under "not" and "if" too (they were not checked).
    with pytest.raises(SchemaViolation, match="should not be valid"):
        check(3.0, {"not": {"type": "integer"}})
    schema = {"if": {"type": "integer"}, "then": {"minimum": 5}, "else": {"type": "string"}}
    with pytest.raises(SchemaViolation, match=r"\(value\): must be >= 5"):
        check(3.0, schema)
    assert check(7.0, schema) == 7


def test_every_keyword_pydantic_emits_is_checked() -> None:
    # minProperties and patternProperties (a dict with a length and constrained keys) were
    # not checked before: the call went out and came back REJECTED by the callee.
    with pytest.raises(SchemaViolation) as info:
        check({"lines": [], "limits": {}}, ORDER)
    assert info.value.errors == [{"field": "limits", "message": "must have at least 1 fields"}]
    with pytest.raises(SchemaViolation) as info:
        check({"lines": [], "limits": {"a": "x"}}, ORDER)
    assert info.value.errors == [{"field": "limits.a", "message": "must be integer, got a string"}]


def test_what_the_callee_accepts_the_caller_accepts() -> None:
    # pydantic makes a set of a list with repeats, allows float rounding in multiple_of, and
    # compiles patterns Python's re cannot (Rust's \p{L}).
    value = {"lines": [{"qty": 1, "labels": ["x", "x"]}], "step": 0.7}
    assert check(value, ORDER) == value
    Order.model_validate(value)
    with pytest.raises(SchemaViolation, match=r"step: must be a multiple of 0\.1"):
        check({"lines": [], "step": 0.75}, ORDER)
    assert check("Zoë", {"type": "string", "pattern": r"^\p{L}+$"}) == "Zoë"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "integer", "minimum": "ten"}, "not valid JSON Schema at minimum"),
        ({"type": "object", "required": "name"}, "not valid JSON Schema at required"),
        ({"$ref": "#/$defs/Missing"}, "schema reference '#/$defs/Missing' cannot be resolved"),
    ],
)
def test_a_broken_schema_from_a_card_is_a_violation_not_a_crash(
    schema: dict[str, Any], message: str
) -> None:
    # Before: TypeError from comparing 5 with "ten", a required list that is a string.
    with pytest.raises(SchemaViolation) as info:
        check(5, schema)
    assert [e["field"] for e in info.value.errors] == ["(schema)"]
    assert message in str(info.value)


def test_a_reference_to_a_url_is_never_fetched() -> None:
    # A peer's card must not make the caller fetch URLs: jsonschema's default registry would.
    hits: list[str] = []

    class Schema(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Schema) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
            with pytest.raises(SchemaViolation, match="cannot be resolved"):
                check("text", {"$ref": url})
        finally:
            server.shutdown()
            thread.join(timeout=5)
    assert hits == []


def test_a_value_nesting_deeper_than_python_can_follow_is_a_violation() -> None:
    schema = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    value: dict[str, Any] = {}
    for _ in range(5000):
        value = {"next": value}
    with pytest.raises(SchemaViolation, match=r"\(value\): nests too deeply to check"):
        check(value, schema)

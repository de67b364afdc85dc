"""Schemas read from a card are the ones the models declare: property order, integers; the
card carries the agent's tags; data comes back in the declared order."""

from __future__ import annotations

import json
from typing import Literal

from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, Field

from mesh import Agent, skill
from mesh._a2a.card import agent_tags, build_card, card_from_dict, card_to_dict, skill_schemas
from mesh._schema_order import ORDER_KEYWORD, order_like


class Address(BaseModel):
    street: str
    city: str = Field(min_length=1)
    zip_code: str | None = None


class Quote(BaseModel):
    zebra: int = Field(ge=1, le=10)
    apple: float = Field(gt=0.5, default=1.0)
    mango: list[Address] = Field(min_length=1)
    kind: Literal["a", "b"] = "a"
    billing: Address | None = None


@skill(tags=["fx"])
def quote(req: Quote) -> Quote:
    """Echo a quote."""
    return req


AGENT = Agent(name="quoter", skills=[quote], tags=("pricing", "demo"))


def _wire_card() -> dict[str, object]:
    """The card as another process reads it: the served JSON, parsed into the proto again."""
    served = json.loads(json.dumps(MessageToDict(build_card(AGENT, "http://127.0.0.1:1"))))
    return card_to_dict(card_from_dict(served))


def test_schemas_come_back_exactly_as_declared() -> None:
    declared = Quote.model_json_schema()
    schemas = skill_schemas(_wire_card())
    # Order-sensitive: the same JSON text, so key order and 1 (not 1.0) both count.
    assert json.dumps(schemas["quote"]["input"]) == json.dumps(declared)
    assert json.dumps(schemas["quote"]["output"]) == json.dumps(declared)
    assert list(schemas["quote"]) == ["input", "output"]


def test_the_card_itself_shows_declared_schemas() -> None:
    card = _wire_card()
    text = json.dumps(card)
    assert '"minLength": 1.0' not in text
    assert '"minLength": 1,' in text or '"minLength": 1}' in text
    # The order hint stays in card JSON, so a card stored and parsed again (the registry does)
    # still knows it; schemas read from it come without.
    assert ORDER_KEYWORD in text
    assert ORDER_KEYWORD not in json.dumps(skill_schemas(card))


def test_the_order_survives_any_number_of_round_trips() -> None:
    card = _wire_card()
    for _ in range(3):  # what the registry does: store card_to_dict, parse it again
        card = card_to_dict(card_from_dict(json.loads(json.dumps(card))))
    declared = json.dumps(Quote.model_json_schema())
    assert json.dumps(skill_schemas(card)["quote"]["input"]) == declared
    # What goes on the wire carries the order as a list, which a Struct keeps.
    wire = MessageToDict(build_card(AGENT, "http://127.0.0.1:1"))
    params = wire["capabilities"]["extensions"][0]["params"]
    assert params["skills"]["quote"]["input"][ORDER_KEYWORD] == [
        "zebra",
        "apple",
        "mango",
        "kind",
        "billing",
    ]


def test_agent_tags_are_in_the_card() -> None:
    assert agent_tags(_wire_card()) == ["pricing", "demo"]
    assert agent_tags(build_card(AGENT, "http://127.0.0.1:1")) == ["pricing", "demo"]
    assert agent_tags({"name": "not-mesh"}) == []


def test_data_is_ordered_like_its_schema() -> None:
    schema = Quote.model_json_schema()
    scrambled = {
        "kind": "a",
        "extra": True,
        "mango": [{"zip_code": None, "city": "Pune", "street": "MG Road"}],
        "billing": {"city": "Pune", "street": "x"},
        "apple": 2.0,
        "zebra": 3,
    }
    ordered = order_like(scrambled, schema)
    assert list(ordered) == ["zebra", "apple", "mango", "kind", "billing", "extra"]
    assert list(ordered["mango"][0]) == ["street", "city", "zip_code"]
    assert list(ordered["billing"]) == ["street", "city"]
    assert order_like([1, 2], schema) == [1, 2]
    assert order_like(scrambled, None) is scrambled

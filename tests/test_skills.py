"""``@skill``: ids as written, and unknown skill ids answered with the closest one."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from mesh import Agent, llm_skill, skill
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._errors import ConfigError, SkillInputError


class Pair(BaseModel):
    base: str
    quote: str


class Rate(BaseModel):
    rate: float


@skill
def fx_rate(req: Pair) -> Rate:
    """The exchange rate of a currency pair."""
    return Rate(rate=1.0)


@skill(id="convert-amount", name="Convert")
def convert(req: Pair) -> Rate:
    """Convert an amount."""
    return Rate(rate=2.0)


def test_the_id_is_the_function_name_as_written() -> None:
    # It used to become "fx-rate", so `mesh call ... --skill fx_rate` was refused.
    assert fx_rate.id == "fx_rate"
    assert fx_rate.name == "Fx rate"
    assert fx_rate.description == "The exchange rate of a currency pair."
    assert (convert.id, convert.name) == ("convert-amount", "Convert")


def test_the_function_name_resolves() -> None:
    dispatcher = SkillDispatcher(Agent(name="fx-desk", skills=[fx_rate, convert]))
    assert dispatcher.resolve("fx_rate", has_data=True, has_text=False) is fx_rate


@pytest.mark.parametrize(
    ("asked", "suggested"),
    [("fx-rate", "fx_rate"), ("fxrate", "fx_rate"), ("convert_amount", "convert-amount")],
)
def test_an_unknown_skill_suggests_the_closest_id(asked: str, suggested: str) -> None:
    dispatcher = SkillDispatcher(Agent(name="fx-desk", skills=[fx_rate, convert]))
    with pytest.raises(SkillInputError) as err:
        dispatcher.resolve(asked, has_data=True, has_text=False)
    assert str(err.value) == (
        f"unknown skill '{asked}'; did you mean '{suggested}'? fx-desk offers: "
        "convert-amount, fx_rate"
    )


def test_no_suggestion_when_nothing_is_close() -> None:
    dispatcher = SkillDispatcher(Agent(name="fx-desk", skills=[fx_rate, convert]))
    with pytest.raises(SkillInputError, match=r"^unknown skill 'weather'; fx-desk offers: "):
        dispatcher.resolve("weather", has_data=True, has_text=False)


def test_a_skill_stays_callable_like_the_function() -> None:
    assert fx_rate(Pair(base="USD", quote="INR")) == Rate(rate=1.0)
    summarize = llm_skill("summarize", input=Pair, output=Rate, description="d")
    with pytest.raises(ConfigError, match="answered by the agent's model"):
        summarize(Pair(base="USD", quote="INR"))

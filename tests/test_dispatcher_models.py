"""A skill's input and output go through pydantic's validator and serializer directly when its
models keep pydantic's own ``model_validate`` / ``model_dump`` (``mesh._a2a.dispatcher``'s
``_plain``): the values, and the errors, are those of the two methods; a model that overrides
either is called through it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    field_serializer,
    field_validator,
)

from mesh._a2a.dispatcher import SkillDispatcher, describe_validation
from mesh._agent import Agent
from mesh._errors import SkillInputError, SkillOutputError
from mesh._skills import skill


class Plain(BaseModel):
    name: str
    score: int
    when: datetime | None = None


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    full_name: str = Field(alias="fullName")
    tags: list[str] = []

    @field_validator("full_name")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip() + "!"

    @field_serializer("tags")
    def _upper(self, tags: list[str]) -> list[str]:
        return [tag.upper() for tag in tags]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def size(self) -> int:
        return len(self.tags)


CALLS: list[str] = []


class Overridden(BaseModel):
    score: int

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        CALLS.append("dump")
        return {**super().model_dump(**kwargs), "score": self.score + 1}

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Overridden:  # type: ignore[override]
        CALLS.append("validate")
        return super().model_validate(obj, **kwargs)


def _reference_output(model: type[BaseModel], value: Any) -> dict[str, Any]:
    """``validate_output`` as it was written before (the methods called)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return model.model_validate(value).model_dump(mode="json")


def _dispatcher(model: type[BaseModel]) -> tuple[SkillDispatcher, Any]:
    async def handler(req: model) -> model:  # type: ignore[valid-type]
        return req

    handler.__annotations__ = {"req": model, "return": model}
    made = skill(handler, id="s")
    return SkillDispatcher(Agent(name="a", description="d", skills=[made])), made


VALUES: list[tuple[type[BaseModel], Any]] = [
    (Plain, {"name": "n", "score": "7"}),
    (Plain, {"name": "n", "score": 3, "when": "2026-12-02T10:00:00Z"}),
    (Plain, Plain(name="x", score=1, when=datetime(2026, 1, 2, tzinfo=UTC))),
    (Aliased, {"fullName": " a ", "tags": ["x", "y"], "more": 1}),
    (Aliased, Aliased(full_name="b", tags=["z"])),
]


@pytest.mark.parametrize(("model", "value"), VALUES)
def test_output_is_what_the_methods_give(model: type[BaseModel], value: Any) -> None:
    dispatcher, made = _dispatcher(model)
    assert dispatcher.validate_output(made, value) == _reference_output(model, value)


@pytest.mark.parametrize(("model", "value"), VALUES)
def test_input_is_what_model_validate_gives(model: type[BaseModel], value: Any) -> None:
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    dispatcher, made = _dispatcher(model)
    got = dispatcher.validate_input(made, value)
    assert type(got) is model
    assert got == model.model_validate(value)


def test_a_plain_model_returned_as_another_models_instance() -> None:
    dispatcher, made = _dispatcher(Plain)
    value = Overridden(score=4)
    CALLS.clear()
    assert dispatcher.validate_output(made, {"name": "n", **value.model_dump()}) == {
        "name": "n",
        "score": 5,
        "when": None,
    }


def test_overrides_are_called() -> None:
    dispatcher, made = _dispatcher(Overridden)
    CALLS.clear()
    assert dispatcher.validate_output(made, Overridden(score=1)) == {"score": 3}
    assert CALLS == ["dump", "validate", "dump"]
    CALLS.clear()
    assert dispatcher.validate_input(made, {"score": 2}) == Overridden(score=2)
    assert CALLS == ["validate"]


def test_invalid_values_are_refused_with_the_same_words() -> None:
    dispatcher, made = _dispatcher(Plain)
    bad = {"name": "n", "score": "many"}
    with pytest.raises(ValidationError) as raw:
        Plain.model_validate(bad)
    words, errors = describe_validation(raw.value, made.input_schema())
    with pytest.raises(SkillOutputError) as out:
        dispatcher.validate_output(made, bad)
    assert str(out.value) == f"skill 's' produced invalid output: {words}"
    with pytest.raises(SkillInputError) as into:
        dispatcher.validate_input(made, bad)
    assert str(into.value) == f"invalid input for skill 's': {words}"
    assert into.value.errors == errors


def test_methods_replaced_after_a_first_call_are_called_from_then_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether a model keeps pydantic's own methods is decided on each call: a model_dump or
    model_validate assigned to the class after its first request is called on the next one,
    and pydantic's own path comes back once it is removed."""

    class Patched(BaseModel):
        k: str

    dispatcher, made = _dispatcher(Patched)
    assert dispatcher.validate_output(made, {"k": "v"}) == {"k": "v"}
    assert dispatcher.validate_input(made, {"k": "v"}) == Patched(k="v")

    def dump(self: BaseModel, **kwargs: Any) -> dict[str, Any]:
        return {"k": "patched-dump"}

    with monkeypatch.context() as patch:
        patch.setattr(Patched, "model_dump", dump, raising=False)
        assert dispatcher.validate_output(made, {"k": "v"}) == {"k": "patched-dump"}
    assert dispatcher.validate_output(made, {"k": "v"}) == {"k": "v"}

    def validate(cls: type[Patched], obj: Any, **kwargs: Any) -> Patched:
        return cls(k="patched-validate")

    with monkeypatch.context() as patch:
        patch.setattr(Patched, "model_validate", classmethod(validate), raising=False)
        assert dispatcher.validate_input(made, {"k": "v"}) == Patched(k="patched-validate")
    assert dispatcher.validate_input(made, {"k": "v"}) == Patched(k="v")

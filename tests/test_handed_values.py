"""The request's values handed from the gate's parse to the run (``fastpath_json.handed_values``,
``FastRoute`` keeps the parse in ``RAW_MESSAGE``): the skill's input validates exactly as the
values read back from the request's ``Struct`` did (numbers as floats, nested objects, unicode
keys, members' order where a model can see it), and the metadata reads the same."""

from __future__ import annotations

import json
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from google.protobuf.struct_pb2 import Value
from pydantic import BaseModel, ConfigDict, RootModel, model_validator

from mesh import Agent, skill
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.fastpath_json import (
    RAW_MESSAGE,
    UNREAD,
    handed_values,
    send_request,
    to_json,
)
from mesh._errors import SkillInputError

VALUES: list[Any] = [
    0,
    -1,
    25000,
    2**53 + 1,  # past a double's integers: the double the Value holds
    10**300,
    1.5,
    -0.0,
    1e-320,
    True,
    False,
    None,
    "",
    "ünïcødé \u2028 \U0001f600",
    [],
    {},
    [1, "a", None, [2, [3.5]], {"x": 1}],
    {"b": 1, "a": {"z": [1, {"y": 2}], "ü": None}, "é": [True]},
]


def _typed(value: Any) -> Any:
    """``value`` with each number's type in it (``1 == 1.0`` for ``==``)."""
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("raw", VALUES)
def test_handed_values_are_the_values_read_back_but_for_order(raw: Any) -> None:
    request = send_request({"message": {"messageId": "m", "parts": [{"data": raw}]}})
    assert request is not None
    read_back = to_json(request.message.parts[0].data)
    handed = handed_values(raw)
    assert handed is not UNREAD
    assert _typed(handed) == _typed(read_back)
    flat = handed_values(raw, flat=True)
    nested = isinstance(raw, dict | list) and any(
        isinstance(item, dict) or (isinstance(item, list) and "{" in json.dumps(item))
        for item in (raw.values() if isinstance(raw, dict) else raw)
    )
    if nested:
        assert flat is UNREAD  # its members' order is the reader's to see
    else:
        assert _typed(flat) == _typed(read_back)


@pytest.mark.parametrize("raw", [float("nan"), float("inf"), {"a": float("-inf")}, (1, 2)])
def test_what_reading_back_may_answer_otherwise_is_left_to_it(raw: Any) -> None:
    assert handed_values(raw) is UNREAD


# -- a skill's input, handed or read back ----------------------------------------------------


class Plain(BaseModel):
    n: int
    x: float
    anything: Any = None
    either: int | float = 0
    items: list[int] = []
    name: str = ""


class Extras(BaseModel):
    model_config = ConfigDict(extra="allow")
    n: int = 0


class Sees(BaseModel):
    """A model validator that sees the object whole (its members' order too)."""

    order: list[str] = []

    @model_validator(mode="before")
    @classmethod
    def _order(cls, data: Any) -> Any:
        return {"order": list(data)} if isinstance(data, dict) else data


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    b: int


class Mapping(RootModel[dict[str, float]]):
    pass


class Out(BaseModel):
    ok: bool = True


@skill
def plain(req: Plain) -> Out:
    """Plain fields."""
    return Out()


@skill
def extras(req: Extras) -> Out:
    """Keeps extra members."""
    return Out()


@skill
def sees(req: Sees) -> Out:
    """Sees the object whole."""
    return Out()


@skill
def strict(req: Strict) -> Out:
    """Refuses extra members."""
    return Out()


@skill
def mapping(req: Mapping) -> Out:
    """A root model."""
    return Out()


AGENT = Agent(
    name="handed", description="Handed values.", skills=[plain, extras, sees, strict, mapping]
)

CASES: list[tuple[str, Any]] = [
    ("plain", {"n": 3, "x": 2, "anything": 7, "either": 5, "items": [1, 2], "name": "ü"}),
    ("plain", {"name": "a", "x": 1.25, "n": 4.0, "either": 2.5}),
    ("plain", {"n": 1.5, "x": "no", "zz": 1}),  # refused: the same words
    ("plain", {"x": 1}),  # a field missing
    ("plain", {"n": 1, "x": 1, "anything": {"nested": {"b": 1, "a": 2}}}),  # nested: read back
    ("plain", [1, 2]),  # not an object
    ("plain", 7),
    ("extras", {"z": 1, "a": 2, "ü": 3, "m": 4, "b": 5, "q": 6, "c": 7, "n": 1}),
    ("sees", {"z": 1, "a": 2, "m": 3, "b": 4, "q": 5, "c": 6, "k": 7, "d": 8, "e": 9}),
    ("strict", {"z": 1, "a": 2, "n": 1, "q": "x", "b": 1.5, "c": None, "y": [], "d": 4}),
    ("mapping", {"z": 1, "a": 2, "m": 3, "b": 4, "q": 5, "c": 6, "k": 7, "d": 8, "e": 9}),
]


def _outcome(executor: MeshExecutor, skill_id: str, data: Any, handed: bool) -> Any:
    raw = {"messageId": "m", "parts": [{"data": data}], "metadata": {"skill": skill_id}}
    request = send_request({"message": raw})
    assert request is not None
    message = request.message
    call = ServerCallContext()
    if handed:
        call.state[RAW_MESSAGE] = (message, raw)
    req = executor.read_request(message, call)
    try:
        found, payload = executor._validate(req, message, call)
    except SkillInputError as exc:
        return ("refused", str(exc), exc.errors)
    assert isinstance(payload, BaseModel)
    # The model as its skill sees it: each value's type, members in order.
    return (found.id, repr(payload), payload.model_dump_json(), payload.model_extra)


@pytest.mark.parametrize(("skill_id", "data"), CASES)
def test_a_handed_input_validates_as_the_read_back_one(skill_id: str, data: Any) -> None:
    executor = MeshExecutor(SkillDispatcher(AGENT))
    assert _outcome(executor, skill_id, data, True) == _outcome(executor, skill_id, data, False)


@pytest.mark.parametrize(
    "extra",
    [
        {"ü": [1, "ü", None, True]},
        {"ü": {"b": [1, {"a": 2}]}},  # nested: read back
        {"caller": {"z": 1, "a": 2, "m": 3, "b": 4, "q": 5, "c": 6, "k": 7}},  # str() shows order
    ],
)
def test_the_handed_metadata_reads_as_the_read_back_one(extra: dict[str, Any]) -> None:
    executor = MeshExecutor(SkillDispatcher(AGENT))
    metadata = {
        "skill": "plain",
        "caller": "coordinator",
        "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "deadline": 4102444800,
        "callerTask": "up-1",
        **extra,
    }
    reads = []
    for handed in (True, False):
        raw = {"messageId": "m", "parts": [{"data": {"n": 1, "x": 1}}], "metadata": metadata}
        request = send_request({"message": raw})
        assert request is not None
        call = ServerCallContext()
        if handed:
            call.state[RAW_MESSAGE] = (request.message, raw)
        req = executor.read_request(request.message, call)
        reads.append((req.skill_id, req.caller, req.traceparent, req.deadline, req.metadata))
        assert executor._task_metadata(req)["callerTask"] == "up-1"
    assert _typed(reads[0]) == _typed(reads[1])
    assert reads[0][1] == reads[1][1]  # the caller's text, as it is logged


def test_a_message_other_than_the_handed_ones_is_read_back() -> None:
    executor = MeshExecutor(SkillDispatcher(AGENT))
    request = send_request(
        {"message": {"messageId": "m", "parts": [], "metadata": {"skill": "plain"}}}
    )
    assert request is not None
    call = ServerCallContext()
    call.state[RAW_MESSAGE] = (object(), {"metadata": {"skill": "sees"}})
    assert executor.read_request(request.message, call).skill_id == "plain"


def test_a_value_built_from_a_number_holds_its_double() -> None:
    """What ``handed_values`` relies on: a ``Value`` holds ``float(n)`` of an int."""
    for number in (2**53 + 1, 10**300, -(2**63)):
        value = Value()
        value.number_value = number
        assert value.number_value == float(number)


@pytest.mark.parametrize("text", ['{"n": 1, "x": 2}', '{"n": "lots"}', "two plus three"])
def test_a_text_object_with_the_parse_kept_validates_as_before(text: str) -> None:
    """A typed skill's input sent as a JSON object in text (no data part): parsed from the
    text, as before, when the gate's parse is kept too."""
    executor = MeshExecutor(SkillDispatcher(AGENT))
    outcomes = []
    for handed in (True, False):
        raw = {"messageId": "m", "parts": [{"text": text}], "metadata": {"skill": "plain"}}
        request = send_request({"message": raw})
        assert request is not None
        call = ServerCallContext()
        if handed:
            call.state[RAW_MESSAGE] = (request.message, raw)
        req = executor.read_request(request.message, call)
        try:
            found, payload = executor._validate(req, request.message, call)
            outcomes.append((found.id, repr(payload)))
        except SkillInputError as exc:
            outcomes.append(("refused", str(exc)))
    assert outcomes[0] == outcomes[1]

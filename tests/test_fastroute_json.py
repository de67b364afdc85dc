"""The fast route's protobuf JSON (``mesh._a2a.fastpath_json``) against ``json_format``: the
answers it writes are the bytes ``MessageToDict`` gives (the same dict, key order included,
through the same ``json.dumps``), and the requests it reads are the messages ``ParseDict``
builds; what it does not take is left to them, errors included."""

from __future__ import annotations

import json
from collections import OrderedDict
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.helpers import new_data_part
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SendMessageResponse,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict, ParseDict, SerializeToJsonError
from google.protobuf.struct_pb2 import Struct, Value
from starlette.responses import JSONResponse

from mesh._a2a.fastpath_json import (
    data_part,
    dumps,
    response_json,
    response_text,
    rpc_result,
    send_request,
    to_json,
)
from mesh._a2a.idempotency import send_answer, send_answer_cut
from tests.test_node_fastpath import _same, _send, fast_and_sdk

WEIRD: dict[str, Any] = {
    "unicode": "grüße, 世界, 🙂, \u2028",
    "big": 2**60,
    "huge": 1e300,
    "negzero": -0.0,
    "fraction": 0.1,
    "int": 81,
    "null": None,
    "empty": {},
    "emptylist": [],
    "nested": {"a": [1, "two", None, True, {"b": [[], {}]}], "false": False},
}


def _struct(value: dict[str, Any]) -> Struct:
    struct = Struct()
    struct.update(value)
    return struct


def _data(value: Any) -> Value:
    holder = _struct({"v": value})
    return holder.fields["v"]


def _message(text: str = "hi", **fields: Any) -> Message:
    return Message(message_id="m-1", role=Role.ROLE_AGENT, parts=[Part(text=text)], **fields)


def _tasks() -> list[Task]:
    stamp = TaskStatus(state=TaskState.TASK_STATE_COMPLETED)
    stamp.timestamp.FromJsonString("2026-12-01T01:40:55.994374Z")
    typed = Task(
        id="t-1",
        context_id="c-1",
        status=stamp,
        artifacts=[
            Artifact(
                artifact_id="result",
                name="score",
                parts=[Part(data=_data({"score": 396, "tier": "D", **WEIRD}))],
                metadata=_struct({"mediaType": "application/json"}),
            )
        ],
        metadata=_struct({"usage": {"inputTokens": 81.0}, "skill": "score", **WEIRD}),
    )
    llm = Task(
        id="t-2",
        context_id="c-2",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
        artifacts=[
            Artifact(
                artifact_id="answer-t-2",
                name="chat",
                parts=[Part(text="a-1001: score 396 tier D 🙂", media_type="text/plain")],
            )
        ],
        history=[_message("score a-1001", context_id="c-2", task_id="t-2")],
        metadata=_struct({"childrenUsage": {}, "traceparent": "00-ab-cd-01"}),
    )
    rejected = Task(
        id="t-3",
        context_id="c-3",
        status=TaskStatus(
            state=TaskState.TASK_STATE_REJECTED,
            message=_message("invalid input: field 'amount' is required"),
        ),
    )
    asking = Task(
        id="t-4",
        context_id="c-4",
        status=TaskStatus(
            state=TaskState.TASK_STATE_INPUT_REQUIRED,
            message=_message(
                "which account?",
                metadata=_struct({"question": {"schema": {"type": "string"}}, "n": None}),
            ),
        ),
    )
    files = Task(
        id="t-5",
        artifacts=[
            Artifact(
                artifact_id="files",
                description="ünïcode",
                extensions=["https://example.org/ext"],
                parts=[
                    Part(raw=b"\x00\xffbytes", media_type="application/octet-stream"),
                    Part(url="https://example.org/f.pdf", filename="f.pdf"),
                    Part(data=_data([1, 2.5, "x"])),
                    Part(data=_data(None)),
                    Part(data=_data("just text")),
                    Part(data=Value()),  # no kind set: null
                ],
            )
        ],
    )
    return [typed, llm, rejected, asking, files, Task()]


@pytest.mark.parametrize("task", _tasks(), ids=lambda task: task.id or "empty")
def test_answers_are_message_to_dict(task: Task) -> None:
    for response in (SendMessageResponse(task=task), task, task.status):
        mine, theirs = to_json(response), MessageToDict(response)
        assert mine == theirs
        assert json.dumps(mine, ensure_ascii=False) == json.dumps(theirs, ensure_ascii=False)
    # A copy into SendMessageResponse may iterate a Struct's map in another order: the same
    # JSON object, not the same bytes; response_json writes the task itself, as MessageToDict.
    assert response_json(task) == MessageToDict(SendMessageResponse(task=task))
    assert json.dumps(response_json(task)) == json.dumps({"task": MessageToDict(task)})


def test_a_message_answer_is_message_to_dict() -> None:
    message = _message("direct", metadata=_struct(WEIRD))
    response = SendMessageResponse(message=message)
    assert json.dumps(to_json(response)) == json.dumps(MessageToDict(response))
    assert response_json(message) == MessageToDict(response)
    assert json.dumps(response_json(message)) == json.dumps({"message": MessageToDict(message)})


class _Tier(StrEnum):
    A = "A"


class _Rank(IntEnum):
    FIRST = 1


class _Flag(int):
    """An int subclass that is not a bool."""


DATA_VALUES: list[Any] = [
    {"applicantId": "a-1001", "score": 396, "tier": "D"},
    WEIRD,
    {},
    [1, [], {}, None, True, "x", 2.5],
    "text",
    None,
    3,
    {"nan": float("nan"), "tuple": (1, 2)},  # what ParseDict takes too
    # Subclasses of the JSON types (a skill's enums, an ordered dict): taken as their base.
    OrderedDict(
        [("tier", _Tier.A), ("rank", _Rank.FIRST), ("flag", _Flag(True)), ("sub", OrderedDict())]
    ),
    [_Tier.A, [_Rank.FIRST, []], OrderedDict(a=[{}])],
]


@pytest.mark.parametrize("value", DATA_VALUES, ids=range(len(DATA_VALUES)))
def test_data_parts_are_new_data_parts(value: Any) -> None:
    mine, theirs = data_part(value, "application/json"), new_data_part(value, "application/json")
    assert mine.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize("value", [{"huge": 10**400}, {1: 2}, {"set": {1, 2}}])
def test_a_data_part_json_cannot_hold_gets_new_data_parts_error(value: Any) -> None:
    with pytest.raises(Exception) as theirs:  # noqa: PT011 - whichever ParseDict raises
        new_data_part(value)
    with pytest.raises(type(theirs.value)) as mine:
        data_part(value)
    assert str(mine.value) == str(theirs.value)


def test_a_value_json_cannot_hold_gets_message_to_dicts_error() -> None:
    task = Task(id="t", metadata=_struct({"n": float("nan")}))
    with pytest.raises(SerializeToJsonError) as theirs:
        MessageToDict(SendMessageResponse(task=task))
    with pytest.raises(SerializeToJsonError) as mine:
        to_json(SendMessageResponse(task=task))
    assert str(mine.value) == str(theirs.value)
    with pytest.raises(SerializeToJsonError) as mine:
        response_json(task)
    assert str(mine.value) == str(theirs.value)


def _message_json(**fields: Any) -> dict[str, Any]:
    return {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "hi"}], **fields}


TAKEN: list[dict[str, Any]] = [
    {"message": _message_json(), "configuration": {"historyLength": 0}},
    {"message": _message_json()},
    {"message": _message_json(contextId="c-1", metadata={"skill": "score", **WEIRD})},
    {"message": _message_json(metadata={})},
    {
        "message": _message_json(
            parts=[
                {
                    "data": {"amount": 25000, "id": "a-1001", **WEIRD},
                    "mediaType": "application/json",
                },
                {"text": "ünïcode 🙂", "mediaType": "text/plain"},
                {"data": [1, None, "x"]},
                {"data": None},
                {"data": 1.5},
                {"data": False},
            ]
        ),
        "configuration": {"historyLength": 3, "acceptedOutputModes": ["application/json"]},
    },
    {"message": {"messageId": "", "parts": []}, "configuration": {}},
    {"message": _message_json(role="ROLE_AGENT")},
]

LEFT: list[dict[str, Any]] = [
    {"message": _message_json(), "configuration": {"returnImmediately": True}},
    {"message": _message_json(), "metadata": {"x": 1}},
    {"message": _message_json(), "tenant": "t"},
    {"message": _message_json(role=1)},
    {"message": _message_json(message_id="snake")},
    {"message": _message_json(extensions=["x"])},
    {"message": _message_json(parts=[{"text": "a", "data": {}}])},
    {"message": _message_json(parts=[{"url": "https://example.org/f"}])},
    {"message": _message_json(), "configuration": {"historyLength": 2.0}},
    {"message": _message_json(), "configuration": {"historyLength": True}},
    {"message": _message_json(), "configuration": {"historyLength": "2"}},
    {"message": _message_json(), "configuration": {"historyLength": 2**40}},
    {"message": _message_json(metadata=None)},
    {"message": _message_json(messageId=None)},
    {"message": _message_json(role="ROLE_KING")},  # ParseDict ignores it (unknown fields)
]

REFUSED: list[dict[str, Any]] = [
    {"message": _message_json(metadata=[1])},
    {"message": _message_json(parts={"text": "a"})},
    {"message": _message_json(messageId=5)},
    {"message": _message_json(parts=[{"text": 5}])},
    {"message": _message_json(), "configuration": {"historyLength": 2**40}},
    {"message": _message_json(), "configuration": {"acceptedOutputModes": "json"}},
]


def _parse_dict(raw: dict[str, Any]) -> SendMessageRequest:
    request = SendMessageRequest()
    ParseDict(raw, request, ignore_unknown_fields=True)
    return request


@pytest.mark.parametrize("raw", TAKEN)
def test_requests_are_what_parse_dict_reads(raw: dict[str, Any]) -> None:
    mine = send_request(raw)
    assert mine is not None
    theirs = _parse_dict(raw)
    assert mine == theirs
    assert mine.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )
    # Presence too: an empty Struct or configuration is there on both sides.
    for message in (mine, theirs):
        assert message.message.HasField("metadata") == ("metadata" in raw["message"])
        assert message.HasField("configuration") == ("configuration" in raw)


@pytest.mark.parametrize("raw", LEFT + REFUSED)
def test_other_requests_are_left_to_parse_dict(raw: dict[str, Any]) -> None:
    assert send_request(raw) is None


@pytest.mark.parametrize("raw", REFUSED)
def test_parse_dict_refuses_what_it_is_left(raw: dict[str, Any]) -> None:
    with pytest.raises(Exception):  # noqa: B017, PT011 (json_format's own ParseError types)
        _parse_dict(raw)


@pytest.mark.integration
async def test_the_fast_route_answers_as_the_sdk_route(tmp_path: Path) -> None:
    """Two real nodes, MESH_FASTPATH=1 and 0: the same answer to a request full of what JSON
    conversion gets wrong (the request comes back in the history, as each path read it)."""
    body = _send(
        {"key": "grüße 🙂 \u2028", "n": 2**40},
        "echo",
        config={"historyLength": 5, "acceptedOutputModes": ["application/json"]},
        meta={"extra": WEIRD},
    )
    target = "tests.node_agents:agent"
    with fast_and_sdk(tmp_path, target, file_var="NODE_TEST_CALLS", suffix=".calls") as nodes:
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            answer = await _same(http, nodes, body)
            rejected = await _same(http, nodes, _send({"key": None, "n": 1e300}, "echo"))
    task = answer["result"]["task"]
    assert task["artifacts"][0]["parts"][0]["data"]["doubled"] == 2**41
    first = task["history"][0]
    assert first["parts"][0]["data"] == {"key": "grüße 🙂 \u2028", "n": float(2**40)}
    assert first["metadata"]["extra"] == json.loads(json.dumps(WEIRD), parse_int=float)
    assert rejected["result"]["task"]["status"]["state"] == "TASK_STATE_REJECTED"


def _stamped(seconds: int, nanos: int) -> Task:
    status = TaskStatus(state=TaskState.TASK_STATE_WORKING)
    status.timestamp.seconds = seconds
    status.timestamp.nanos = nanos
    return Task(id="t", status=status)


STAMPS = [
    (1796122264, 654271000),
    (1796122264, 654271001),  # the same second, remembered
    (1796122264, 0),
    (1796122265, 654000000),
    (1796122265, 654271000),
    (0, 1),
    (-62135596800, 0),
    (253402300799, 999999999),
]


@pytest.mark.parametrize(
    "answer",
    [*_tasks(), _message("direct", metadata=_struct(WEIRD))] + [_stamped(*s) for s in STAMPS],
    ids=lambda answer: getattr(answer, "id", "") or "empty",
)
def test_answer_bytes_are_json_dumps_of_the_dict(answer: Task | Message) -> None:
    """The answer written as text in one pass is byte for byte what JSONResponse writes of
    response_json's dict (and of the SDK route's JSON-RPC envelope around it)."""
    assert response_text(answer).encode() == dumps(response_json(answer))
    for request_id in (1, 0, -7, 2**70, "r-1", 'ünï "quoted" \u2028 🙂', ""):
        envelope = {"result": response_json(answer), "id": request_id, "jsonrpc": "2.0"}
        assert rpc_result(answer, request_id) == dumps(envelope)
    assert dumps(envelope) == JSONResponse(envelope).body


@pytest.mark.parametrize("stamp", [(253402300800, 0), (-62135596801, 5), (1, -1), (1, 10**9)])
def test_a_timestamp_out_of_range_is_its_own_error(stamp: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="Timestamp is not valid") as theirs:
        response_json(_stamped(*stamp))
    with pytest.raises(ValueError, match="Timestamp is not valid") as mine:
        response_text(_stamped(*stamp))
    assert str(mine.value) == str(theirs.value)


def test_what_the_text_cannot_write_is_message_to_dicts() -> None:
    left = Task(id="t", metadata=_struct({"n": float("nan")}))
    with pytest.raises(SerializeToJsonError) as theirs:
        MessageToDict(SendMessageResponse(task=left))
    with pytest.raises(SerializeToJsonError) as mine:
        rpc_result(left, 1)
    assert str(mine.value) == str(theirs.value)


def _held_orders() -> list[Struct]:
    """Task metadata holding Structs of the same entries put in in other orders (so their maps
    may iterate in other orders), an empty one, and a large one."""
    keys = [f"k{i}" for i in range(9)]
    held = []
    for shift in range(len(keys)):
        order = keys[shift:] + keys[:shift]
        metadata = Struct()
        metadata.update({"skill": "score", "usage": {key: 0 for key in order}, "empty": {}})
        held.append(metadata)
    large = Struct()
    large.update({"big": {f"key-{i}": "v" * 20 for i in range(40)}})
    return [*held, large]


def test_a_struct_held_in_a_struct_is_written_once_per_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Struct in another's entry (a task's usage counts) is walked once per distinct bytes
    and written again from them, each time in its own map's order (MessageToDict's text, to
    the byte); one over the size kept, or one that cannot be written, is walked each time."""
    from mesh._a2a import fastpath_json

    monkeypatch.setattr(fastpath_json, "_HELD", {})
    walked: list[Struct] = []
    walk = fastpath_json._struct_text

    def counted(struct: Struct) -> str:
        walked.append(struct)
        return walk(struct)

    monkeypatch.setattr(fastpath_json, "_struct_text", counted)
    for metadata in _held_orders():
        task = Task(id="t", metadata=metadata)
        expected = dumps({"task": MessageToDict(task)})
        assert response_text(task).encode() == expected
        walked.clear()
        assert response_text(task).encode() == expected
        assert len(walked) == (1 if "big" in metadata.fields else 0)
    nan = Task(id="t", metadata=_struct({"usage": {"n": float("nan")}}))
    for _ in range(2):
        walked.clear()
        with pytest.raises(SerializeToJsonError):
            rpc_result(nan, 1)
        assert len(walked) == 1


def _with_history(task: Task, count: int) -> Task:
    held = Task()
    held.CopyFrom(task)
    for i in range(count):
        held.history.append(
            Message(message_id=f"h-{i}", role=Role.ROLE_USER, parts=[Part(text="hi")])
        )
    return held


@pytest.mark.parametrize("task", _tasks(), ids=lambda task: task.id or "empty")
def test_an_answer_from_a_history_index_is_the_task_without_the_messages_before(
    task: Task,
) -> None:
    """history_from leaves the task's first messages out of its text, as send_answer's task
    without them (no history member once none is left), written from the task itself: the
    bytes dumps writes of MessageToDict's dict of it with its history list cut."""
    for count in (1, 3):
        held = _with_history(task, count)
        for start in range(len(held.history) + 1):
            expected = MessageToDict(held)
            expected["history"] = expected["history"][start:]
            if not expected["history"]:
                del expected["history"]
            assert response_text(held, start).encode() == dumps({"task": expected})
            envelope = {"result": {"task": expected}, "id": "r", "jsonrpc": "2.0"}
            assert rpc_result(held, "r", history_from=start) == dumps(envelope)
            sent_id = held.history[start - 1].message_id if start else "absent"
            sent = SendMessageRequest(message=Message(message_id=sent_id))
            answer, cut = send_answer_cut(held, sent)
            if held.HasField("status"):
                assert answer is held  # no copy
                assert cut == start
            else:  # send_answer's copy has an empty status: that copy, from its start
                assert (answer, cut) == (send_answer(held, sent), 0)
            assert json.loads(response_text(answer, cut)) == json.loads(
                response_text(send_answer(held, sent))
            )
        for length in (0, 1, 2, 3, 4, 10, -1):
            asked = SendMessageRequest(
                message=Message(message_id="h-0"),
                configuration=SendMessageConfiguration(history_length=length),
            )
            answer, cut = send_answer_cut(held, asked)
            assert answer is held  # apply_history_length's copy not made
            copied = send_answer(held, asked)
            assert len(copied.history) == len(held.history) - cut
            assert json.loads(response_text(answer, cut)) == json.loads(response_text(copied))


def test_a_cut_answer_the_text_cannot_write_is_message_to_dicts() -> None:
    left = _with_history(Task(id="t", metadata=_struct({"n": float("nan")})), 2)
    trimmed = Task()
    trimmed.CopyFrom(left)
    del trimmed.history[:1]
    with pytest.raises(SerializeToJsonError) as theirs:
        MessageToDict(SendMessageResponse(task=trimmed))
    with pytest.raises(SerializeToJsonError) as mine:
        rpc_result(left, 1, history_from=1)
    assert str(mine.value) == str(theirs.value)

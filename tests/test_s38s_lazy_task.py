"""A settled typed task parsed only when read (``fastpath_json.Settled.task``).

``one_shot`` writes a settled typed task's bytes and, when no chain of messages in them can
near upb's depth limit, hands on a stand-in (its ids and status) instead of parsing them: the
store writes the bytes, the fast route writes its answer from the held values. Here: the
depth bound holds (whatever a request nests, a task said shallow parses, and its stand-in is
its first fields), and a real node's answers on both bindings, for every history rule, are
the text of the stored task (GetTask's), byte for byte, as the walk of that task writes it.
"""

from __future__ import annotations

import json
import string
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import Message, Part, Role, SendMessageRequest, Task, TaskState, TaskStatus
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.json_format import ParseDict
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh._a2a.fastpath import AppliedEvents
from mesh._a2a.fastpath_json import response_text, rpc_result
from mesh._a2a.idempotency import send_answer_cut
from mesh._a2a.one_shot import (
    _SHALLOW,
    _AgentText,
    _artifact_wire,
    _metadata_wire,
    _shape,
    _task_wire,
    _varint,
)
from mesh._a2a.server import A2AService
from mesh._a2a.store import SINGLE_WRITE
from mesh._sqlite import Database
from tests.node_agents import agent as worker_agent
from tests.test_node_fastpath import _scope

TASK, CONTEXT = "7d3c9a52-5b8e-4a1c-9d0e-2f6b8c4e1a90", "c0ffee00-0000-4000-8000-000000000001"
META = {"skill": "score", "usage": {"input": 0, "output": 0}, "childrenUsage": {}}

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)


def _nest(kind: str, depth: int) -> Any:
    data: Any = 1
    for _ in range(depth):
        data = {"a": data} if kind == "dict" else [data]
    return data


def _wired(
    value: Any, *, text: str = "score me", at: int = 1_764_700_000_123_456_000
) -> tuple[bytes, int, bool] | None:
    """The settled task's bytes of a request whose data part holds ``value``."""
    first = Message(message_id="m-0", context_id=CONTEXT, role=Role.ROLE_USER)
    first.parts.add().text = text
    part = first.parts.add()
    if isinstance(value, dict):
        part.data.struct_value.update(value)
    elif isinstance(value, list):
        part.data.list_value.extend(value)
    else:
        part.data.number_value = 1
    answer = [Part(text='{"score":1}')]
    artifact = _artifact_wire("a-1", "answer", answer)
    assert artifact is not None
    working = _AgentText("w-1", TASK, CONTEXT, "running skill 'score'")
    shape = _shape(META)
    assert shape is not None
    return _task_wire(
        TASK,
        CONTEXT,
        int(TaskState.TASK_STATE_COMPLETED),
        at,
        artifact,
        [first, working],
        _metadata_wire(META, shape),
    )


def _check_bound(value: Any) -> bool:
    """A task said shallow parses. Whether it parses."""
    wired = _wired(value)
    assert wired is not None
    row, shallow = wired
    try:
        task = Task.FromString(row)
    except DecodeError:
        assert not shallow  # the bound never says shallow of bytes a parse refuses
        return False
    assert task.id == TASK
    return True


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_the_depth_bound_says_shallow_only_of_tasks_that_parse(kind: str) -> None:
    """Through upb's limit and past it: shallow tasks parse, and past the bound's reach the
    task is left to the parse (some that parse are not said shallow; none that fail are)."""
    outcomes = set()
    for depth in range(60):
        parsed = _check_bound(_nest(kind, depth))
        outcomes.add(parsed)
    assert outcomes == {True, False}
    # A request of the usual size is shallow.
    wired = _wired({"applicant_id": "a-1001", "amount": 25000})
    assert wired is not None
    assert wired[1]
    assert _SHALLOW < 100


_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(string.printable, max_size=4), inner, max_size=3),
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.dictionaries(st.text(max_size=6), _json, max_size=4), st.lists(_json)))
def test_the_depth_bound_holds_for_any_request_data(value: Any) -> None:
    _check_bound(value)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.sampled_from(["dict", "list"]), st.text(max_size=400))
def test_the_depth_bound_holds_near_the_limit_with_text_around(
    depth: int, kind: str, text: str
) -> None:
    """Text whose bytes look like keys (wire type 2) only makes the bound more careful."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return
    wired = _wired(_nest(kind, depth), text=text)
    assert wired is not None
    row, shallow = wired
    if shallow:
        Task.FromString(row)


# -- a real node: the answers written from the held values are the stored task's text --------


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[A2AService]:
    db = await Database.open(tmp_path / "node.db")
    svc = await A2AService.create(worker_agent, url="http://127.0.0.1:1", db=db)
    try:
        yield svc
    finally:
        await svc.aclose()
        await db.aclose()


async def _answer(service: A2AService, body: dict[str, Any], rest: bool) -> bytes:
    route = service.fastroute
    assert route is not None
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    if rest:
        served = await route.serve_rest(body["params"], _scope(), receive, send)
    else:
        served = await route.serve(body, _scope(), receive, send)
    assert served
    assert sent[0]["status"] == 200
    return bytes(sent[1]["body"])


_CONFIGS: list[dict[str, Any] | None] = [
    None,
    {},
    {"historyLength": 0},
    {"historyLength": 1},
    {"historyLength": 2},
    {"historyLength": 3},
    {"historyLength": 50},
    {"acceptedOutputModes": ["application/json"]},
]


@pytest.mark.parametrize("rest", [False, True], ids=["jsonrpc", "rest"])
async def test_answers_are_the_stored_tasks_text_for_every_history_rule(
    service: A2AService, rest: bool
) -> None:
    """Each answer (the stand-in's, written from the held values) is the walk of the task
    GetTask reads back, cut as ``send_answer_cut`` cuts it: every ``historyLength`` or none,
    odd unicode, a request nested past the bound (parsed at once)."""
    store = service.handler.task_store
    # The node's store takes a stand-in: its typed tasks are answered without a parse.
    single = ServerCallContext()
    single.state[SINGLE_WRITE] = True
    events = AppliedEvents.direct(
        store, single, task_id=TASK, context_id=CONTEXT, initial_message=None
    )
    assert events.takes_stand_in
    keys = ["plain", "ünï\u2028cødé \U0001f600", 'q"uo\\te', "%s %%"]
    extras: list[Any] = [None, {"deep": _nest("dict", 29)}, {"list": _nest("list", 45)}]
    i = 0
    for config in _CONFIGS:
        for key in keys:
            for extra in extras:
                for message_id in (uuid.uuid4().hex, f"ïd %s {uuid.uuid4().hex}"):
                    i += 1
                    data: dict[str, Any] = {"key": key, "n": i}
                    if extra is not None:
                        data["extra"] = extra
                    message: dict[str, Any] = {
                        "role": "ROLE_USER",
                        "parts": [{"data": data}],
                        "metadata": {"skill": "echo", "caller": "tester"},
                    }
                    message["messageId"] = message_id
                    params: dict[str, Any] = {"message": message}
                    if config is not None:
                        params["configuration"] = config
                    body = {"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": params}
                    raw = await _answer(service, body, rest)
                    answer = json.loads(raw)
                    assert "error" not in answer, raw
                    task_json = answer["task"] if rest else answer["result"]["task"]
                    assert task_json["status"]["state"] == "TASK_STATE_COMPLETED", raw
                    stored = await store.get(task_json["id"], ServerCallContext())
                    assert stored is not None
                    request = SendMessageRequest()
                    ParseDict(params, request)
                    cut, start = send_answer_cut(stored, request)
                    expected = (
                        response_text(cut, history_from=start).encode()
                        if rest
                        else rpc_result(cut, i, history_from=start)
                    )
                    assert raw == expected, (config, key, extra, message_id)


@settings(max_examples=2000, deadline=None)
@given(
    st.one_of(
        st.integers(0, 2**64 - 1),
        st.integers(0, 10**9),
        st.integers(0, 40).map(lambda k: 2 ** (7 * (k % 10)) + k - 20).filter(lambda n: n >= 0),
    )
)
def test_a_varint_is_protobufs(n: int) -> None:
    """``_varint`` (its five-byte branch: a status time's nanoseconds) writes protobuf's
    bytes; a status of any time is the constructors' serialize."""
    assert _varint(n) == _VarintBytes(n)
    if n < 10**9:
        at = 1_764_700_000 * 10**9 + n // 1000 * 1000
        wired = _wired({"k": "v"}, at=at)
        assert wired is not None
        task = Task.FromString(wired[0])
        stamp = Timestamp(seconds=at // 10**9, nanos=at % 10**9)
        assert task.status.timestamp == stamp
        assert (
            task.status.SerializeToString()
            == TaskStatus(state=TaskState.TASK_STATE_COMPLETED, timestamp=stamp).SerializeToString()
        )

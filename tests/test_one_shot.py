"""mesh._a2a.one_shot: a held run's task is built to the byte as its events would have left it,
and ``stepped`` awaits a coroutine as ``await`` does, releasing first when it will wait."""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict, SerializeToJsonError
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh._a2a.artifacts import answer_parts
from mesh._a2a.fastpath import AppliedEvents
from mesh._a2a.fastpath_json import SETTLED, Settled, response_text, rpc_result
from mesh._a2a.one_shot import OneShotUpdater, stepped
from mesh._a2a.store import SINGLE_WRITE
from mesh._a2a.updater import MeshTaskUpdater

TASK, CONTEXT = "task-1", "context-1"
ZEROS = {
    "inputTokens": 0,
    "outputTokens": 0,
    "cachedTokens": 0,
    "thinkingTokens": 0,
    "totalTokens": 0,
}
TRACE = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


def _message(text: str, message_id: str, role: Role = Role.ROLE_AGENT) -> Message:
    return Message(
        role=role,
        message_id=message_id,
        task_id=TASK,
        context_id=CONTEXT,
        parts=[new_text_part(text)],
    )


def _answer() -> list[Part]:
    return [new_text_part('{"score": 1}', media_type="text/plain")]


def _events(store: InMemoryTaskStore | None = None) -> AppliedEvents:
    context = ServerCallContext()
    context.state[SINGLE_WRITE] = True
    first = _message("score me", "m-0", Role.ROLE_USER)
    return AppliedEvents(
        None,
        store or InMemoryTaskStore(),
        context,
        task_id=TASK,
        context_id=CONTEXT,
        initial_message=first,
    )


async def _submitted(events: AppliedEvents) -> None:
    """The task SUBMITTED with its first message, as a run whose events are not held starts."""
    first = events._initial_message
    assert first is not None
    await events.enqueue_event(
        Task(
            id=TASK,
            context_id=CONTEXT,
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            history=[first],
        )
    )


async def _run(updater: MeshTaskUpdater, ending: str, trace: str) -> None:
    """One run's updates, as the executor makes them."""
    meta: dict[str, Any] = {"skill": "score", "caller": "coordinator", "traceparent": trace}
    if ending == "rejected":
        error = {"reason": "rejected", "message": "invalid input"}
        await updater.update_status(
            TaskState.TASK_STATE_REJECTED,
            message=_message("invalid input", "m-2"),
            metadata={**meta, "error": error},
        )
        return
    await updater.start_work(_message("running skill 'score'", "m-1"))
    if ending == "failed":
        error = {"reason": "failed", "message": "it broke"}
        await updater.update_status(
            TaskState.TASK_STATE_FAILED,
            message=_message("it broke", "m-2"),
            metadata={**meta, "error": error},
        )
        return
    if ending == "attached":
        await updater.add_artifact(
            [new_text_part("a note")],
            artifact_id="a-1",
            name="note",
            metadata={"description": "a note"},
            last_chunk=True,
        )
    await updater.add_artifact(
        _answer(), artifact_id=f"answer-{TASK}", name="score", append=False, last_chunk=True
    )
    await updater.update_status(
        TaskState.TASK_STATE_COMPLETED,
        metadata={**meta, "callerTask": "up-1", "usage": ZEROS, "childrenUsage": {}},
    )


@pytest.mark.parametrize("ending", ["completed", "attached", "failed", "rejected"])
async def test_the_held_task_is_the_events_task_to_the_byte(ending: str) -> None:
    for n in range(20):  # each trace a new string: the metadata kept by shape is reused
        trace = f"00-{n:032x}-{'c' * 16}-01"
        by_events = _events()
        await _submitted(by_events)
        await _run(MeshTaskUpdater(by_events, TASK, CONTEXT), ending, trace)
        store = InMemoryTaskStore()
        held = _events(store)
        updater = OneShotUpdater(held, TASK, CONTEXT, held._initial_message)
        await _run(updater, ending, trace)
        assert not updater.held
        expected, built = by_events.task, held.task
        assert expected is not None
        assert built is not None
        assert await store.get(TASK, ServerCallContext()) == built
        gap = built.status.timestamp.ToNanoseconds() - expected.status.timestamp.ToNanoseconds()
        assert 0 <= gap < 10**9
        built.status.timestamp.CopyFrom(expected.status.timestamp)  # the one difference
        assert built.SerializeToString() == expected.SerializeToString()


async def test_a_held_status_is_built_in_the_final_task_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held run's final status (a caller's timestamp too) and its one status's metadata are
    built in its final task, not built apart and copied in."""
    from mesh._a2a import one_shot

    built: list[dict[str, Any]] = []

    def counted(**fields: Any) -> TaskStatus:
        built.append(fields)
        return TaskStatus(**fields)

    monkeypatch.setattr(one_shot, "TaskStatus", counted)
    held = _events()
    updater = OneShotUpdater(held, TASK, CONTEXT, held._initial_message)
    await updater.start_work(_message("running skill 'score'", "m-1"))
    await updater.update_status(
        TaskState.TASK_STATE_COMPLETED,
        timestamp="2026-12-02T02:19:01.643004Z",
        metadata={"skill": "score", "usage": ZEROS},
    )
    assert built == []
    task = held.task
    assert task is not None
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.status.timestamp.ToJsonString() == "2026-12-02T02:19:01.643004Z"
    assert [m.message_id for m in task.history] == ["m-0", "m-1"]
    assert MessageToDict(task.metadata) == {"skill": "score", "usage": dict.fromkeys(ZEROS, 0.0)}


async def test_a_released_run_publishes_its_start_then_its_updates() -> None:
    events = _events()
    started: list[str] = []

    async def on_start() -> None:
        assert events.task is not None  # after the first state
        started.append(events.task.id)

    updater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message, on_start)
    await updater.start_work(_message("running skill 'score'", "m-1"))
    assert events.task is None
    await updater.release()
    assert started == [TASK]
    assert events.task is not None
    assert events.task.status.state == TaskState.TASK_STATE_WORKING
    assert [m.message_id for m in events.task.history] == ["m-0"]
    await updater.release()  # once only
    assert started == [TASK]
    await updater.update_status(TaskState.TASK_STATE_COMPLETED)
    assert events.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [m.message_id for m in events.task.history] == ["m-0", "m-1"]
    with pytest.raises(RuntimeError, match="terminal"):
        await updater.update_status(TaskState.TASK_STATE_WORKING)


async def test_an_interrupted_state_or_an_append_releases_the_run() -> None:
    for update in ("input", "append"):
        events = _events()
        updater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message)
        if update == "input":
            await updater.update_status(TaskState.TASK_STATE_INPUT_REQUIRED)
        else:
            with pytest.raises(Exception, match="nonexistent artifact"):
                await updater.add_artifact(_answer(), artifact_id="x", append=True)
        assert not updater.held
        assert events.task is not None


async def test_stepped_awaits_as_await_does() -> None:
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    async def at_once() -> int:
        return 1

    async def later() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return 2

    async def raising() -> int:
        raise ValueError("no")

    async def suspending() -> int:
        raise KeyboardInterrupt

    assert await stepped(at_once(), release) == 1
    assert released == []
    with pytest.raises(ValueError, match="no"):
        await stepped(raising(), release)
    assert released == []
    assert await stepped(later(), release) == 2
    assert released == [True]
    with pytest.raises(KeyboardInterrupt):
        await stepped(suspending(), release)
    assert released == [True, True]


async def test_stepped_passes_a_cancellation_on() -> None:
    caught: list[str] = []

    async def release() -> None:
        pass

    async def sleeper() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            caught.append("canceled")
            raise
        return "slept"

    async def shrugging() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "went on"
        return "slept"

    running = asyncio.ensure_future(stepped(sleeper(), release))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert caught == ["canceled"]
    going = asyncio.ensure_future(stepped(shrugging(), release))
    await asyncio.sleep(0.01)
    going.cancel()
    assert await going == "went on"


# A flat answer's values of each kind the writer takes, keys in several orders and counts: a
# Struct's member order is its hash table's, so each key set may come out in another order.
FLAT: list[dict[str, Any]] = [
    {"applicant_id": "a-1001", "score": 396, "tier": "D"},
    {"tier": "A", "score": 800, "applicant_id": "grüße 🙂 \u2028\"'\\"},
    {},
    {"ok": True, "no": False, "none": None, "half": 0.5, "negzero": -0.0, "big": 2**60},
    {f"k{i}": i * 1.25 for i in range(9)},
    {f"key-{i}": str(i) for i in range(17)},
    {"rate%": "5%s", "%(x)s": 1.5},  # a template's own sign in keys and values
]


async def _settled_run(data: dict[str, Any], meta: dict[str, Any]) -> AppliedEvents:
    events = _events()
    updater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message)
    await updater.start_work(_message("running skill 'score'", "m-1"))
    await updater.add_artifact(
        answer_parts(data, "", typed=True),
        artifact_id=f"answer-{TASK}",
        name="score",
        append=False,
        last_chunk=True,
    )
    await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
    return events


@pytest.mark.parametrize("data", FLAT)
async def test_a_settled_task_is_written_from_its_values_as_walked(data: dict[str, Any]) -> None:
    metas: list[dict[str, Any]] = [
        {"skill": "score", "traceparent": TRACE, "usage": ZEROS, "childrenUsage": {}},
        {"skill": "score", "caller": "coordinator", "usage": ZEROS, "childrenUsage": {}},
    ]
    for n in range(6):  # a kept order is reused for new values of the same keys
        meta = {**metas[n % 2], "skill": f"score-{n}"}
        values = {
            key: (f"{value}-{n}" if type(value) is str else value) for key, value in data.items()
        }
        events = await _settled_run(values, meta)
        settled = events._context.state[SETTLED] if events._context is not None else None
        assert isinstance(settled, Settled)
        task = events.task
        assert settled.task is task
        assert task is not None
        for start in range(len(task.history) + 1):
            # The task itself, not a copy: a copy may hold a Struct's members in another order.
            walked = MessageToDict(task)
            if walked["history"][start:]:
                walked["history"] = walked["history"][start:]
            else:
                del walked["history"]
            expected = json.dumps({"task": walked}, ensure_ascii=False, separators=(",", ":"))
            assert response_text(task, start, settled) == expected
            assert response_text(task, start) == expected
            for request_id in (7, "r-%s 1"):  # the envelope written with the task's text
                enveloped = rpc_result(task, request_id, start, settled)
                assert enveloped == rpc_result(task, request_id, start)
                assert json.loads(enveloped) == {
                    "result": json.loads(expected),
                    "id": request_id,
                    "jsonrpc": "2.0",
                }


@pytest.mark.parametrize(
    ("data", "meta"),
    [
        ({"nested": {"a": 1}}, {"skill": "score"}),  # not flat: walked
        ({"a": 1}, {"skill": "score", "usage": {"inputTokens": 3}}),  # no kept shape
    ],
)
async def test_a_task_of_another_shape_is_not_settled_and_is_walked(
    data: dict[str, Any], meta: dict[str, Any]
) -> None:
    events = await _settled_run(data, meta)
    assert events._context is not None
    assert SETTLED not in events._context.state


async def test_a_settled_value_the_walk_refuses_is_refused_as_the_walk_does() -> None:
    events = await _settled_run({"a": float("nan")}, {"skill": "score"})
    settled = events._context.state[SETTLED] if events._context is not None else None
    assert isinstance(settled, Settled)
    assert events.task is not None
    with pytest.raises(SerializeToJsonError) as by_values:
        response_text(events.task, 0, settled)
    with pytest.raises(SerializeToJsonError) as walked:
        response_text(events.task, 0)
    assert str(by_values.value) == str(walked.value)


@pytest.mark.parametrize("many", ["keys", "characters"])
async def test_a_flat_answer_of_many_keys_is_walked_and_its_order_not_kept(many: str) -> None:
    """Keys a caller chose (a ``dict[str, float]`` echoed back) are not pinned by the kept
    orders: past ``_MAX_KEYS`` keys or ``_MAX_KEY_CHARS`` of them the answer is walked, the
    same text."""
    from mesh._a2a import fastpath_json

    if many == "keys":
        data = {f"caller-key-{i}": float(i) for i in range(fastpath_json._MAX_KEYS + 1)}
    else:
        data = {"k" * (fastpath_json._MAX_KEY_CHARS + 1): 1.0}
    events = await _settled_run(data, {"skill": "score"})
    settled = events._context.state[SETTLED] if events._context is not None else None
    assert isinstance(settled, Settled)
    assert events.task is not None
    expected = response_text(events.task, 0)
    assert response_text(events.task, 0, settled) == expected
    assert all(layout[1] != tuple(data) for layout in fastpath_json._SETTLED_PLANS)
    assert json.loads(expected)["task"]["artifacts"][0]["parts"][0]["data"] == data


async def _typed_run(
    updater: MeshTaskUpdater, held: bool, data: dict[str, Any], name: str | None, release: bool
) -> None:
    """A typed skill's updates as the executor makes them: ``work`` on a held run (its message
    kept as its fields), the SDK's way otherwise; the answer's ``AnswerParts``."""
    if held:
        assert isinstance(updater, OneShotUpdater)
        await updater.work("running skill 'score'")
    else:
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            message=updater.new_agent_message([new_text_part("running skill 'score'")]),
        )
    await updater.add_artifact(
        answer_parts(data, "", typed=True),
        artifact_id=f"answer-{TASK}",
        name=name,
        append=False,
        last_chunk=True,
    )
    if release:
        assert isinstance(updater, OneShotUpdater)
        await updater.release()  # as a handler that awaits: each held update an event
    meta = {"skill": "score", "traceparent": TRACE, "usage": ZEROS, "childrenUsage": {}}
    await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)


@pytest.mark.parametrize(
    ("data", "name", "release"),
    [
        ({"applicant_id": "a-1", "score": 396, "tier": "D"}, "score", False),
        ({"nested": {"a": [1, "b", None]}, "ü-key": 1.5}, "score", False),  # not flat
        ({"a": 1}, None, False),  # no name: left unset, as the constructor leaves it
        ({f"key-{i}-{'x' * i}": i for i in range(24)}, "score", False),
        ({"applicant_id": "a-1", "score": 396}, "score", True),  # released: the events
    ],
)
async def test_a_held_typed_answer_and_working_message_are_the_events_to_the_byte(
    monkeypatch: pytest.MonkeyPatch,
    data: dict[str, Any],
    name: str | None,
    release: bool,
) -> None:
    """The WORKING message held as its fields (``OneShotUpdater.work``) is built where it is
    kept: the task is the events' (its messages and status to the byte), and a released
    run's events carry the same message. The whole task is compared as a message, not as
    bytes: the answer's ``Struct`` is copied into the task once fewer than by the events, and
    a map's member order after a copy depends on the process's hash seed (both paths' orders
    are read back as the same task)."""
    from mesh._a2a import one_shot, updater

    tasks: list[Task] = []
    for held in (False, True):
        ids = iter(f"m-{n}" for n in range(1, 10))
        monkeypatch.setattr(one_shot, "uuid4_text", ids.__next__)
        monkeypatch.setattr(updater, "uuid4_text", ids.__next__)
        events = _events()
        if held:
            made: MeshTaskUpdater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message)
        else:
            await _submitted(events)
            made = MeshTaskUpdater(events, TASK, CONTEXT)
        await _typed_run(made, held, data, name, release and held)
        assert events.task is not None
        tasks.append(events.task)
    expected, built = tasks
    assert built.history[1].message_id == "m-1"
    assert built.status.state == TaskState.TASK_STATE_COMPLETED
    built.status.timestamp.CopyFrom(expected.status.timestamp)  # the one difference
    assert built == expected
    assert [m.SerializeToString() for m in built.history] == [
        m.SerializeToString() for m in expected.history
    ]
    assert built.status.SerializeToString() == expected.status.SerializeToString()
    assert built.metadata.SerializeToString() == expected.metadata.SerializeToString()


async def test_work_after_release_or_the_end_is_an_event_or_refused() -> None:
    """``work`` on a released run publishes its status at once; after the terminal one it is
    refused as ``update_status`` refuses it."""
    events = _events()
    updater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message)
    await updater.release()
    await updater.work("running skill 'score'")
    assert events.task is not None
    assert events.task.status.state == TaskState.TASK_STATE_WORKING
    assert [p.text for p in events.task.status.message.parts] == ["running skill 'score'"]
    assert events.task.status.message.role == Role.ROLE_AGENT
    await updater.update_status(TaskState.TASK_STATE_COMPLETED)
    with pytest.raises(RuntimeError, match="terminal"):
        await updater.work("again")
    held = OneShotUpdater(_events(), TASK, CONTEXT, None)
    await held.update_status(TaskState.TASK_STATE_COMPLETED)
    with pytest.raises(RuntimeError, match="terminal"):
        await held.work("again")


@pytest.mark.parametrize(
    "meta",
    [
        {"skill": "score", "traceparent": TRACE, "usage": ZEROS, "childrenUsage": {}},
        {"skill": "score", "caller": "coordinator"},  # no traceparent: the request's, or none
        {"skill": "score", "traceparent": "not a traceparent"},
    ],
)
async def test_a_settled_tasks_row_is_the_row_read_from_the_task(meta: dict[str, Any]) -> None:
    """The store writes a held run's final task's row from the values it was built from
    (``store._made_row``): the same columns ``_row`` reads from the task."""
    from mesh._a2a import store

    for request_trace in (None, "00-" + "d" * 32 + "-" + "e" * 16 + "-01"):
        events = _events()
        first = events._initial_message
        assert first is not None
        if request_trace is not None:
            first.metadata.update({"traceparent": request_trace})
        updater = OneShotUpdater(events, TASK, CONTEXT, first)
        await updater.work("running skill 'score'")
        await updater.add_artifact(
            answer_parts({"score": 1}, "", typed=True),
            artifact_id=f"answer-{TASK}",
            name="score",
            last_chunk=True,
        )
        await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
        settled = events._context.state[SETTLED] if events._context is not None else None
        assert isinstance(settled, Settled)
        assert settled.task is events.task
        data = settled.task.SerializeToString()
        made = store._made_row("owner", settled, data, 123)
        assert made == store._row("owner", settled.task, data, 123)
        if request_trace is not None:  # a trace id found: the task's, else the request's
            assert made[6] is not None


# --- a settled task's row written in protobuf's wire format (one_shot._task_wire) ------------

_TEXT = st.text(max_size=40)
_LEAF = st.one_of(
    _TEXT,
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
#: A request's data: nested objects, lists, empty values.
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_META = st.fixed_dictionaries(
    {"skill": _TEXT},
    optional={
        "caller": _TEXT,
        "traceparent": _TEXT,
        "callerTask": _TEXT,
        "usage": st.just(ZEROS),
        "childrenUsage": st.just({}),
    },
)


def _events_of(task_id: str, context_id: str) -> AppliedEvents:
    context = ServerCallContext()
    context.state[SINGLE_WRITE] = True
    return AppliedEvents(None, InMemoryTaskStore(), context, task_id=task_id, context_id=context_id)


@settings(max_examples=150, deadline=None)
@given(
    ids=st.tuples(*[st.text(min_size=1, max_size=40)] * 3),
    name=st.none() | _TEXT,
    data=st.dictionaries(_TEXT, _LEAF, max_size=8),
    request=st.dictionaries(_TEXT, _JSON, max_size=4),
    request_meta=st.dictionaries(_TEXT, _JSON, max_size=3),
    working=_TEXT,
    meta=_META,
)
def test_a_settled_tasks_row_parses_to_the_task_the_constructors_build(
    ids: tuple[str, str, str],
    name: str | None,
    data: dict[str, Any],
    request: dict[str, Any],
    request_meta: dict[str, Any],
    working: str,
    meta: dict[str, Any],
) -> None:
    """A held typed run's final task is written as its row's bytes and parsed
    (``one_shot._task_wire``): the row parses to the task today's constructors build
    (``OneShotUpdater._built``, whose ``SerializeToString`` was the row) as a message, its
    history, status and metadata to the byte; and to the task the events would have left."""
    from mesh._a2a import one_shot

    task_id, context_id, artifact_id = ids
    first = Message(role=Role.ROLE_USER, message_id="m-0", task_id=task_id, context_id=context_id)
    first.parts.add().data.struct_value.update(request)
    first.metadata.update(request_meta)

    async def run() -> tuple[Task, Settled | None, Task, Task]:
        held = OneShotUpdater(_events_of(task_id, context_id), task_id, context_id, first)
        await held.work(working)
        await held.add_artifact(
            answer_parts(data, json.dumps(data), typed=True), artifact_id=artifact_id, name=name
        )
        # What _final was given, for the constructors' task of the same updates.
        updates = list(held._held or [])
        await held.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
        events = held.events
        assert isinstance(events, AppliedEvents)
        assert events.task is not None
        settled = events._context.state.get(SETTLED) if events._context is not None else None
        last = one_shot._Status(
            TaskState.TASK_STATE_COMPLETED,
            None,
            events.task.status.timestamp.ToNanoseconds(),
            meta,
        )
        history: list[Any] = [first]
        history += [u.message for u in updates if isinstance(u, one_shot._Status) and u.message]
        artifacts = [u for u in updates if isinstance(u, one_shot._Artifact)]
        built = held._built(history, artifacts, [meta], last, one_shot._shape(meta))
        # The events' task: the run's updates published one by one (its WORKING message's id
        # and the artifact's id the held run's).
        by_events = _events_of(task_id, context_id)
        await by_events.enqueue_event(
            Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[first],
            )
        )
        for update in [*updates, last]:
            await by_events.enqueue_event(update.event(task_id, context_id))
        assert by_events.task is not None
        return events.task, settled, built, by_events.task

    task, settled, built, expected = asyncio.run(run())
    assert isinstance(settled, Settled)
    if any(
        text != text.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for text in ids
    ):
        return  # not UTF-8: built by the constructors (their refusal)
    assert settled.row is not None
    assert (
        Task.FromString(settled.row) == task == built == Task.FromString(built.SerializeToString())
    )
    assert task == expected
    assert [m.SerializeToString() for m in task.history] == [
        m.SerializeToString() for m in built.history
    ]
    assert task.status.SerializeToString() == built.status.SerializeToString()
    assert task.metadata.SerializeToString() == built.metadata.SerializeToString()
    assert task.metadata.SerializeToString() == expected.metadata.SerializeToString()


def _row_data(conn: sqlite3.Connection, task_id: str) -> bytes:
    data: bytes = conn.execute("SELECT data FROM a2a_tasks WHERE id = ?", (task_id,)).fetchone()[0]
    return data


async def test_a_settled_tasks_row_is_stored_as_written_and_read_back(tmp_path: Path) -> None:
    """The store writes a held typed run's row as ``Settled.row`` (not serialized again); what
    it reads back is the task. A history redacted before the save is serialized instead."""
    from mesh._a2a.store import SqliteTaskStore
    from mesh._sqlite import Database

    db = await Database.open(tmp_path / "tasks.db")
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        for n, redact in enumerate((False, True)):
            task_id = f"task-{n}"
            context = ServerCallContext()
            context.state[SINGLE_WRITE] = True
            first = _message("score me", f"m-{n}", Role.ROLE_USER)
            events = AppliedEvents(
                None, store, context, task_id=task_id, context_id=CONTEXT, initial_message=first
            )
            if redact:
                store.redact(task_id, f"m-{n}")
            updater = OneShotUpdater(events, task_id, CONTEXT, first)
            await updater.work("running skill 'score'")
            await updater.add_artifact(
                answer_parts({"score": 1, "tier": "ü"}, '{"score":1}', typed=True), name="score"
            )
            meta = {"skill": "score", "traceparent": TRACE, "usage": ZEROS, "childrenUsage": {}}
            await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
            settled = context.state[SETTLED]
            assert isinstance(settled, Settled)
            assert settled.row is not None
            stored = await db.read(functools.partial(_row_data, task_id=task_id))
            assert settled.task == events.task
            if redact:
                assert [p.text for p in settled.task.history[0].parts] == ["[redacted]"]
                assert stored == settled.task.SerializeToString()
            else:
                assert stored == settled.row
            assert Task.FromString(stored) == settled.task
            assert await store.get(task_id, context) == settled.task
    finally:
        await db.aclose()


async def test_a_request_nested_to_upbs_depth_settles_as_the_constructors_build_it() -> None:
    """A request whose data nests near upb's depth limit: the task's bytes nest one message
    deeper than the request's, so a parse of them may refuse what a copy of the request takes;
    the task is then built by the constructors, as before: the same task, or the same error."""
    outcomes = set()
    for depth in range(20, 45):
        data: Any = 1
        for _ in range(depth):
            data = {"a": data}
        first = _message("score me", "m-0", Role.ROLE_USER)
        first.parts.add().data.struct_value.update(data)
        try:
            expected: Any = Task(history=[first]).history[0]
        except Exception as exc:  # the copy's refusal
            expected = (type(exc), str(exc))
        context = ServerCallContext()
        context.state[SINGLE_WRITE] = True
        events = AppliedEvents(None, InMemoryTaskStore(), context, task_id=TASK, context_id=CONTEXT)
        updater = OneShotUpdater(events, TASK, CONTEXT, first)
        await updater.work("running skill 'score'")
        await updater.add_artifact(answer_parts({"score": 1}, '{"score":1}', typed=True))
        meta = {"skill": "score", "usage": ZEROS, "childrenUsage": {}}
        refused: Any = None
        try:
            await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
        except Exception as exc:
            refused = (type(exc), str(exc))
        if refused is not None:
            assert refused == expected  # the copy's error (its message names a Message)
            outcomes.add("refused")
            continue
        assert events.task is not None
        assert events.task.history[0] == expected
        settled = context.state[SETTLED]
        outcomes.add("parsed" if settled.row is not None else "built")
    assert {"parsed", "refused"} <= outcomes

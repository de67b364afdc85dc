"""Attack cases (session 31) on this session's hot-path cuts, each claiming no behaviour change:

* 1d55693 ``mesh._cli.log_lines``: ``LineFormatter.format`` writes ``FORMAT``'s four fields
  itself, ``LineHandler.emit`` flushes without ``StreamHandler.flush``;
* ec550aa the fast route writes a blocking send's answer from its task with the history cut
  as it is written (``send_answer_cut``, ``rpc_result(history_from=)``);
* 5892742 a session's state delta right after the turn's own create merges into the state
  the create inserted, without reading it back;
* 6d588a7 / 40fed5e ``OneShotUpdater`` holds an artifact (a status) as its keywords and
  builds it in the final task.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the behaviour of the tree before the commit differs; each says how); a break fixed since
is a passing test that names the commit that broke it and the one that fixed it. The references are the
standard library's ``logging.Formatter`` / ``StreamHandler``, the SDK route's answer of a node
with ``MESH_FASTPATH=0``, ``merge_state`` applied in order, and ``MeshTaskUpdater``'s events
applied by ``AppliedEvents`` (what a held run's task was built as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import random
import sqlite3
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvloop
from a2a.helpers import new_text_part
from a2a.types import Part, Role, SendMessageRequest, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict, ParseDict

import mesh._sqlite
from mesh import _timeouts
from mesh._a2a.fastpath import AppliedEvents
from mesh._a2a.fastpath_json import response_json, response_text, rpc_result
from mesh._a2a.idempotency import send_answer, send_answer_cut
from mesh._a2a.one_shot import OneShotUpdater
from mesh._a2a.updater import MeshTaskUpdater
from mesh._cli.log_lines import FORMAT, LineFormatter, LineHandler
from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session, merge_state
from mesh._sessions.sqlite import SqliteSessionStore, _Group
from mesh._sqlite import Database
from mesh._types import Content
from tests.test_node_fastpath import HEADERS, Pair, _norm, _send, fast_and_sdk
from tests.test_one_shot import CONTEXT, TASK, _events, _message

if TYPE_CHECKING:
    from mesh._pg import PgDatabase  # psycopg is optional: the PostgreSQL tests import it

# --- 1d55693: log lines ---------------------------------------------------------------------


class _Loud:
    """An argument whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _record(
    msg: Any, args: Any = None, level: int = logging.INFO, **extra: Any
) -> logging.LogRecord:
    record = logging.LogRecord("mesh.node", level, __file__, 1, msg, args, None)
    record.created = 1_764_642_000.123456
    record.msecs = 123.0
    record.__dict__.update(extra)
    return record


ODD_RECORDS: list[tuple[str, Any, dict[str, Any]]] = [
    ("task %s done in %.1f ms", ("t-1", 2.25), {}),
    ("a %(key)s and %(n)d", ({"key": "v", "n": 3},), {}),
    ("100% sure, no args", None, {}),
    ("100%% sure %s", ("x",), {}),
    (12345, None, {}),
    (["not", "a", "str"], None, {}),
    ("ünïcode \u2028 %s", ("🙂",), {}),
    ("level changed", None, {"levelname": ("tuple", "level")}),
    ("name changed", None, {"name": 7}),
    ("line\nbreak", None, {}),
]


@pytest.mark.parametrize(("msg", "args", "extra"), ODD_RECORDS)
def test_a_line_is_the_standard_formatters_text_for_odd_records(
    msg: Any, args: Any, extra: dict[str, Any]
) -> None:
    mine = _record(msg, args, **extra)
    theirs = logging.makeLogRecord(dict(mine.__dict__))
    assert LineFormatter(FORMAT).format(mine) == logging.Formatter(FORMAT).format(theirs)
    assert mine.__dict__ == theirs.__dict__


def test_a_record_that_cannot_be_written_raises_as_the_standard_formatter() -> None:
    for msg, args in (("%s", (_Loud(),)), ("%d items", ("many",)), ("%s %s", ("one",))):
        errors = []
        for formatter in (LineFormatter(FORMAT), logging.Formatter(FORMAT)):
            with pytest.raises(Exception) as info:  # noqa: PT011 - the type is compared below
                formatter.format(_record(msg, args))
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


def test_a_level_named_anew_is_written_with_its_new_name() -> None:
    level = 27
    logging.addLevelName(level, "NOTICE")
    try:
        mine = _record("custom", None, level=level, levelname=logging.getLevelName(level))
        theirs = _record("custom", None, level=level, levelname=logging.getLevelName(level))
        assert LineFormatter(FORMAT).format(mine) == logging.Formatter(FORMAT).format(theirs)
        assert " NOTICE mesh.node: custom" in LineFormatter(FORMAT).format(mine)
    finally:
        logging.addLevelName(level, f"Level {level}")


def test_a_traceback_or_stack_is_written_as_the_standard_formatter() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        info = sys.exc_info()
    for extra in ({"exc_info": info}, {"stack_info": "Stack (most recent call last):\n  x"}):
        mine = _record("failed", None, **extra)
        theirs = logging.makeLogRecord(dict(mine.__dict__))
        assert LineFormatter(FORMAT).format(mine) == logging.Formatter(FORMAT).format(theirs)


def test_a_date_format_set_after_the_formatter_is_made_is_used() -> None:
    # A break at 1d55693 (the line kept the default date), fixed by c825386.
    mine, theirs = LineFormatter(FORMAT), logging.Formatter(FORMAT)
    for formatter in (mine, theirs):
        formatter.datefmt = "%H:%M"
    assert mine.format(_record("dated")) == theirs.format(_record("dated"))


class _Upper(LineFormatter):
    """A formatter made from LineFormatter (it is in the module's ``__all__``) through
    ``logging.Formatter``'s documented hook for the message part, ``formatMessage``."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).upper()


def test_a_subclass_formatting_the_message_part_is_called() -> None:
    # Skipped at 1d55693 (never released so: c825386 asks the class's formatMessage).
    line = _Upper(FORMAT).format(_record("quiet %s", ("words",)))
    assert line.endswith("INFO MESH.NODE: QUIET WORDS")


def test_a_message_hook_set_on_the_formatter_itself_is_called() -> None:
    # Skipped at 1d55693 and c825386 (which asked the class only); fixed since.
    formatter = LineFormatter(FORMAT)
    hook = formatter.formatMessage
    formatter.formatMessage = lambda record: hook(record).upper()  # type: ignore[method-assign]
    assert formatter.format(_record("quiet")).endswith("INFO MESH.NODE: QUIET")


class _Stream:
    """A stream that records its calls (and may fail in one of them)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def write(self, text: str) -> int:
        self.calls.append(("write", text))
        if self.fail == "write":
            raise OSError("disk full")
        return len(text)

    def flush(self) -> None:
        self.calls.append(("flush", ""))
        if self.fail == "flush":
            raise OSError("pipe closed")


def _handled(
    kind: type[logging.StreamHandler],
    stream: Any,
    records: list[logging.LogRecord],  # type: ignore[type-arg]
) -> str:
    """What handling ``records`` wrote to stderr (handleError's report)."""
    handler = kind(stream)
    handler.setFormatter(LineFormatter(FORMAT))
    handler.addFilter(lambda record: "secret" not in record.getMessage())
    saved, sys.stderr = sys.stderr, io.StringIO()
    try:
        for record in records:
            handler.handle(record)
        return sys.stderr.getvalue()
    finally:
        sys.stderr = saved


@pytest.mark.parametrize("fail", [None, "write", "flush"])
@pytest.mark.parametrize("raise_exceptions", [True, False])
def test_the_handler_writes_flushes_and_fails_as_a_stream_handler(
    fail: str | None, raise_exceptions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging, "raiseExceptions", raise_exceptions)
    records = [_record("one %s", ("a",)), _record("a secret"), _record("two")]
    seen = []
    for kind in (LineHandler, logging.StreamHandler):
        stream = _Stream(fail)
        report = _handled(kind, stream, [logging.makeLogRecord(r.__dict__) for r in records])
        # The report's traceback names the handler's own frames: compare its shape.
        lines = [line for line in report.splitlines() if not line.startswith("  ")]
        seen.append((stream.calls, lines))
    assert seen[0] == seen[1]


def test_the_handler_on_a_closed_stream_reports_as_a_stream_handler() -> None:
    seen = []
    for kind in (LineHandler, logging.StreamHandler):
        stream = io.StringIO()
        stream.close()
        report = _handled(kind, stream, [_record("late")])
        seen.append([line for line in report.splitlines() if not line.startswith("  ")])
    assert seen[0] == seen[1]
    assert "ValueError: I/O operation on closed file" in seen[0]


def test_threads_logging_at_once_write_whole_lines() -> None:
    stream = io.StringIO()
    handler = LineHandler(stream)
    handler.setFormatter(LineFormatter(FORMAT))
    logger = logging.getLogger(f"s31.threads.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def burst(n: int) -> None:
        for i in range(300):
            logger.info("thread %d line %d %s", n, i, "x" * 200)

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1200
    assert all(line.endswith("x" * 200) and " INFO s31.threads." in line for line in lines)


# --- ec550aa: the blocking send's answer cut as it is written ------------------------------


def _params(config: dict[str, Any] | None, message_id: str = "m-sent") -> SendMessageRequest:
    raw: dict[str, Any] = {
        "message": {"role": "ROLE_USER", "messageId": message_id, "parts": [{"text": "hi"}]}
    }
    if config is not None:
        raw["configuration"] = config
    params = SendMessageRequest()
    ParseDict(raw, params)
    return params


def _task(history_ids: list[str], *, status: bool = True, metadata: bool = True) -> Task:
    task = Task(id="t-1", context_id="c-1")
    if status:
        task.status.state = TaskState.TASK_STATE_COMPLETED
        task.status.message.CopyFrom(_message("done", "m-status"))
    for mid in history_ids:
        role = Role.ROLE_USER if mid.startswith("m-sent") else Role.ROLE_AGENT
        task.history.append(_message(f"text of {mid}", mid, role))
        task.history[-1].metadata.update({"z": 1, "a": {"nested": [1, "x"]}, "m": "v"})
    artifact = task.artifacts.add(artifact_id="answer-t-1", name="echo")
    artifact.parts.append(Part(text="answer"))
    artifact.parts.add().data.struct_value.update({"k": 1, "b": 2.5, "q": None})
    if metadata:
        task.metadata.update({"skill": "echo", "usage": {"inputTokens": 0}, "childrenUsage": {}})
    return task


HISTORIES = [
    [],
    ["m-sent"],
    ["m-sent", "m-1"],
    ["m-0", "m-sent", "m-1", "m-2"],
    ["m-sent", "m-1", "m-sent", "m-2"],  # the caller's id twice: after the last one
    ["m-0", "m-1"],  # the caller's message not in the history
    ["m-0", "m-1", "m-sent"],  # the caller's message last
]
CONFIGS: list[dict[str, Any] | None] = [
    None,
    {},
    {"historyLength": 0},
    {"historyLength": 1},
    {"historyLength": 2},
    {"historyLength": 3},
    {"historyLength": 100},
    {"historyLength": -1},
    {"historyLength": -5},
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("shape", ["full", "no-status", "no-metadata"])
def test_the_cut_answer_is_send_answers_task(
    config: dict[str, Any] | None, history: list[str], shape: str
) -> None:
    task = _task(history, status=shape != "no-status", metadata=shape != "no-metadata")
    params = _params(config)
    stored = task.SerializeToString()
    before = send_answer(task, params)
    answer, start = send_answer_cut(task, params)
    cut = rpc_result(answer, 7, history_from=start)
    assert task.SerializeToString() == stored  # the task itself is left whole
    expected = {"result": response_json(before), "id": 7, "jsonrpc": "2.0"}
    assert json.loads(cut) == expected
    # The members in the order MessageToDict lists them, at every level but a map's.
    assert list(json.loads(cut)["result"]["task"]) == list(MessageToDict(before))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("s31-fast")
    with fast_and_sdk(
        tmp, "tests.node_agents:agent", file_var="NODE_TEST_CALLS", suffix=".calls"
    ) as served:
        yield served


async def _answers(
    http: httpx.AsyncClient, pair: Pair, path: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    got = []
    for url in (pair.fast, pair.sdk):
        response = await http.post(url + path, json=body, headers=HEADERS)
        assert response.status_code == 200, response.text
        got.append(response.json())
    return got


@pytest.mark.integration
@pytest.mark.parametrize(
    "config",
    [None, {"historyLength": 0}, {"historyLength": 1}, {"historyLength": 2}, {"historyLength": 3}],
)
async def test_answers_replays_and_stored_tasks_are_the_sdk_routes(
    pair: Pair, http: httpx.AsyncClient, config: dict[str, Any] | None
) -> None:
    """Each binding's answer, the replay of its message id under every other history length,
    and GetTask (its whole history) afterwards: the same on the fast node as on the SDK's."""
    mid = f"s31-{uuid.uuid4().hex}"
    body = _send({"key": "k", "n": 2}, "echo", message_id=mid, config=config)
    fast, sdk = await _answers(http, pair, "/", body)
    assert _norm(fast) == _norm(sdk)
    assert list(fast) == list(sdk)
    assert list(fast["result"]["task"]) == list(sdk["result"]["task"])
    tasks = [fast["result"]["task"]["id"], sdk["result"]["task"]["id"]]
    for other in CONFIGS[:7]:
        again = _send({"key": "k", "n": 2}, "echo", message_id=mid, config=other)
        replay_fast, replay_sdk = await _answers(http, pair, "/", again)
        assert _norm(replay_fast) == _norm(replay_sdk), other
        assert [replay_fast["result"]["task"]["id"], replay_sdk["result"]["task"]["id"]] == tasks
        rest = dict(again["params"])
        rest_fast, rest_sdk = await _answers(http, pair, "/a2a/rest/message:send", rest)
        assert _norm(rest_fast) == _norm(rest_sdk), other
        assert _norm(rest_fast) == _norm(replay_fast["result"])
    for url, task_id in zip((pair.fast, pair.sdk), tasks, strict=True):
        get = {"jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": task_id}}
        stored = (await http.post(url + "/", json=get, headers=HEADERS)).json()["result"]
        assert [m["role"] for m in stored["history"]] == ["ROLE_USER", "ROLE_AGENT"]
        assert stored["history"][0]["messageId"] == mid


# --- 5892742: a state delta right after the turn's own create --------------------------------


def _event(author: str, delta: dict[str, Any] | None = None) -> Event:
    return Event(author=author, content=Content.user(f"from {author}"), state_delta=delta or {})


# Each step: (durable, delta or None); every sequence starts with create(durable=False).
SEQUENCES: dict[str, list[tuple[bool, dict[str, Any] | None]]] = {
    "create-delta": [(False, {"b": 1}), (True, None)],
    "create-deltas": [
        (False, {"b": 1}),
        (False, {"a": None, "c": {"x": 1}}),
        (False, None),
        (True, {"c": {"y": 2}, "b": [1, 2]}),
    ],
    "create-event-delta": [(False, None), (False, {"peer": "ctx-9"}), (True, None)],
    "create-events-deltas": [
        (False, None),
        (False, None),
        (False, {"peer": "ctx-9"}),
        (False, {"peer": "ctx-10", "n": 2}),
        (False, None),
        (True, None),
    ],
    "create-durable-delta": [(True, {"b": 1})],
    "create-event-durable-delta": [(False, None), (True, {"b": 1})],
}


async def _turn(
    store: SqliteSessionStore, steps: list[tuple[bool, dict[str, Any] | None]], state: Any
) -> tuple[Session, list[Event]]:
    session = await store.create("u1", "s1", state, durable=False)
    events = []
    for i, (durable, delta) in enumerate(steps):
        event = _event(f"a{i}", delta)
        events.append(event)
        session = await store.append_event(session, event, durable=durable)
    await store.sync(session)
    return session, events


def _row(path: Path) -> tuple[Any, ...] | None:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "select state, created_at, updated_at from mesh_sessions where user_id='u1' and id='s1'"
        ).fetchone()
    finally:
        conn.close()


#: The state another process stored in the row first (``existing``).
OTHER_PROCESS: dict[str, Any] = {"other": "process", "a": 5}


def _merged(
    state: dict[str, Any], steps: list[tuple[bool, dict[str, Any] | None]]
) -> dict[str, Any]:
    """A copy of ``state`` with each step's delta merged in order (``merge_state`` merges in
    place): what the row must hold after."""
    merged = dict(state)
    for _, delta in steps:
        if delta:
            merge_state(merged, delta)
    return merged


async def _read_back(db: Database | PgDatabase) -> Session:
    """Session s1 of u1 as ``db`` (just opened: read from disk) holds it; ``db`` closed."""
    try:
        stored = await SqliteSessionStore(db).get("u1", "s1")
    finally:
        await db.aclose()
    assert stored is not None
    return stored


@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("name", list(SEQUENCES))
async def test_a_turns_state_on_disk_is_every_delta_merged_in_order(
    tmp_path: Path, name: str, existing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row's state after the turn (reopened from disk) is its state before (the create's,
    or the one another process inserted first) with each delta merged in order, its
    created_at the first insert's, its updated_at the last event's; the events in order."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)  # the turn's writes in one group
    path = tmp_path / "node.db"
    steps = SEQUENCES[name]
    initial = {"a": 1, "c": {"z": 0}}
    db = await Database.open(path)
    try:
        store = SqliteSessionStore(db)
        await store.count()  # the schema
        if existing:
            conn = sqlite3.connect(path)
            conn.execute(
                "insert into mesh_sessions (user_id, id, state, created_at, updated_at) "
                "values ('u1', 's1', ?, 1.0, 2.0)",
                (json.dumps(OTHER_PROCESS),),
            )
            conn.commit()
            conn.close()
        session, events = await _turn(store, steps, initial)
    finally:
        await db.aclose()
    expected = _merged(OTHER_PROCESS if existing else initial, steps)
    row = _row(path)
    assert row is not None
    assert json.loads(row[0]) == expected
    assert row[1] == (1.0 if existing else session.created_at)
    assert row[2] == session.updated_at
    stored = await _read_back(await Database.open(path))
    assert stored.state == expected
    assert stored.events == events
    if not existing:
        assert session.state == expected  # what the turn holds is what is stored


async def test_a_turns_group_that_fails_leaves_nothing_and_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the turn's group failing after the create and the delta (a trigger refuses
    its event): nothing of the turn is on disk, the turn's sync raises, and a turn after it
    (the create again) stores its own state, not the failed one's."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    path = tmp_path / "node.db"
    db = await Database.open(path)
    try:
        store = SqliteSessionStore(db)
        await store.count()
        conn = sqlite3.connect(path)
        conn.execute(
            "create trigger refuse before insert on mesh_session_events "
            "when new.author = 'refused' begin select raise(abort, 'refused by trigger'); end"
        )
        conn.commit()
        conn.close()
        session = await store.create("u1", "s1", {"a": 1}, durable=False)
        session = await store.append_event(session, _event("ok", {"b": 1}), durable=False)
        session = await store.append_event(session, _event("refused", {"c": 1}), durable=False)
        db.flush()  # now, not after DEFER_S
        with pytest.raises(StoreError):
            await store.sync(session)
        assert _row(path) is None
        again = await store.create("u1", "s1", {"a": 2}, durable=False)
        again = await store.append_event(again, _event("ok", {"d": 1}), durable=True)
    finally:
        await db.aclose()
    row = _row(path)
    assert row is not None
    assert json.loads(row[0]) == {"a": 2, "d": 1}


# --- 6d588a7 / 40fed5e: a held run's artifacts and status built in its final task ----------

Script = Callable[[MeshTaskUpdater], Awaitable[None]]


async def _submitted() -> AppliedEvents:
    """Events whose first is the new task, submitted with its message (as the executor makes
    it for a run whose events are not held)."""
    events = _events()
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
    return events


async def _by_events(script: Script) -> Task | None:
    """The task ``script``'s updates leave as events (what a held run's task is built as)."""
    events = await _submitted()
    await script(MeshTaskUpdater(events, TASK, CONTEXT))
    return events.task


async def _held(script: Script) -> tuple[Task | None, OneShotUpdater]:
    events = _events()
    updater = OneShotUpdater(events, TASK, CONTEXT, events._initial_message)
    await script(updater)
    return events.task, updater


def _same_task(held: Task | None, expected: Task | None) -> None:
    assert held is not None
    assert expected is not None
    held.status.timestamp.CopyFrom(expected.status.timestamp)  # made a moment apart
    assert MessageToDict(held) == MessageToDict(expected)
    assert held.SerializeToString() == expected.SerializeToString()


def _parts() -> list[Part]:
    data = Part(media_type="application/json")
    data.data.struct_value.update({"z": 1, "a": [1, "x", None], "m": {"k": True}})
    raw = Part(raw=b"\x00\x01pdf", media_type="application/pdf", filename="offer.pdf")
    url = Part(url="https://example.com/x.png", media_type="image/png", filename="x.png")
    return [new_text_part("a note"), data, raw, url]


async def test_several_artifacts_replaced_and_failed_runs_are_the_events_task() -> None:
    async def script(updater: MeshTaskUpdater) -> None:
        await updater.start_work(_message("running", "m-1"))
        await updater.add_artifact(
            _parts(), artifact_id="a-1", name="first", metadata={"d": "x", "n": 1},
            extensions=["urn:x"], last_chunk=True,
        )  # fmt: skip
        await updater.add_artifact([new_text_part("b")], artifact_id="a-2", name="second")
        await updater.add_artifact([new_text_part("a again")], artifact_id="a-1", name="again")
        await updater.add_artifact([new_text_part("no id")])  # an id made for it
        await updater.update_status(
            TaskState.TASK_STATE_FAILED,
            message=_message("it broke", "m-2"),
            metadata={"error": {"reason": "failed", "message": "it broke"}, "skill": "s"},
        )

    expected = await _by_events(script)
    held, updater = await _held(script)
    assert not updater.held
    assert held is not None
    assert expected is not None
    # The made id differs run to run: the same place, a uuid each.
    assert len(held.artifacts) == len(expected.artifacts) == 3
    held.artifacts[2].artifact_id = expected.artifacts[2].artifact_id
    _same_task(held, expected)


async def test_a_held_artifact_released_by_a_question_is_the_events_one() -> None:
    """Released (an interrupted state) after an artifact was held: the subscriber's events
    and the task they leave are the ones its updates published as events."""

    async def script(updater: MeshTaskUpdater) -> None:
        await updater.start_work(_message("running", "m-1"))
        await updater.add_artifact(
            _parts(), artifact_id="a-1", name="first", metadata={"d": "x"}, last_chunk=False
        )
        await updater.update_status(
            TaskState.TASK_STATE_INPUT_REQUIRED, message=_message("which one?", "m-2")
        )
        await updater.add_artifact(
            [new_text_part(" more")], artifact_id="a-1", append=True, last_chunk=True
        )

    expected = await _by_events(script)
    held, updater = await _held(script)
    assert not updater.held
    _same_task(held, expected)


async def _mutated_after_add(updater: MeshTaskUpdater, what: str) -> None:
    parts = [new_text_part("as added")]
    metadata: dict[str, Any] = {"description": "as added"}
    await updater.start_work(_message("running", "m-1"))
    await updater.add_artifact(parts, artifact_id="a-1", name="note", metadata=metadata)
    # The caller's own objects, changed after the artifact was added (a list reused for the
    # next artifact, a dict filled in for the next one).
    if what == "list":
        parts.append(new_text_part("added later"))
    elif what == "part":
        parts[0].text = "changed later"
    else:
        metadata["description"] = "changed later"
    await updater.update_status(TaskState.TASK_STATE_COMPLETED)


@pytest.mark.parametrize("what", ["list", "part", "metadata"])
async def test_an_artifact_is_what_was_added_not_what_its_objects_became(what: str) -> None:
    # A break at 6d588a7 (the artifact built at the terminal update from the caller's
    # objects), undone by 1e59e37.
    async def script(updater: MeshTaskUpdater) -> None:
        await _mutated_after_add(updater, what)

    expected = await _by_events(script)
    held, _ = await _held(script)
    _same_task(held, expected)


async def _bad_name(updater: MeshTaskUpdater) -> list[str]:
    """An artifact the SDK's Artifact cannot be built from (a name that is no str), then the
    run ended as FAILED, as the executor ends a run that raised: what each step raised."""
    seen = []
    await updater.start_work(_message("running", "m-1"))
    try:
        await updater.add_artifact([new_text_part("x")], artifact_id="a-1", name=7)  # type: ignore[arg-type]
        seen.append("added")
        await updater.update_status(TaskState.TASK_STATE_COMPLETED)
        seen.append("completed")
    except Exception as exc:
        seen.append(f"raised {type(exc).__name__}")
        try:
            await updater.update_status(
                TaskState.TASK_STATE_FAILED, message=_message("it broke", "m-2")
            )
            seen.append("failed")
        except Exception as again:
            seen.append(f"then {type(again).__name__}: {again}")
    return seen


async def test_an_artifact_that_cannot_be_built_fails_at_once_and_the_run_can_end() -> None:
    # A break at 6d588a7 (raised at the terminal update, the updater already ended: the run
    # could not end FAILED and never settled), undone by 1e59e37.
    expected_events = await _submitted()
    expected = await _bad_name(MeshTaskUpdater(expected_events, TASK, CONTEXT))
    held_events = _events()
    updater = OneShotUpdater(held_events, TASK, CONTEXT, held_events._initial_message)
    seen = await _bad_name(updater)
    assert seen == expected
    assert expected_events.task is not None
    assert expected_events.task.status.state == TaskState.TASK_STATE_FAILED
    assert held_events.task is not None
    assert held_events.task.status.state == TaskState.TASK_STATE_FAILED


@pytest.mark.postgres
@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("name", ["create-deltas", "create-events-deltas", "create-event-delta"])
async def test_a_turns_state_on_postgres_is_every_delta_merged_in_order(
    pg_database: str, name: str, existing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on PostgreSQL (the row count read in a pipeline), with a write of another
    write failing first in the turn's batch (the server skips the turn's group's statements,
    which run again: its create's row count read twice)."""
    from mesh._pg import PgDatabase

    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    runs: list[int] = []
    group_call = _Group.__call__

    def counted(self: _Group, conn: Any) -> None:
        runs.append(1)
        group_call(self, conn)

    monkeypatch.setattr(_Group, "__call__", counted)
    steps = SEQUENCES[name]
    initial = {"a": 1, "c": {"z": 0}}
    db = await PgDatabase.open(pg_database)
    try:
        store = SqliteSessionStore(db)
        await store.count()
        if existing:
            await db.write(
                lambda conn: conn.execute(
                    "insert into mesh_sessions (user_id, id, state, created_at, updated_at) "
                    "values (?, ?, ?, ?, ?)",
                    ("u1", "s1", json.dumps(OTHER_PROCESS), 1.0, 2.0),
                )
            )
        # First in the batch, a statement the server refuses: its error shows at the turn's
        # group's first read, whose statements the server skipped: the group runs again.
        refused = db.write_soon(lambda conn: conn.execute("insert into s31_no_table values (1)"))
        session = await store.create("u1", "s1", initial, durable=False)
        events = []
        for i, (_, delta) in enumerate(steps):
            event = _event(f"a{i}", delta)
            events.append(event)
            session = await store.append_event(session, event, durable=False)
        db.flush()
        await store.sync(session)
        assert refused.exception() is not None
        assert 1 <= len(runs) <= 2  # mostly twice: the group's statements skipped once
    finally:
        await db.aclose()
    expected = _merged(OTHER_PROCESS if existing else initial, steps)
    stored = await _read_back(await PgDatabase.open(pg_database))
    assert stored.state == expected
    assert stored.events == events
    assert stored.created_at == (1.0 if existing else session.created_at)
    assert stored.updated_at == session.updated_at


class _Synced(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that makes every line durable: its ``flush`` (the hook ``StreamHandler.emit``
    calls after each line) also counts, where an fsync would go."""

    flushed = 0

    def flush(self) -> None:
        type(self).flushed += 1
        super().flush()


class _SyncedLines(LineHandler):
    flushed = 0

    def flush(self) -> None:
        type(self).flushed += 1
        super().flush()


def test_a_handler_subclass_flush_is_called_for_each_line() -> None:
    # Not called at 1d55693 (LineHandler.emit flushed the stream itself); fixed since.
    for kind in (_Synced, _SyncedLines):
        handler = kind(io.StringIO())
        handler.setFormatter(LineFormatter(FORMAT))
        for n in range(3):
            handler.handle(_record("line %d", (n,)))
    assert _SyncedLines.flushed == _Synced.flushed == 3


STATUS_RUNS = ["asked-twice", "working-metadata-only", "caller-times", "offset-time", "no-message"]


async def _statuses(updater: MeshTaskUpdater, run: str) -> None:
    """Status sequences of a held run (40fed5e: its final status from keywords, its one
    status's metadata given to Task as built, two or more merged in order)."""
    if run == "asked-twice":
        await updater.start_work(_message("running", "m-1"))
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            message=_message("resuming", "m-2"),
            metadata={"urn:mesh:tasks:v1": {"questions": []}, "skill": "s"},
        )
        await updater.update_status(
            TaskState.TASK_STATE_COMPLETED,
            metadata={"skill": "s2", "usage": {"inputTokens": 0}, "extra": [1, "x", None]},
        )
    elif run == "working-metadata-only":
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            message=_message("running", "m-1"),
            metadata={"b": "1", "a": "2", "c": {"inputTokens": 0, "outputTokens": 0}},
        )
        await updater.update_status(TaskState.TASK_STATE_CANCELED)
    elif run == "caller-times":
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, timestamp="1999-12-31T23:59:59.999999Z"
        )
        await updater.update_status(
            TaskState.TASK_STATE_FAILED,
            message=_message("late", "m-2"),
            timestamp="2026-12-02T03:00:00Z",
            metadata={},
        )
    elif run == "offset-time":
        await updater.update_status(
            TaskState.TASK_STATE_REJECTED, timestamp="2026-12-02T05:30:00.5+02:30"
        )
    else:
        await updater.start_work()
        await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata={"k": 1.5})


@pytest.mark.parametrize("run", STATUS_RUNS)
async def test_a_held_runs_statuses_are_the_events_task_to_the_byte(run: str) -> None:
    async def script(updater: MeshTaskUpdater) -> None:
        await _statuses(updater, run)

    expected = await _by_events(script)
    held, updater = await _held(script)
    assert not updater.held
    assert held is not None
    assert expected is not None
    if run in ("caller-times", "offset-time"):  # the caller's time: the same to the ns
        assert held.status.timestamp == expected.status.timestamp
    _same_task(held, expected)


def test_cut_answers_of_random_tasks_are_send_answers() -> None:
    """ec550aa on 3000 random tasks and requests (seeded): histories of 0-6 messages whose ids
    repeat or are empty, the caller's id anywhere or nowhere, with or without a status, any
    history length: both bindings' text is the JSON of send_answer's task, members in order."""
    rng = random.Random(31)
    for _ in range(3000):
        ids = [rng.choice(["m-sent", "m-0", "m-1", ""]) for _ in range(rng.randrange(7))]
        task = _task(ids, status=rng.random() < 0.8, metadata=rng.random() < 0.7)
        if rng.random() < 0.2:
            del task.artifacts[:]
        config = rng.choice([None, {}, {"historyLength": rng.randrange(-3, 9)}])
        params = _params(config, message_id=rng.choice(["m-sent", "m-0", ""]))
        before = send_answer(task, params)
        answer, start = send_answer_cut(task, params)
        expected = response_json(before)
        rest = json.loads(response_text(answer, history_from=start))
        rpc = json.loads(rpc_result(answer, "r-1", history_from=start))
        assert rest == expected == rpc["result"]
        assert list(rest["task"]) == list(MessageToDict(before))


async def test_random_turns_store_every_delta_merged_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5892742 on 150 seeded random turns in one file: a create (of a new row, or of one
    another connection inserted), then 1-6 events with or without a delta (some deleting a
    key to None, some nested), queued or durable, several turns' groups in one batch: each
    session's stored state is its deltas merged in order, its events all there in order."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    rng = random.Random(5892742)
    path = tmp_path / "node.db"
    expected: dict[str, dict[str, Any]] = {}
    sent: dict[str, list[Event]] = {}
    db = await Database.open(path)
    try:
        store = SqliteSessionStore(db)
        await store.count()
        for n in range(150):
            sid = f"s{n}"
            state: dict[str, Any] = {"a": 1, "n": n} if rng.random() < 0.5 else {}
            if rng.random() < 0.3:
                there = {"other": n, "a": "theirs"}
                conn = sqlite3.connect(path)
                conn.execute(
                    "insert into mesh_sessions (user_id, id, state, created_at, updated_at) "
                    "values ('u1', ?, ?, 1.0, 2.0)",
                    (sid, json.dumps(there)),
                )
                conn.commit()
                conn.close()
                state_on_disk = dict(there)
            else:
                state_on_disk = dict(state)
            session = await store.create("u1", sid, state or None, durable=False)
            events = []
            for i in range(rng.randrange(1, 7)):
                delta = rng.choice(
                    [None, None, {"peer": f"ctx-{i}"}, {"a": None}, {"deep": {"i": i}}]
                )
                event = _event(f"e{i}", delta)
                events.append(event)
                if delta:
                    state_on_disk = merge_state(state_on_disk, delta)
                session = await store.append_event(session, event, durable=rng.random() < 0.15)
            if rng.random() < 0.5:  # else it rides in the next turns' batch
                db.flush()
                await store.sync(session)
            expected[sid] = state_on_disk
            sent[sid] = events
        db.flush()
        for sid in expected:
            await store.sync(Session.new("u1", sid))
    finally:
        await db.aclose()
    db = await Database.open(path)
    try:
        reopened = SqliteSessionStore(db)
        for sid, state in expected.items():
            stored = await reopened.get("u1", sid)
            assert stored is not None
            assert stored.state == state, sid
            assert stored.events == sent[sid], sid
    finally:
        await db.aclose()


# --- ab2d810: the executor's deadline scopes as mesh._timeouts.timeout_at ------------------

AT_KINDS: list[Callable[[float | None], Any]] = [asyncio.timeout_at, _timeouts.timeout_at]


async def _entered(stack: contextlib.AsyncExitStack, scope: Any) -> Any:
    """``async with`` for asyncio's scope, ``with`` for mesh's (as the executor enters it)."""
    if isinstance(scope, _timeouts.timeout):
        return stack.enter_context(scope)
    return await stack.enter_async_context(scope)


async def _story(kind: Callable[[float | None], Any], uv: bool) -> list[Any]:
    """What the executor does with a skill's deadline scope: expire it from another task
    (stop()), move it to never and back, leave it early, enter it past due, swallow the
    cancellation, and reschedule it in every state."""
    del uv
    seen: list[Any] = []
    loop = asyncio.get_running_loop()

    async def run(when: float | None, cut_after: float | None, swallow: bool = False) -> Any:
        scopes: list[Any] = []

        async def body() -> str:
            async with contextlib.AsyncExitStack() as stack:
                scope = await _entered(stack, kind(when))
                scopes.append(scope)
                try:
                    await asyncio.sleep(0.3)
                except asyncio.CancelledError:
                    if not swallow:
                        raise
                    return "swallowed"
            return "done"

        task = asyncio.create_task(body())
        await asyncio.sleep(0)
        if cut_after is not None:
            await asyncio.sleep(cut_after)
            scope = scopes[0]
            if not scope.expired():
                scope.reschedule(loop.time())  # stop()'s
        try:
            result: Any = await task
        except BaseException as exc:
            result = type(exc).__name__
        scope = scopes[0]
        try:
            scope.reschedule(loop.time())
            again = "moved"
        except RuntimeError as exc:
            again = str(exc)
        return (result, scope.expired(), again)

    seen.append(("stopped", await run(loop.time() + 5, 0.01)))
    seen.append(("stopped, no deadline", await run(None, 0.01)))
    seen.append(("past due", await run(loop.time() - 1, None)))
    seen.append(("due", await run(loop.time() + 0.02, None)))
    seen.append(("left early", await run(loop.time() + 5, None)))
    seen.append(("swallowed", await run(loop.time() + 0.02, None, swallow=True)))

    # Moved to never, then back to now, from inside.
    async def moved() -> str:
        async with contextlib.AsyncExitStack() as stack:
            scope = await _entered(stack, kind(loop.time() + 0.01))
            scope.reschedule(None)
            await asyncio.sleep(0.05)
            first = scope.expired()
            scope.reschedule(loop.time() + 0.01)
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                return f"cancelled {first}"
        return "not cut"

    try:
        seen.append(("moved", await asyncio.create_task(moved())))
    except BaseException as exc:
        seen.append(("moved", type(exc).__name__))

    # While expiring (cancelled, not yet left): reschedule refuses.
    async def expiring() -> str:
        async with contextlib.AsyncExitStack() as stack:
            scope = await _entered(stack, kind(loop.time() - 1))
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                try:
                    scope.reschedule(None)
                except RuntimeError as exc:
                    return str(exc)
                return "moved while expiring"
        return "not cut"

    seen.append(("expiring", await asyncio.create_task(expiring())))
    created = kind(loop.time())
    try:
        created.reschedule(None)
        seen.append(("created", "moved"))
    except RuntimeError as exc:
        seen.append(("created", str(exc)))
    return seen


@pytest.mark.parametrize("uv", [False, True])
def test_a_skills_deadline_scope_is_asyncio_timeout_ats(uv: bool) -> None:
    """The same outcome, expired() and reschedule() answers as asyncio.timeout_at (entered
    with async with) for mesh's (entered with with, as the executor does) in every use the
    executor makes and a few it does not: cut from another task (stop()), past due, due,
    left early, cancellation swallowed, moved to never and back, rescheduled while expiring,
    after leaving and before entering. Holds (the one API difference: asyncio's when() is a
    method, mesh's when a float attribute; mesh calls neither)."""
    stories = [
        uvloop.run(_story(kind, uv)) if uv else asyncio.run(_story(kind, uv)) for kind in AT_KINDS
    ]
    assert stories[1] == stories[0]


async def _stop_many(kind: Callable[[float | None], Any]) -> tuple[list[str], str, float]:
    """stop() over 50 running scopes (each moved to now), while one more scope, not moved,
    is due 0.1 s later: every moved one cut, the other on its own time."""
    loop = asyncio.get_running_loop()
    scopes: list[Any] = []

    async def body(when: float) -> str:
        try:
            async with contextlib.AsyncExitStack() as stack:
                scopes.append(await _entered(stack, kind(when)))
                await asyncio.sleep(2)
        except TimeoutError:
            return "timeout"
        return "done"

    tasks = [asyncio.create_task(body(loop.time() + 5 + i / 100)) for i in range(50)]
    await asyncio.sleep(0.01)
    started = loop.time()
    other = asyncio.create_task(body(started + 0.1))
    await asyncio.sleep(0)
    now = loop.time()
    for scope in scopes[:50]:
        if not scope.expired():
            scope.reschedule(now)
    cut = list(await asyncio.gather(*tasks))
    last = await other
    return cut, last, loop.time() - started


@pytest.mark.parametrize("uv", [False, True])
def test_stop_cuts_every_running_scope_and_leaves_the_others_on_time(uv: bool) -> None:
    for kind in AT_KINDS:
        cut, last, took = uvloop.run(_stop_many(kind)) if uv else asyncio.run(_stop_many(kind))
        assert cut == ["timeout"] * 50, kind
        assert last == "timeout", kind
        assert 0.09 <= took < 1.0, kind

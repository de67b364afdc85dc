"""Attack cases (session 33) on this session's changes, each claiming no behaviour change:

* 1a88c36 ``mesh._sqlite``: a batch's own statement (its COMMIT, a savepoint's rollback)
  interrupted past ``LOOP_BUDGET_S`` sends the batch to the thread, to run again whole. SQLite
  also calls the progress handler after a statement's last step (``vdbe_return``), so a COMMIT
  can be interrupted after it committed (``in_transaction`` False, the rows on disk): the batch
  then ran a second time (fixed by 414aedc: such a COMMIT is the batch's success; which broke
  a failed COMMIT, rolled back and then interrupted, into 'committed': fixed by 46519bb, the
  COMMIT runs without the handler);
* 53a1f2a an LLM turn's first save held until its final one or ``DEFER_S``;
* 28a9da9 / e209202 a typed answer written from the values its task was built from
  (``fastpath_json.Settled``) and the member orders kept for that.

Nodes of ``git archive b9dadd4`` run with PYTHONSAFEPATH=1 (``_env``): ``python -m`` and ``-c``
put the working directory first on sys.path, and a child started in the checkout (as
tests.support starts them) would import the checkout's ``mesh`` before PYTHONPATH's tree.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the behaviour of the tree before the commit, ``git archive b9dadd4``, differs; each says how);
a break fixed since is a passing test naming the commit that broke it and the one that fixed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import mesh._sqlite
from mesh._errors import StoreError
from mesh._events import Content, Event
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from tests.support import (
    ROOT,
    Proc,
    archived_tree,
    clean_env,
    free_port,
    running,
    wait_until_ok,
)

# --- 1a88c36: a COMMIT interrupted past the loop's budget -----------------------------------

LOG = "create table if not exists log (seq integer primary key autoincrement, k text not null);"


def _logged(path: Path) -> list[str]:
    """The keys another process sees in ``log``, in order (a write run twice: twice)."""
    conn = sqlite3.connect(path)
    try:
        return [k for (k,) in conn.execute("select k from log order by seq")]
    finally:
        conn.close()


def _log(key: str, *, burn_s: float = 0.0) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        conn.execute("insert into log (k) values (?)", (key,))
        if burn_s:  # the batch's time passes after its statements: its COMMIT meets the budget
            time.sleep(burn_s)

    return run


def _budget_checked_after_a_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress handler every 3 steps: a COMMIT is 3 (Init, Goto, AutoCommit), so the
    handler's look comes after its last step, as SQLite's ``vdbe_return`` makes it (with
    ``_PROGRESS_OPS`` 10,000 the cached COMMIT crosses a multiple every ~3,333 runs, about
    one crossing in three there: ``test_writes_past_the_budget_at_the_real_interval_...``)."""
    monkeypatch.setattr(mesh._sqlite, "_PROGRESS_OPS", 3)
    monkeypatch.setattr(mesh._sqlite, "LOOP_BUDGET_S", 0.01)


def test_sqlite_interrupts_a_commit_after_it_committed() -> None:
    """What 1a88c36's premise ('SQLite 3.40 interrupts COMMIT before it commits') misses:
    the handler's look after the COMMIT's last step reports SQLITE_INTERRUPT with the
    transaction committed (the row visible to another connection, none open)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("create table t (x integer)")
        armed = [False]
        conn.set_progress_handler(lambda: armed[0], 3)
        conn.execute("begin immediate")
        conn.execute("insert into t values (1)")
        armed[0] = True
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            conn.execute("commit")
        armed[0] = False
        assert not conn.in_transaction
        assert conn.execute("select count(*) from t").fetchone()[0] == 1
    finally:
        conn.close()


@pytest.mark.parametrize("writes", [1, 2])
async def test_a_commit_interrupted_after_it_committed_commits_its_writes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: int
) -> None:
    """One write (``_run_one``), or two and a read in a batch (``_run_batch``: savepoints;
    the read takes the time, so the COMMIT is the first statement past the budget): committed
    once and reported committed. Broken by 1a88c36 (the batch ran again on the thread: each
    write committed twice; b9dadd4 committed once but told the caller 'interrupted'), fixed
    by 414aedc."""
    _budget_checked_after_a_commit(monkeypatch)
    db = await Database.open(tmp_path / "node.db")
    await db.ensure_schema("log", LOG)
    keys = [f"k{i}" for i in range(writes)]
    try:
        if writes == 1:
            outcomes = [await _outcome(db.write(_log("k0", burn_s=0.02)))]
        else:  # queued together: one batch
            outcomes = await asyncio.gather(
                *(db.write(_log(key)) for key in keys),
                db.read(lambda conn: time.sleep(0.02)),
                return_exceptions=True,
            )
        assert outcomes == [None] * (writes if writes == 1 else writes + 1)
        assert _logged(tmp_path / "node.db") == keys
    finally:
        await db.aclose()


async def _outcome(awaitable: Awaitable[object]) -> object:
    try:
        return await awaitable
    except StoreError as exc:
        return exc


async def test_writes_past_the_budget_at_the_real_interval_are_committed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch on the loop past its budget (a loaded host: each took over 20 ms), the
    progress handler at its real interval: every ~3,333 commits the cached COMMIT meets it.
    Each write committed once and reported so. Broken by 1a88c36 (3 of 20,000 committed
    twice; b9dadd4: 5 failed with 'interrupted', 2 of them committed nonetheless), fixed by
    414aedc."""
    monkeypatch.setattr(mesh._sqlite, "LOOP_BUDGET_S", -1.0)
    monkeypatch.setattr(mesh._sqlite, "SLOW_BATCH_S", 1e9)  # the loop keeps the batches
    db = await Database.open(tmp_path / "node.db")
    await db.ensure_schema("log", LOG)
    try:
        for i in range(20_000):
            await db.write(_log(str(i)))
    finally:
        await db.aclose()
    assert _logged(tmp_path / "node.db") == [str(i) for i in range(20_000)]


async def test_a_session_event_appended_past_the_budget_is_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken by 1a88c36 (the event stored twice: the session's history repeats it; b9dadd4
    stored it once but the append raised StoreError 'interrupted'), fixed by 414aedc."""
    db = await Database.open(tmp_path / "node.db")
    store = SqliteSessionStore(db)
    session = await store.create("u1", "s1")
    _budget_checked_after_a_commit(monkeypatch)
    write = db.write

    async def slow_write(fn: Callable[[sqlite3.Connection], object]) -> object:
        def run(conn: sqlite3.Connection) -> object:
            value = fn(conn)
            time.sleep(0.02)  # the batch past its budget when it commits
            return value

        return await write(run)

    monkeypatch.setattr(db, "write", slow_write)
    event = Event(author="user", content=Content.user("hello"))
    try:
        await store.append_event(session, event)
        monkeypatch.undo()
        stored = await SqliteSessionStore(db).get("u1", "s1")
    finally:
        await db.aclose()
    assert stored is not None
    assert [e.id for e in stored.events] == [event.id]


@pytest.mark.parametrize("ops", [1, 2, 3, 5, 7, 11, 13])
async def test_a_batch_past_the_budget_at_any_statement_commits_each_write_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ops: int
) -> None:
    """Three writes in one batch, one of them (each in turn) taking the batch past its budget,
    the progress handler every ``ops`` steps: whichever statement meets it (an insert, a
    savepoint's release, the next savepoint, the COMMIT; before or after its last step), each
    write is committed once and reported committed; and a write that fails late fails alone
    (its savepoint's rollback interrupted or not). Holds (1a88c36, 414aedc)."""
    monkeypatch.setattr(mesh._sqlite, "_PROGRESS_OPS", ops)
    monkeypatch.setattr(mesh._sqlite, "LOOP_BUDGET_S", 0.01)

    def fails_late(conn: sqlite3.Connection) -> None:
        conn.execute("insert into log (k) values ('failed')")
        time.sleep(0.02)
        raise ValueError("this write fails")

    for late in range(3):
        db = await Database.open(tmp_path / f"{late}.db")
        await db.ensure_schema("log", LOG)
        try:
            keys = [f"k{i}" for i in range(3)]
            writes = [_log(key, burn_s=0.02 if i == late else 0.0) for i, key in enumerate(keys)]
            assert await asyncio.gather(*(db.write(w) for w in writes)) == [None] * 3
            failing = [_log("a"), fails_late, _log("b")]
            failing.insert(late, failing.pop(1))
            got = await asyncio.gather(*(db.write(w) for w in failing), return_exceptions=True)
            assert [type(g).__name__ for g in got] == [
                "ValueError" if w is fails_late else "NoneType" for w in failing
            ]
        finally:
            await db.aclose()
        assert _logged(tmp_path / f"{late}.db") == [*keys, "a", "b"]


# A COMMIT that fails (the WAL cannot grow: RLIMIT_FSIZE, SIGXFSZ ignored; SQLite rolls the
# transaction back) past the budget: SQLite's look at the progress handler after the COMMIT's
# last step turns its error into SQLITE_INTERRUPT, nothing open. In a process of its own (the
# file size limit is the process's).
_FAILED_COMMIT_DRIVER = r"""
import asyncio, json, os, resource, signal, sqlite3, sys, tempfile, time
import mesh
import mesh._sqlite
from mesh._sqlite import Database
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

async def main():
    d = tempfile.mkdtemp(); p = os.path.join(d, "node.db")
    db = await Database.open(p)
    await db.ensure_schema("t", "create table if not exists t (k text primary key, v blob not null);")
    await db.write(lambda conn: conn.execute("insert into t values ('seed', x'00')"))
    mesh._sqlite._PROGRESS_OPS = int(os.environ.get("S33_OPS", "3"))
    mesh._sqlite.LOOP_BUDGET_S = 0.01
    wal = os.path.getsize(p + "-wal")
    resource.setrlimit(resource.RLIMIT_FSIZE, (wal + 20000, resource.RLIM_INFINITY))

    def big(conn):
        conn.execute("insert into t values ('big', ?)", (b"x" * 200_000,))
        time.sleep(0.02)  # past the budget when it commits

    def small(conn):
        conn.execute("insert into t values ('small', x'01')")

    def told(result):
        if isinstance(result, BaseException):
            return f"{type(result).__name__}: {str(result).split(': ', 1)[-1]}"
        return "reported committed"

    if sys.argv[1:] == ["batch"]:  # two writes in one batch (savepoints); a read takes the time
        def big_now(conn):
            conn.execute("insert into t values ('big', ?)", (b"x" * 200_000,))

        results = await asyncio.gather(
            db.write(small), db.write(big_now), db.read(lambda conn: time.sleep(0.02)),
            return_exceptions=True,
        )
        outcome = [told(r) for r in results[:2]]
    else:
        outcome = told((await asyncio.gather(db.write(big), return_exceptions=True))[0])
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    await db.aclose()
    rows = [k for (k,) in sqlite3.connect(p).execute("select k from t order by k")]
    print(json.dumps({"mesh": mesh.__file__, "outcome": outcome, "on_disk": rows}))

asyncio.run(main())
"""


@pytest.mark.parametrize("batch", ["one", "batch"])
def test_a_commit_that_failed_past_the_budget_is_not_reported_committed(
    trees: Trees, batch: str
) -> None:
    """One write (``_run_one``), or two and a read taking the time (``_run_batch``): the
    COMMIT's error, not 'committed'. Broken by 414aedc (an interrupted COMMIT with nothing
    open taken for committed: a COMMIT that failed and was rolled back reads the same, so the
    write was reported committed and was not on disk; b9dadd4: StoreError 'interrupted';
    1a88c36: StoreError 'disk I/O error'), fixed by 46519bb (the COMMIT runs without the
    progress handler)."""
    got = {}
    for side in ("now", "before"):
        got[side] = _driven(trees, side, _FAILED_COMMIT_DRIVER, batch)
        assert got[side]["on_disk"] == ["seed"]  # the COMMIT failed: nothing of it on disk
    interrupted = "StoreError: interrupted"  # the reference: an error
    assert got["before"]["outcome"] == (interrupted if batch == "one" else [interrupted] * 2)
    error = "StoreError: disk I/O error"
    assert got["now"]["outcome"] == (error if batch == "one" else [error] * 2)


# --- 53a1f2a: an LLM turn's first save held until its final one or DEFER_S ------------------
#
# The agent below served by this checkout and by `git archive b9dadd4` (first on PYTHONPATH),
# with DEFER_S stretched (S33_DEFER_S, set in the node's process) so that the windows are
# wide enough to hit from outside.

BEFORE = "b9dadd4"
HEADERS = {"A2A-Version": "1.0"}

_HOLDER_SOURCE = '''
import asyncio
import os

import mesh._sqlite
from mesh import Agent, Call, Rule, Script, tool

if os.environ.get("S33_DEFER_S"):
    mesh._sqlite.DEFER_S = float(os.environ["S33_DEFER_S"])


@tool
async def hold(seconds: float) -> dict[str, float]:
    """Hold a while."""
    await asyncio.sleep(seconds)
    return {"held": seconds}


SCRIPT = Script(
    rules=[
        Rule(
            when=r"hold (?P<s>[\\d.]+)",
            steps=[Call("hold", {"seconds": "{s|number}"})],
            answer="held {hold.held}",
        ),
        Rule(when=r"hello", answer="hello back"),
    ],
    fallback="?",
)

agent = Agent(
    name="s33-holder", description="Holds.", instruction="Hold.", tools=[hold], script=SCRIPT
)
'''


@dataclass
class Trees:
    """Where the agent modules are, and the tree of ``BEFORE`` (``git archive``)."""

    agent_dir: Path
    before: Path

    def path(self, side: str) -> str:
        if side == "before":
            return f"{self.before}{os.pathsep}{self.agent_dir}"
        return str(self.agent_dir)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s33-trees")
    tree = archived_tree(BEFORE, tmp / "before")
    (tmp / "s33_holder.py").write_text(_HOLDER_SOURCE)
    return Trees(tmp, tree)


def _env(trees: Trees, side: str, **extra: str) -> dict[str, str]:
    """A node's environment on ``side``'s tree. PYTHONSAFEPATH: ``python -m mesh`` (and ``-c``)
    put the working directory first on sys.path, and tests.support starts children in the
    checkout, whose ``mesh`` would then shadow the tree before on PYTHONPATH."""
    return clean_env(PYTHONPATH=trees.path(side), PYTHONSAFEPATH="1", **extra)


def _text_message(text: str, message_id: str, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "ROLE_USER",
        "messageId": message_id,
        "parts": [{"text": text}],
    }
    if context_id is not None:
        message["contextId"] = context_id
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


def _on_disk(db: Path, context_id: str, message_id: str) -> dict[str, Any]:
    """What a new process finds of the context's turn: its tasks' states, its message key,
    its session's events (their authors)."""
    conn = sqlite3.connect(db)
    try:
        states = [
            int(s)
            for (s,) in conn.execute(
                "select state from a2a_tasks where context_id = ?", (context_id,)
            )
        ]
        (keys,) = conn.execute(
            "select count(*) from a2a_message_keys where message_id = ?", (message_id,)
        ).fetchone()
        authors = [
            a
            for (a,) in conn.execute(
                "select author from mesh_session_events where session_id = ? order by seq",
                (context_id,),
            )
        ]
    finally:
        conn.close()
    return {"task_states": states, "keys": int(keys), "session_authors": authors}


HELD_DEFER_S = 0.5


async def _killed_mid_turn(side: str, trees: Trees, tmp: Path) -> dict[str, Any]:
    """An LLM turn held in its tool; another request answered meanwhile (its commit takes the
    turn's queued session rows); the node SIGKILLed 1.6 DEFER_S into the turn. What is on
    disk then, and what the same message sent again to a new process on that database does."""
    data = tmp / side
    port = free_port()
    argv = ["mesh", "serve", "s33_holder:agent", "--port", str(port), "--no-register"]
    argv += ["--data-dir", str(data)]
    env = _env(trees, side, S33_DEFER_S=str(HELD_DEFER_S))
    url = f"http://127.0.0.1:{port}"
    held = _text_message("hold 2", f"held-{side}", "ctx-held")
    async with httpx.AsyncClient(base_url=url, timeout=30.0, trust_env=False) as http:
        proc = Proc.start(argv, name=f"held-{side}", tmp=tmp, env=env)
        try:
            wait_until_ok(url + "/health", timeout=30, proc=proc)
            await http.post("/", json=_text_message("hello", f"warm-{side}"), headers=HEADERS)
            await asyncio.sleep(3 * HELD_DEFER_S)  # nothing left queued
            turn = asyncio.ensure_future(http.post("/", json=held, headers=HEADERS))
            await asyncio.sleep(HELD_DEFER_S / 3)
            other = await http.post(
                "/", json=_text_message("hello", f"other-{side}"), headers=HEADERS
            )
            assert other.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            await asyncio.sleep(1.6 * HELD_DEFER_S - HELD_DEFER_S / 3)
            assert not turn.done()
            proc.popen.kill()
            proc.popen.wait(10)
            with contextlib.suppress(httpx.HTTPError):
                await turn
        finally:
            proc.terminate()
        seen = {
            "at_kill": _on_disk(
                data / "node.db", "ctx-held", held["params"]["message"]["messageId"]
            )
        }
        with running(argv, name=f"held-{side}-again", tmp=tmp, health=url + "/health", env=env):
            again = await http.post("/", json=held, headers=HEADERS)
            seen["sent_again"] = again.json()["result"]["task"]["status"]["state"]
        seen["after"] = _on_disk(
            data / "node.db", "ctx-held", held["params"]["message"]["messageId"]
        )
    return seen


@pytest.mark.integration
async def test_a_turn_killed_past_defer_s_has_its_task_and_key_on_disk(
    trees: Trees, tmp_path: Path
) -> None:
    """Between DEFER_S and 2 DEFER_S into an LLM turn whose session rows another request's
    commit took: its task (SUBMITTED) and key on disk, so a new process ends it FAILED
    'interrupted' (GetTask finds it). Broken by 53a1f2a (the held first save, queued after
    DEFER_S, waited another DEFER_S: killed then, no task), fixed by 1e452ab."""
    now = await _killed_mid_turn("now", trees, tmp_path)
    before = await _killed_mid_turn("before", trees, tmp_path)
    assert before["at_kill"]["task_states"] == [1]  # the reference: SUBMITTED, its key
    assert before["at_kill"]["keys"] == 1
    assert now == before


def _holder() -> Any:
    """The holder agent, in this process (``S33_DEFER_S`` unset: the test sets DEFER_S)."""
    namespace: dict[str, Any] = {}
    exec(compile(_HOLDER_SOURCE, "s33_holder", "exec"), namespace)
    return namespace["agent"]


def _rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}


def _stored_rows(db: Path, context_id: str) -> list[tuple[str, int]]:
    conn = sqlite3.connect(db)
    try:
        return [
            (str(i), int(s))
            for i, s in conn.execute(
                "select id, state from a2a_tasks where context_id = ?", (context_id,)
            )
        ]
    finally:
        conn.close()


async def test_a_held_turn_is_seen_by_get_list_and_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an LLM turn's first save is held (DEFER_S stretched: not on disk yet), GetTask
    answers its live task, ListTasks of its context lists it (and writes it), and CancelTask
    ends it: the turn's answer CANCELED, stored once with its key. Holds."""
    from mesh._a2a.store import SqliteTaskStore
    from mesh._node import Node
    from mesh._settings import NodeSettings
    from tests.support import uvicorn_serving

    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 1.5)  # a queued write may wait that long
    saved: list[str] = []
    first_saved = asyncio.Event()
    save = SqliteTaskStore.save

    async def spy(self: SqliteTaskStore, task: Any, context: Any) -> None:
        saved.append(task.id)
        first_saved.set()
        await save(self, task, context)

    monkeypatch.setattr(SqliteTaskStore, "save", spy)
    port = free_port()
    node = Node(_holder(), NodeSettings(port=port, data_dir=tmp_path, registry=None))
    db = tmp_path / "node.db"
    async with (
        uvicorn_serving(node.app, port, what="the node", log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as http,
    ):
        await http.post("/", json=_text_message("hello", "warm"), headers=HEADERS)
        for held_id, context_id in (("cancelled", "ctx-cancel"), ("listed", "ctx-list")):
            saved.clear()
            first_saved.clear()
            message = _text_message("hold 5", held_id, context_id)
            turn = asyncio.ensure_future(http.post("/", json=message, headers=HEADERS))
            await asyncio.wait_for(first_saved.wait(), 10)
            task_id = saved[0]
            got = await http.post("/", json=_rpc("GetTask", {"id": task_id}), headers=HEADERS)
            assert got.json()["result"]["status"]["state"] in (
                "TASK_STATE_SUBMITTED",
                "TASK_STATE_WORKING",
            )
            if held_id == "listed":
                listed = await http.post(
                    "/", json=_rpc("ListTasks", {"contextId": context_id}), headers=HEADERS
                )
                assert [t["id"] for t in listed.json()["result"]["tasks"]] == [task_id]
                assert [i for i, _ in _stored_rows(db, context_id)] == [task_id]
            cancelled = await http.post(
                "/", json=_rpc("CancelTask", {"id": task_id}), headers=HEADERS
            )
            assert cancelled.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
            answer = (await turn).json()
            assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED", answer
            assert _stored_rows(db, context_id) == [(task_id, 5)]
            again = await http.post("/", json=message, headers=HEADERS)  # its key: the same task
            assert again.json()["result"]["task"]["id"] == task_id


# --- 53a1f2a / 28a9da9: LLM turns and typed answers against the tree before -----------------
#
# Each driver runs in a process of each tree (PYTHONSAFEPATH: see ``_env``), serving its agent
# in process, and prints what the requests got, ids, times and traces replaced: LLM turns of
# tests.llm_ask_agents (a plain turn, its replay, a history length, a tool that asks and its
# answer, a turn rejected in a waiting context, a typed turn, a typed ask answered by a
# streamed message, a streamed turn, ListTasks, GetTask under history lengths, the trace rows,
# the session rows, the task rows and the message keys); typed answers of flat values of
# every kind, of 300 key sets (past the 256 orders 28a9da9 keeps) and of values the walk
# refuses, on JSON-RPC and REST with GetTask, with request metadata of several shapes (caller,
# traceparent valid or not, deadline, extra keys); direct message answers (reply="message"),
# with attachments too, and a task answer with attachments (walked). The fast path's driver also checks, in the
# process of this checkout, each answer written from a ``Settled`` against the walk of the
# same task (a Struct's member order is the process's: only there are the bytes comparable).

_LLM_DRIVER = r"""
import asyncio, json, re, sqlite3, sys, tempfile
from pathlib import Path
import httpx
import mesh, mesh._sqlite as msq
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving
from tests.llm_ask_agents import agent as desk
msq.DEFER_S = float(sys.argv[1])
H = {"A2A-Version": "1.0"}
IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
TRACES = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")
NUMS = re.compile(r'"(durationMs|startedAt|endedAt|at|created_at|updated_at|timestamp|started_at|ended_at)":\s?[0-9.e+-]+')
QIDS = re.compile(r"q-[0-9a-f]{8}")
def norm(t):
    return QIDS.sub("q-<id>", NUMS.sub(r'"\1":0', IDS.sub("<id>", TIMES.sub("<time>", TRACES.sub("<trace>", t)))))
def canon(text):
    try:
        return json.loads(norm(text))
    except ValueError:
        return norm(text)
def msg(text=None, data=None, mid="m", ctx=None, task=None, skill=None):
    m = {"role": "ROLE_USER", "messageId": mid, "parts": [{"text": text} if text is not None else {"data": data, "mediaType": "application/json"}]}
    if ctx: m["contextId"] = ctx
    if task: m["taskId"] = task
    if skill: m["metadata"] = {"skill": skill}
    return m
def rpc(method, params, rid=1):
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
async def main():
    tmp = Path(tempfile.mkdtemp()); port = free_port()
    out = {"mesh": mesh.__file__}
    node = Node(desk, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with uvicorn_serving(node.app, port, log_level="warning"):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http:
            async def call(method, params, rid=1):
                r = await http.post("/", json=rpc(method, params, rid), headers=H)
                return r.json()
            res = []
            tasks = []
            a = await call("SendMessage", {"message": msg("hello", mid="m1", ctx="ctx-a")})
            res.append(a); tasks.append(a["result"]["task"]["id"])
            a = await call("SendMessage", {"message": msg("hello", mid="m1", ctx="ctx-a")})  # replay
            res.append(a)
            a = await call("SendMessage", {"message": msg("hello", mid="m2", ctx="ctx-a"), "configuration": {"historyLength": 1}})
            res.append(a); tasks.append(a["result"]["task"]["id"])
            ask = await call("SendMessage", {"message": msg("pay APP-1 80,000", mid="m3", ctx="ctx-b")})
            res.append(ask); tid = ask["result"]["task"]["id"]; tasks.append(tid)
            res.append(await call("GetTask", {"id": tid}))
            res.append(await call("SendMessage", {"message": msg("hello", mid="m4", ctx="ctx-b")}))  # rejected
            done = await call("SendMessage", {"message": msg(data={"decision": "approve", "note": "ok"}, mid="m5", ctx="ctx-b", task=tid)})
            res.append(done)
            typed = await call("SendMessage", {"message": msg(data={"applicant_id": "APP-2", "amount": 100}, mid="m6", ctx="ctx-c", skill="payout")})
            res.append(typed); tasks.append(typed["result"]["task"]["id"])
            typed2 = await call("SendMessage", {"message": msg(data={"applicant_id": "APP-3", "amount": 90000}, mid="m7", ctx="ctx-d", skill="payout")})
            res.append(typed2); tasks.append(typed2["result"]["task"]["id"])
            # the typed ask answered by a streamed message
            r = await http.post("/", json=rpc("SendStreamingMessage", {"message": msg(data={"decision": "decline", "note": "no"}, mid="m8", ctx="ctx-d", task=typed2["result"]["task"]["id"])}), headers={**H, "Accept": "text/event-stream"})
            res.append([canon(l[5:]) for l in r.text.splitlines() if l.startswith("data:")])
            r = await http.post("/", json=rpc("SendStreamingMessage", {"message": msg("pay APP-9 10", mid="m9", ctx="ctx-e")}), headers={**H, "Accept": "text/event-stream"})
            evs = [json.loads(l[5:]) for l in r.text.splitlines() if l.startswith("data:")]
            res.append([canon(json.dumps(e)) for e in evs])
            try:
                tasks.append(evs[0]["result"]["task"]["id"])
            except Exception:
                pass
            res.append(await call("ListTasks", {"contextId": "ctx-a"}))
            for t in tasks:
                for hl in (None, 0, 2):
                    res.append(await call("GetTask", {"id": t, **({} if hl is None else {"historyLength": hl})}))
            traces = set()
            for t in tasks:
                g = await call("GetTask", {"id": t})
                tp = g["result"].get("metadata", {}).get("traceparent")
                if tp: traces.add(tp.split("-")[1])
            rows = []
            for tr in sorted(traces):
                r = await http.get(f"/v1/traces/{tr}/tasks")
                rows.append(canon(r.text))
            res.append(sorted(rows, key=lambda x: json.dumps(x, sort_keys=True)))
            out["answers"] = [canon(json.dumps(x)) if not isinstance(x, list) else x for x in res]
    c = sqlite3.connect(tmp / "node.db")
    out["sessions"] = [canon(json.dumps([r[0], r[1], json.loads(r[2]) if r[2] else None])) for r in c.execute("select session_id, author, data from mesh_session_events order by seq")]
    out["session_state"] = [canon(json.dumps(list(r))) for r in c.execute("select id, state from mesh_sessions order by id")]
    out["tasks"] = sorted(canon(json.dumps([r[0], r[1]])) for r in c.execute("select context_id, state from a2a_tasks"))
    out["keys"] = sorted(r[0] for r in c.execute("select message_id from a2a_message_keys"))
    print(json.dumps(out))
asyncio.run(main())
"""

_FAST_DRIVER = r'''
import asyncio, json, re, sys, tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
import mesh._a2a.fastroute as fr
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
TRACES = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")


def canon(status, text):
    text = IDS.sub("<id>", TIMES.sub("<time>", TRACES.sub("<trace>", text)))
    try:
        return [status, json.loads(text)]
    except ValueError:
        return [status, text]


class In(BaseModel):
    case: int


class Flat(BaseModel):
    s: str
    i: int
    f: float
    b: bool
    n: None | int


VALUES = [
    ("a", 0, 0.0, True, None),
    ("\u00e9\u2028\"\\\n\x00\x7f\U0001f642", 2**53 + 1, -0.0, False, 7),
    ("", -(2**63) - 1, 1e308, True, 2**64),
    ("x" * 5000, 10**30, 5e-324, False, -1),
    ("z", 1, 0.1, True, None),
    ("q", 2**1023, 1.7976931348623157e308, True, 3),
]


@skill
def flat(req: In) -> Flat:
    """Flat values of every kind."""
    s, i, f, b, n = VALUES[req.case % len(VALUES)]
    return Flat(s=s, i=i, f=f, b=b, n=n)


class Keyed(BaseModel):
    model_config = {"extra": "allow"}


@skill
def keyed(req: In) -> Keyed:
    """The case's own key set (300 of them: past the kept orders)."""
    k = req.case
    if k < 0:
        return Keyed()
    return Keyed(**{f"key{j}-{k % 300}": (j if j % 2 else f"v{j}") for j in range(k % 23)})


ODD = [
    {"nan": float("nan")},
    {"inf": float("inf")},
    {"big": 10**400},
    {"": 1, '"': 2, "\\": 3, "\u2028": 4},
    {"a": 1.0, "b": 1e16, "c": 1e-7, "d": 123456789.123456789},
    {"nested": {}},
    {"list": []},
]


@skill
def odd(req: In) -> Keyed:
    """Values the walk refuses or writes its own way."""
    return Keyed(**ODD[req.case % len(ODD)])


from mesh import File, SkillContext


@skill(reply="message")
def direct(req: In) -> Flat:
    """A direct message answer."""
    s, i, f, b, n = VALUES[req.case % len(VALUES)]
    return Flat(s=s, i=i, f=f, b=b, n=n)


@skill(reply="message")
async def direct_files(req: In, ctx: SkillContext) -> Flat:
    """A direct answer with attachments."""
    ctx.attach(File(b"\x89PNG" * 3, media_type="image/png", name="c.png"))
    ctx.attach({"rate": 1.5, "k": [1, None]}, "the rate", name="rate")
    s, i, f, b, n = VALUES[req.case % len(VALUES)]
    return Flat(s=s, i=i, f=f, b=b, n=n)


@skill
async def files(req: In, ctx: SkillContext) -> Flat:
    """A task answer with attachments."""
    ctx.attach(File(b"\x89PNG" * 3, media_type="image/png", name="c.png"))
    ctx.attach("text only")
    s, i, f, b, n = VALUES[req.case % len(VALUES)]
    return Flat(s=s, i=i, f=f, b=b, n=n)


agent = Agent(name="s33-fast", description="Fast.", skills=[flat, keyed, odd, direct, direct_files, files])
# Each answer written from a Settled is also walked: the two texts must be the same bytes.
differ: list[Any] = []
settled_answers = [0]
walk = fr.rpc_result


def rpc_result(result, request_id, history_from=0, settled=None):
    if settled is not None:
        settled_answers[0] += 1
        # Since ca5802b the fast route hands a settled task's stand-in (ids and status) as
        # ``result``: the task it stands for is ``settled.task`` (an older tree has no is_of).
        is_of = getattr(settled, "is_of", None)
        task = settled.task if is_of is not None and is_of(result) else result
        try:
            walked = walk(task, request_id, history_from=history_from)
        except Exception as exc:
            walked = repr(exc)
        try:
            mine = walk(result, request_id, history_from=history_from, settled=settled)
        except Exception as exc:
            mine = repr(exc)
        if mine != walked:
            differ.append([str(mine)[:3000], str(walked)[:3000]])
    return walk(result, request_id, history_from=history_from, settled=settled)


if "settled" in walk.__code__.co_varnames:
    fr.rpc_result = rpc_result


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    answers = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        runs = [("direct", range(8), (None, 0)), ("direct_files", range(8), (None, 0)),
                ("files", range(8), (None, 0, 1)), ("flat", range(12), (None, 0, 1, 5)), ("odd", range(7), (None, 0, 2)),
                ("keyed", range(-1, 40), (None, 0)), ("keyed", range(40, 320), (None,)),
                ("flat", range(100, 112), (None, 1))]
        metas = [{}, {"caller": "c\u00e9"}, {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"},
                 {"traceparent": "junk"}, {"deadline": 4102444800.5}, {"caller": "", "x": [1, {"y": None}]},
                 {"caller": 5}, {"caller": "a", "traceparent": "00-" + "12" * 16 + "-" + "34" * 8 + "-00", "deadline": 4102444800}]
        for skill_id, cases, lengths in runs:
            for case in cases:
                for hl in lengths:
                    msg = {"role": "ROLE_USER", "messageId": f"m-{skill_id}-{case}-{hl}",
                           "parts": [{"data": {"case": case}, "mediaType": "application/json"}],
                           "metadata": {"skill": skill_id, **(metas[case % len(metas)] if case >= 100 else {})}}
                    params: dict[str, Any] = {"message": msg}
                    if hl is not None:
                        params["configuration"] = {"historyLength": hl}
                    body = {"jsonrpc": "2.0", "id": case, "method": "SendMessage", "params": params}
                    r = await http.post("/", json=body, headers=H)
                    answers.append(canon(r.status_code, r.text))
                    if case < 40:
                        rest = {**params, "message": {**msg, "messageId": "r" + msg["messageId"]}}
                        r = await http.post("/a2a/rest/message:send", json=rest, headers=H)
                        answers.append(canon(r.status_code, r.text))
                        task = r.json().get("task") if r.status_code == 200 else None
                        if task:
                            get = {"id": task["id"], **({} if hl is None else {"historyLength": hl})}
                            body = {"jsonrpc": "2.0", "id": 9, "method": "GetTask", "params": get}
                            r = await http.post("/", json=body, headers=H)
                            answers.append(canon(r.status_code, r.text))
    print(json.dumps({"mesh": mesh.__file__, "answers": answers, "differ": differ,
                      "settled": settled_answers[0]}))


asyncio.run(main())
'''


def _driven(trees: Trees, side: str, source: str, *args: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", source, *args],
        capture_output=True,
        env=_env(trees, side),
        cwd=trees.agent_dir,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    out: dict[str, Any] = json.loads(run.stdout)
    assert out.pop("mesh").startswith(str(trees.before if side == "before" else ROOT))
    return out


@pytest.mark.integration
@pytest.mark.parametrize("defer_s", ["0.0", "1.0"])
def test_llm_turns_are_the_trees_before(trees: Trees, defer_s: str) -> None:
    """Every turn past DEFER_S (0) or within it (1 s): the same answers, events, stored tasks,
    trace rows, sessions and keys as b9dadd4's. Holds."""
    now = _driven(trees, "now", _LLM_DRIVER, defer_s)
    before = _driven(trees, "before", _LLM_DRIVER, defer_s)
    assert now == before


@pytest.mark.integration
def test_typed_answers_are_the_trees_before_and_settled_texts_the_walks(trees: Trees) -> None:
    """Holds: the same answers as b9dadd4's; every answer written from a Settled the bytes of
    the walk of its task."""
    now = _driven(trees, "now", _FAST_DRIVER)
    before = _driven(trees, "before", _FAST_DRIVER)
    assert now.pop("differ") == []
    assert now.pop("settled") > 300  # the case under test: answers written from a Settled
    before.pop("differ"), before.pop("settled")
    assert now == before


# Long turns: 70 tool rounds that change state (some nested), 150 that do not, 130 calls in one
# response, a 400 KB tool result; two contexts, turns interleaved: every session row in order.
_MANY_DRIVER = r'''
import asyncio, json, re, sqlite3, sys, tempfile
from pathlib import Path

import httpx

import mesh
from mesh import Agent, Call, Rule, Script, ToolContext, tool
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
TRACES = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")
NUMS = re.compile(r'"(timestamp|id|invocation_id|created_at|updated_at)":\s?("[^"]*"|[0-9.e+-]+)')


def canon(text):
    text = NUMS.sub(r'"\1":0', IDS.sub("<id>", TIMES.sub("<time>", TRACES.sub("<trace>", text))))
    try:
        return json.loads(text)
    except ValueError:
        return text


@tool
def note(i: int, size: int, ctx: ToolContext) -> dict:
    """A note of ``size`` bytes; counts notes in session state."""
    ctx.state_delta["notes"] = int(ctx.state.get("notes", 0)) + 1
    if i % 7 == 0:
        ctx.state_delta[f"n{i}"] = {"i": i, "deep": [i, {"x": None}]}
    return {"i": i, "pad": "x" * size, "u": "\u00e9\U0001f642\u2028"}


@tool
def plain(i: int) -> dict:
    """No state."""
    return {"i": i}


SCRIPT = Script(
    rules=[
        Rule(when=r"^many", steps=[Call("note", {"i": k, "size": 10}) for k in range(70)],
             answer="many {state.notes}"),
        Rule(when=r"^plain", steps=[Call("plain", {"i": k}) for k in range(150)], answer="plain"),
        Rule(when=r"^wide", steps=[[Call("plain", {"i": k}) for k in range(130)]], answer="wide"),
        Rule(when=r"^big", steps=[Call("note", {"i": 1, "size": 400_000})], answer="big"),
        Rule(when=r"hello", answer="hello back"),
    ],
    fallback="?",
)
agent = Agent(name="s33-many", description="Many events.", instruction="Note.",
              tools=[note, plain], script=SCRIPT, max_model_calls=200)


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    res = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        for n, text in enumerate(["many", "plain", "wide", "big", "hello", "many", "plain"]):
            ctx = "ctx-1" if n % 2 == 0 else "ctx-2"
            message = {"role": "ROLE_USER", "messageId": f"m{n}", "contextId": ctx,
                       "parts": [{"text": text}]}
            body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage",
                    "params": {"message": message, "configuration": {"historyLength": 3}}}
            r = await http.post("/", json=body, headers=H)
            res.append(canon(r.text))
            tid = r.json()["result"]["task"]["id"]
            body = {"jsonrpc": "2.0", "id": n, "method": "GetTask", "params": {"id": tid}}
            r = await http.post("/", json=body, headers=H)
            res.append(canon(r.text))
    conn = sqlite3.connect(tmp / "node.db")
    events = [[s, a, canon(d)] for s, a, d in conn.execute(
        "select session_id, author, data from mesh_session_events order by seq")]
    states = [[i, json.loads(s)] for i, s in conn.execute("select id, state from mesh_sessions order by id")]
    print(json.dumps({"mesh": mesh.__file__, "answers": res, "events": events, "states": states}))


asyncio.run(main())
'''


@pytest.mark.integration
def test_long_turns_and_big_events_are_stored_as_the_tree_before(trees: Trees) -> None:
    """The answers, GetTask, every session event (in order) and state: b9dadd4's. Holds."""
    now = _driven(trees, "now", _MANY_DRIVER)
    before = _driven(trees, "before", _MANY_DRIVER)
    assert len(now["events"]) > 800
    assert now == before


# A database made by b9dadd4 (a turn done, a turn waiting on its tool's question, a small
# payout) opened by each tree: GetTask, a replay, a new turn of the old context, the old
# question answered, ListTasks, the session rows, the schema versions, the page size.
_REOPEN_DRIVER = r"""
import asyncio, json, re, sqlite3, sys
from pathlib import Path

import httpx

import mesh
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.llm_ask_agents import agent as desk
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
TRACES = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")
QIDS = re.compile(r"q-[0-9a-f]{8}")


def canon(text):
    text = QIDS.sub("q-<id>", IDS.sub("<id>", TIMES.sub("<time>", TRACES.sub("<trace>", text))))
    try:
        return json.loads(text)
    except ValueError:
        return text


def message(mid, ctx, text=None, data=None, task=None):
    m = {"role": "ROLE_USER", "messageId": mid, "contextId": ctx,
         "parts": [{"text": text} if text is not None else {"data": data}]}
    if task:
        m["taskId"] = task
    return m


async def main(phase, data):
    port = free_port()
    node = Node(desk, NodeSettings(port=port, data_dir=Path(data), registry=None))
    out = {"mesh": mesh.__file__}
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        async def call(method, params):
            r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=H)
            return r.json()

        if phase == "make":
            ids = {}
            for name, ctx, text in (("hello", "ctx-1", "hello"), ("ask", "ctx-2", "pay APP-1 80,000"),
                                    ("small", "ctx-3", "pay APP-7 10")):
                a = await call("SendMessage", {"message": message("m-" + name, ctx, text)})
                ids[name] = a["result"]["task"]["id"]
            out["ids"] = ids
        else:
            ids = json.loads(Path(data, "ids.json").read_text())
            res = []
            for name in ("hello", "ask", "small"):
                res.append(canon(json.dumps(await call("GetTask", {"id": ids[name]}))))
            res.append(canon(json.dumps(await call("SendMessage", {"message": message("m-hello", "ctx-1", "hello")}))))
            res.append(canon(json.dumps(await call("SendMessage", {"message": message("m-2", "ctx-1", "hello")}))))
            done = await call("SendMessage", {"message": message("m-3", "ctx-2", data={"decision": "approve", "note": "later"}, task=ids["ask"])})
            res.append(canon(json.dumps(done)))
            res.append(canon(json.dumps(await call("ListTasks", {"contextId": "ctx-2"}))))
            out["answers"] = res
    if phase != "make":
        conn = sqlite3.connect(Path(data, "node.db"))
        out["events"] = [[s, a] for s, a in conn.execute("select session_id, author from mesh_session_events order by seq")]
        out["schema"] = [list(r) for r in conn.execute("select component, version from mesh_schema order by component")]
        out["page_size"] = conn.execute("pragma page_size").fetchone()[0]
        out["integrity"] = conn.execute("pragma integrity_check").fetchone()[0]
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.integration
def test_a_database_of_the_tree_before_is_read_and_continued_alike(
    trees: Trees, tmp_path: Path
) -> None:
    """Holds."""
    made = _driven(trees, "before", _REOPEN_DRIVER, "make", str(tmp_path / "made"))
    (tmp_path / "made" / "ids.json").write_text(json.dumps(made["ids"]))
    got = {}
    for side in ("now", "before"):
        shutil.copytree(tmp_path / "made", tmp_path / side)
        got[side] = _driven(trees, side, _REOPEN_DRIVER, "read", str(tmp_path / side))
    assert got["now"]["integrity"] == "ok"
    # Schema versions may only move forward: a later tree migrates the file it opens (session
    # 35: tasks 5 -> 7, the indexes a task's row enters). Everything read must stay the same.
    now_schema, before_schema = dict(got["now"].pop("schema")), dict(got["before"].pop("schema"))
    assert now_schema.keys() == before_schema.keys()
    assert all(now_schema[c] >= before_schema[c] for c in before_schema), (
        now_schema,
        before_schema,
    )
    assert got["now"] == got["before"]


# --- 28a9da9 / e209202: the member orders a flat answer's keys are kept under ----------------
#
# A typed skill whose answer's keys come from its caller (e209202's own example: a
# dict[str, float] echoed back); each request one new key of 1 MB. A kept order holds the key
# tuple and each key's quoted text.
_KEYS_DRIVER = r'''
import asyncio, gc, json, sys, tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving


class Scores(BaseModel):
    scores: dict[str, float]


class Echo(BaseModel):
    model_config = {"extra": "allow"}


@skill
def echo(req: Scores) -> Echo:
    """The caller's scores back, one member each."""
    return Echo(**req.scores)


agent = Agent(name="s33-echo", description="Echoes.", skills=[echo])


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return -1.0


async def main(n: int, size: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        async def send(i: int, key: str) -> int:
            message = {"role": "ROLE_USER", "messageId": f"m{i}",
                       "parts": [{"data": {"scores": {key: 1.5}}}], "metadata": {"skill": "echo"}}
            body = {"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {"message": message,
                    "configuration": {"historyLength": 0}}}
            r = await http.post("/", json=body, headers={"A2A-Version": "1.0"})
            return r.status_code

        for i in range(5):
            await send(-i - 1, f"warm{i}")
        gc.collect()
        start = rss_mb()
        codes = set()
        for i in range(n):
            codes.add(await send(i, f"{i:08d}" + "k" * size))
        gc.collect()
        await asyncio.sleep(0.5)
        gc.collect()
        print(json.dumps({"mesh": mesh.__file__, "codes": sorted(codes), "grew_mb": rss_mb() - start}))


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
'''


@pytest.mark.integration
def test_answers_of_caller_chosen_keys_keep_no_memory(trees: Trees) -> None:
    """60 answers each with a new 1 MB caller-chosen key keep nothing. Broken by 28a9da9 (each
    key set kept in _DATA_ORDERS, up to 256, whatever its keys' length: ~245 MB kept, b9dadd4
    ~25; e209202 bounded the count of keys only), fixed by f1e90bb (at most 4096 characters).
    (Within the bounds, 256 key sets of 64 keys of 62 characters, emoji and control characters,
    still keep ~28 MB: bounded.)"""
    now = _driven(trees, "now", _KEYS_DRIVER, "60", "1000000")
    before = _driven(trees, "before", _KEYS_DRIVER, "60", "1000000")
    assert now["codes"] == before["codes"] == [200]
    assert now["grew_mb"] < before["grew_mb"] + 64, (now, before)

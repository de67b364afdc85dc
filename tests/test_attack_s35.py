"""Attack cases (session 35) on this session's changes, each claiming no behaviour change:

* the typed specialist's fast path (helper A: the post-answer work, its task line, metrics and
  in-flight bookkeeping, moved after the answer's bytes are sent);
* the task store's write (helper B: eaf4fb2 retention's index condition as comparisons, tasks
  schema 6; 9acb821 the listing's index ascending, tasks schema 7);
* the coordinator's delegation (helper C: 9fad015 the delegation line's LogRecord made while the
  peer works, ``DirectPool.post(sent=)``).

Each driver runs in a process of each tree: this checkout ("now") and ``git archive 4d880a6``
("before", the session's base), with PYTHONSAFEPATH=1 (``_env``): ``python -c`` puts the
working directory first on sys.path, and a child started in the checkout would import the
checkout's ``mesh`` before PYTHONPATH's tree. Session 34's drivers (``tests.test_attack_s34``,
every one a comparison of two trees) are run again here against this session's base, some
with ``mesh serve``'s logging switches on (``logging._srcfile = None``: the only setting in
which 9fad015's prepared record is used).

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the tree before, ``git archive 4d880a6``, behaves otherwise; each says how and which commit);
a break fixed since is a passing test naming the commit that broke it and the one that fixed it.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import test_attack_s33 as s33
from tests import test_attack_s34 as s34
from tests.attack_prelude import ASK_IDS, SPAN_IDS, prelude
from tests.postgres_support import pg_database, postgres_server  # noqa: F401 (fixtures)
from tests.support import ROOT, archived_tree, clean_env

BEFORE = "4d880a6"
#: The tree "now" runs: this checkout, or (S35_NOW) another, say a ``git archive HEAD``, to
#: tell committed changes from a shared checkout's edits in progress.
NOW = Path(os.environ.get("S35_NOW", str(ROOT)))


@dataclass
class Trees:
    """Where the driver scripts run, and the tree of ``BEFORE`` (``git archive``)."""

    work: Path
    before: Path

    def path(self, side: str) -> str:
        return str(self.before) if side == "before" else str(NOW)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s35-trees")
    return Trees(tmp, archived_tree(BEFORE, tmp / "before"))


def _env(trees: Trees, side: str, **extra: str) -> dict[str, str]:
    """A driver's environment on ``side``'s tree (PYTHONSAFEPATH: see the module docstring),
    with one hash seed (jsonschema orders some errors by a set of the instance's keys)."""
    return clean_env(PYTHONPATH=trees.path(side), PYTHONSAFEPATH="1", PYTHONHASHSEED="35", **extra)


def _start(
    trees: Trees, side: str, source: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", source, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(trees, side, **(env or {})),
        cwd=trees.work,
    )


def _read(trees: Trees, side: str, run: subprocess.Popen[bytes]) -> dict[str, Any]:
    try:
        stdout, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    if run.returncode != 0:  # not an AssertionError: a break's xfail must not hide a crash
        raise RuntimeError(f"the {side} driver failed: {stderr.decode()[-3000:]}")
    out: dict[str, Any] = json.loads(stdout)
    if not out.pop("mesh").startswith(trees.path(side)):
        raise RuntimeError(f"the {side} driver imported another tree's mesh")
    return out


def _all(
    trees: Trees,
    runs: list[tuple[str, str, tuple[str, ...]]],
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Each (side, source, args) run at once (``env`` added), their outputs in order."""
    started: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for side, source, args in runs:
            started.append((side, _start(trees, side, source, *args, env=env)))
    except BaseException:
        for _, run in started:
            run.kill()
            run.wait()
        raise
    outs: list[dict[str, Any]] = []
    failed: BaseException | None = None
    for side, run in started:
        try:
            outs.append(_read(trees, side, run))
        except BaseException as exc:  # read the others: no process left behind
            failed = failed or exc
    if failed is not None:
        raise failed
    return outs


def _same(now: Any, before: Any) -> None:
    """``now == before``, else the failure shows where they differ (a unified diff)."""
    if now == before:
        return
    a = json.dumps(before, indent=1, sort_keys=True, default=repr).splitlines()
    b = json.dumps(now, indent=1, sort_keys=True, default=repr).splitlines()
    diff = difflib.unified_diff(a, b, "before", "now", n=3, lineterm="")
    raise AssertionError("\n".join(list(diff)[:150]))


def _both(
    trees: Trees, source: str, *args: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    now, before = _all(trees, [("now", source, args), ("before", source, args)], env)
    return now, before


def _in_turn(trees: Trees, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``_both``, one tree's process after the other's: for drivers whose calls race a one-second
    deadline (retries with backoff against resetting peers), which a loaded host decides
    otherwise when the two run side by side (session 37's CI at load 8: "did not answer within
    the deadline" against "unavailable")."""
    (now,) = _all(trees, [("now", source, args)])
    (before,) = _all(trees, [("before", source, args)])
    return now, before


# With ``mesh serve``'s switches (log_lines.configure): no caller lookup, so 9fad015's record
# made while the peer works is the one logged. Prepended to a driver's source.
_SERVE_LOGGING = "import logging\nlogging._srcfile = None\n"


# --- session 34's comparisons, against this session's base ------------------------------------


@pytest.mark.integration
def test_typed_requests_of_odd_values_are_answered_and_stored_as_the_tree_before(
    trees: Trees,
) -> None:
    """s34's odd typed requests (numbers, duplicate keys, nesting, metadata shapes, invalid
    input, skill errors; JSON-RPC and REST; GetTask, the stored rows): holds."""
    now, before = _both(trees, s34._TYPED_DRIVER)
    assert now == before


@pytest.mark.integration
def test_listed_tasks_and_trace_rows_before_and_after_a_restart_are_the_tree_before(
    trees: Trees,
) -> None:
    """s34's ListTasks (context, status, paging, history, artifacts) and trace rows, then the
    same after a restart: holds across tasks schema 5 -> 7 (eaf4fb2, 9acb821)."""
    now, before = _both(trees, s34._LIST_DRIVER)
    assert now["first"][-1][2] == 9
    assert now == before


@pytest.mark.integration
def test_remote_calls_with_serve_logging_are_the_tree_before(trees: Trees) -> None:
    """s34's remote() against a real node and 19 hostile peers (garbage, JSON-RPC errors,
    chunked, cut or reset mid-body, 5xx, 403, 404, 40 MB, slow past the deadline, gzip, a
    wrong content type), 40 calls in flight, a 3 MB argument: answers, errors (type,
    message, reason), retries, breaker, metrics and every mesh log line, with mesh serve's
    logging switch on (9fad015's prepared record logged). Holds."""
    source = _SERVE_LOGGING + s34._REMOTE_DRIVER
    now, before = _in_turn(trees, source, *s34._REMOTE_HELD)
    assert now["score"][0][0][0] == "ok"
    assert now == before


@pytest.mark.integration
def test_remote_failover_with_serve_logging_is_the_tree_before(trees: Trees) -> None:
    """s34's failover between the real node and a replica that resets, is refused, answers
    503 or garbage, or cuts its answer, in either order, mesh serve's logging switch on:
    holds (9fad015: a record prepared on a failed attempt's send, logged at the end)."""
    modes = ("rst_at_once", "refused", "s503", "garbage", "cut_mid_body", "rst_mid_body")
    source = _SERVE_LOGGING + s34._REMOTE_DRIVER
    now, before = _in_turn(trees, source, *(f"failover:{m}" for m in modes))
    assert "ok" in json.dumps(now["failover:rst_at_once"])
    assert now == before


@pytest.mark.integration
@pytest.mark.parametrize("where", ["asyncio", "uvloop-tls"])
def test_pool_answers_and_failures_are_the_tree_before(trees: Trees, where: str) -> None:
    """s34's DirectPool scenarios (textbook answers, chunked, cut, reset, slow, a body never
    read, an answer never sent, no free connection, stale kept connections closed or reset
    under the next request, peers closing every connection), on asyncio and on uvloop over
    TLS: what each post returns or raises, what is kept. Holds (9fad015's ``sent``, bb68342's
    deadline entered after a kept connection's write)."""
    env = {"S34_UVLOOP": "1", "S34_TLS": "1"} if where == "uvloop-tls" else None
    now, before = _both(trees, s34._POOL_DRIVER, *s34.HELD, env=env)
    _same(now, before)


@pytest.mark.integration
def test_heads_of_every_size_and_arrival_are_read_as_the_tree_before(trees: Trees) -> None:
    """s34's answer heads of 100 B to 300 KB arriving whole or in pieces: holds (bb68342)."""
    now, before = _both(trees, s34._SWEEP_DRIVER)
    _same(now, before)


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_many_posts_in_flight_end_as_the_tree_before(trees: Trees, loop: str) -> None:
    """s34's 400 seeded posts over a pool of eight, each answered its own way: holds
    (bb68342: the slot taken at once when free, the deadline from the call's start)."""
    now, before = _both(trees, s34._STORM_DRIVER, *(("uvloop",) if loop == "uvloop" else ()))
    _same(now, before)


@pytest.mark.integration
def test_coordinator_turns_over_a2a_are_the_tree_before(trees: Trees) -> None:
    """s34's coordinator turns delegating over A2A to the bench's specialist: holds (every
    client-side change of this session, end to end)."""
    now, before = _both(trees, _SERVE_LOGGING + s34._COORDINATOR_DRIVER)
    _same(now, before)


@pytest.mark.integration
def test_read_answers_and_sent_bodies_are_the_tree_before(trees: Trees) -> None:
    """s34's 3000 seeded task answers read by ``TaskResult.from_json`` (states known or not,
    of every type; artifacts and parts of every shape) and SendMessage bodies of odd values:
    hold (2377f50: the state table, the parts checked as dicts in line; the blocking attempt
    sent by ``A2APeer.send`` itself)."""
    now, before = _both(trees, s34._RESULTS_DRIVER)
    _same(now, before)
    now, before = _both(trees, s34._BODY_DRIVER)
    _same(now, before)


@pytest.mark.integration
@pytest.mark.parametrize("defer_s", ["0.0", "1.0"])
def test_llm_turns_are_the_tree_before(trees: Trees, defer_s: str) -> None:
    """s33's LLM turns (a replay, history lengths, a tool that asks and its answer, a turn
    rejected while its context waits, typed turns, streams, ListTasks, GetTask, trace rows,
    session rows, task rows, message keys), every first save past DEFER_S (0) or within it:
    hold (db501ed's saves committed at once, 5d282c8's post-answer work, 9acb821's index)."""
    now, before = _both(trees, s33._LLM_DRIVER, defer_s)
    _same(now, before)


@pytest.mark.integration
def test_long_turns_and_big_events_are_stored_as_the_tree_before(trees: Trees) -> None:
    """s33's long turns (70 state-changing tool rounds, 150 plain ones, 130 calls in one
    response, a 400 KB tool result) over two contexts: every session row in order. Holds."""
    now, before = _both(trees, s33._MANY_DRIVER)
    _same(now, before)


@pytest.mark.integration
def test_typed_answers_and_settled_texts_are_the_tree_before(trees: Trees) -> None:
    """s33's typed answers (flat values of every kind, 300 key sets, values the walk refuses,
    direct replies, attachments; JSON-RPC, REST, GetTask; metadata shapes), each answer
    written from a Settled also walked in this tree (the bytes must be the same): hold
    (88f9153's templates, 5d282c8)."""
    now, before = _both(trees, s33._FAST_DRIVER)
    assert now.pop("differ") == []
    assert now.pop("settled") > 300
    before.pop("differ")
    before.pop("settled")
    _same(now, before)


# --- eaf4fb2 / 9acb821: tasks schema 5 -> 7, a database made by each tree ---------------------
#
# "make": a typed node answers 36 requests (3 contexts, odd values, a trace, failures, one
# duplicate), then the tasks of 12 of them are given one status time (ties the listing breaks
# by id). "read", by a tree on a copy: GetTask of each, ListTasks (all, by context, by status,
# paged by 4 and 5, history 0, artifacts), the trace's rows, the same messages again (their
# tasks), new tasks, a restart, the listings again, a duplicate after the restart, retention
# down to 10 ended tasks (which remain), the schema and the file's integrity.

_STORE_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sqlite3, sys
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from mesh._sqlite import Database
from mesh._a2a.store import SqliteTaskStore
from mesh._retention import RetentionPolicy, Sweeper
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}
TRACE = "cd" * 16
NUMS = re.compile(r'"(durationMs|duration_ms|startedAt|endedAt|created_at|updated_at|started_at|ended_at|at)": [0-9.e+-]+')
VALS = ['0', '-0.0', '1.0', '9223372036854775808', '-1180591620717411303424', '1e308', '5e-324',
        '{"": {}}', '[]', '[[], [{}]]', '{"b": 1, "a": [1, 2.5]}', '"\\u00e9\\u2028\\ud83d\\ude42"',
        'null', 'true', '{"k": 1, "k": 2}', '123456789012345678901234567890']


class In(BaseModel):
    i: int
    v: Any = None


class Out(BaseModel):
    i: int
    v: Any = None


@skill
def num(req: In) -> Out:
    """Its values back; i % 5 == 4 fails."""
    if req.i % 5 == 4:
        raise ValueError(f"four {req.i}")
    return Out(i=req.i, v=req.v)


agent = Agent(name="s35-store", description="Stores.", skills=[num])


def body(mid, i, ctx, meta=None, method="SendMessage", v=None):
    meta = {"skill": "num", **(meta or {})}
    data = '{"i": %d, "v": %s}' % (i, v if v is not None else VALS[i % len(VALS)])
    message = ('{"role": "ROLE_USER", "messageId": "%s", "contextId": "%s", "parts": [{"data": %s}], '
               '"metadata": %s}' % (mid, ctx, data, json.dumps(meta)))
    return '{"jsonrpc": "2.0", "id": 1, "method": "%s", "params": {"message": %s}}' % (method, message)


class Names:
    """Task ids by the request that made them: the output names tasks so."""

    def __init__(self, known):
        self.by_id = {v: k for k, v in known.items()}

    def canon(self, value):
        text = TIMES.sub("<time>", json.dumps(value, sort_keys=True))
        text = NUMS.sub(r'"\1": 0', text)
        for tid, name in self.by_id.items():
            text = text.replace(tid, name)
        text = TRACES.sub(lambda m: f"00-{m[1]}-<span>" if m[1] == TRACE else "<trace>", text)
        return sorted_texts(json.loads(IDS.sub("<id>", text)))


PG = sys.argv[3] if len(sys.argv) > 3 else None  # a PostgreSQL database's URL: the store there


async def serve(data, steps):
    port = free_port()
    pg = {"store": "postgresql", "store_url": PG} if PG else {}
    node = Node(agent, NodeSettings(port=port, data_dir=data, registry=None, **pg))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        return await steps(http)


async def rpc(http, method, params):
    r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=H)
    return r.json()


async def send(http, mid, i, ctx, meta=None):
    r = await http.post("/", content=body(mid, i, ctx, meta), headers=H)
    return r.json()


LISTINGS = [{}, {"contextId": "ctx-1"}, {"status": "TASK_STATE_FAILED"}, {"pageSize": 4},
            {"pageSize": 5, "contextId": "ctx-2"}, {"contextId": "ctx-0", "historyLength": 0},
            {"includeArtifacts": True, "pageSize": 50}, {"pageSize": 1}]


async def listings(http):
    got = []
    for params in LISTINGS:
        pages, token = [], None
        for _ in range(60):
            listed = await rpc(http, "ListTasks", {**params, **({"pageToken": token} if token else {})})
            result = listed.get("result", listed)
            pages.append(result.get("tasks"))
            token = result.get("nextPageToken")
            if not token:
                break
        got.append([params, pages, result.get("totalSize"), result.get("pageSize")])
    return got


async def make(data):
    async def steps(http):
        ids, answers = {}, []
        for i in range(36):
            meta = {"traceparent": f"00-{TRACE}-{i + 1:016x}-01"} if i % 4 == 0 else {}
            a = await send(http, f"m{i}", i, f"ctx-{i % 3}", meta)
            answers.append(a)
            ids[f"t{i}"] = a["result"]["task"]["id"]
        again = await send(http, "m3", 3, "ctx-0")
        answers.append(again)
        return ids, answers

    ids, answers = await serve(data, steps)
    if PG:
        import psycopg

        with psycopg.connect(PG) as conn:
            (t0,) = conn.execute("select min(updated_at) from a2a_tasks").fetchone()
            for i in range(10, 22):
                conn.execute("update a2a_tasks set updated_at = %s where id = %s", (t0 + 5, ids[f"t{i}"]))
    else:
        conn = sqlite3.connect(Path(data, "node.db"))
        with conn:
            (t0,) = conn.execute("select min(updated_at) from a2a_tasks").fetchone()
            for i in range(10, 22):
                conn.execute("update a2a_tasks set updated_at = ? where id = ?", (t0 + 5, ids[f"t{i}"]))
        conn.close()
    Path(data).mkdir(parents=True, exist_ok=True)
    Path(data, "ids.json").write_text(json.dumps(ids))
    names = Names(ids)
    return {"answers": names.canon(answers)}


async def read(data):
    ids = json.loads(Path(data, "ids.json").read_text())
    out = {}

    async def first(http):
        got = {"get": [], "get0": []}
        for name in sorted(ids):
            got["get"].append(await rpc(http, "GetTask", {"id": ids[name]}))
            got["get0"].append(await rpc(http, "GetTask", {"id": ids[name], "historyLength": 0}))
        got["lists"] = await listings(http)
        r = await http.get(f"/v1/traces/{TRACE}/tasks")
        got["trace"] = [r.status_code, r.json() if r.status_code == 200 else r.text[:200]]
        got["again"] = [await send(http, f"m{i}", i, f"ctx-{i % 3}") for i in range(6)]
        new = []
        for i in range(100, 106):
            a = await send(http, f"n{i}", i, "ctx-1", {"traceparent": f"00-{TRACE}-{i:016x}-01"})
            ids[f"t{i}"] = a["result"]["task"]["id"]
            new.append(a)
        got["new"] = new
        got["lists_after"] = await listings(http)
        return got

    out["first"] = await serve(data, first)

    async def second(http):
        got = {"lists": await listings(http)}
        got["again"] = [await send(http, f"n{i}", i, "ctx-1") for i in range(100, 103)]
        got["again_old"] = [await send(http, f"m{i}", i, f"ctx-{i % 3}") for i in range(30, 36)]
        r = await http.get(f"/v1/traces/{TRACE}/tasks")
        got["trace"] = [r.status_code, r.json() if r.status_code == 200 else r.text[:200]]
        return got

    out["restart"] = await serve(data, second)
    if PG:
        from mesh._pg import PgDatabase

        db = await PgDatabase.open(PG)
    else:
        db = await Database.open(Path(data, "node.db"))
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        sweeper = Sweeper(RetentionPolicy(tasks_for_s=None, tasks_max=10, sessions_for_s=None), db, tasks=store)
        report = await sweeper.sweep()
        out["swept"] = dict(report.deleted)
        out["ended_after"] = await store.count_ended()
    finally:
        await db.aclose()
    if PG:
        import psycopg

        with psycopg.connect(PG) as conn:
            out["left"] = [[i, s] for i, s in conn.execute("select id, state from a2a_tasks order by updated_at, id")]
            out["keys"] = conn.execute("select count(*) from a2a_message_keys").fetchone()[0]
            out["schema"] = [list(r) for r in conn.execute("select component, version from mesh_schema order by component")]
        out["integrity"], out["plans"] = "ok", []
        return Names(ids).canon(out)
    conn = sqlite3.connect(Path(data, "node.db"))
    out["left"] = [[i, s] for i, s in conn.execute("select id, state from a2a_tasks order by updated_at, id")]
    out["keys"] = conn.execute("select count(*) from a2a_message_keys").fetchone()[0]
    out["schema"] = [list(r) for r in conn.execute("select component, version from mesh_schema order by component")]
    out["integrity"] = conn.execute("pragma integrity_check").fetchone()[0]
    out["plans"] = [[r[3] for r in conn.execute("explain query plan " + q)] for q in (
        "select id from a2a_tasks where owner = 'a2a' order by updated_at desc, id desc limit 5",
        "select id from a2a_tasks where owner = 'a2a' and context_id = 'ctx-1' order by updated_at desc, id desc limit 5")]
    conn.close()
    return Names(ids).canon(out)


async def main(phase, data):
    out = {"mesh": mesh.__file__}
    out.update(await (make if phase == "make" else read)(Path(data)))
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2]))
'''
)


def _schema_moved_forward(now: dict[str, Any], before: dict[str, Any]) -> None:
    """Schema versions may only move forward (this session: tasks 5 -> 7); popped."""
    now_schema, before_schema = dict(now.pop("schema")), dict(before.pop("schema"))
    assert now_schema.keys() == before_schema.keys()
    assert all(now_schema[c] >= before_schema[c] for c in before_schema)
    assert now_schema["tasks"] >= 7, now_schema
    assert before_schema["tasks"] == 5, before_schema


@pytest.mark.integration
def test_a_database_of_the_tree_before_is_read_listed_continued_and_swept_alike(
    trees: Trees, tmp_path: Path
) -> None:
    """A node.db made by 4d880a6 (tasks schema 5, ties in the listing's time) opened by this
    tree (migrated to 7: eaf4fb2, 9acb821) and by 4d880a6, each on a copy: every GetTask,
    ListTasks page (ties in id order across pages), trace row, duplicate before and after a
    restart, new task, retention's choice of what to delete and what is left: the same. And a
    database made by this tree reads the same as one made by 4d880a6 read by 4d880a6. Holds."""
    made_now, made_before = _all(
        trees,
        [
            ("now", _STORE_DRIVER, ("make", str(tmp_path / "made-now"))),
            ("before", _STORE_DRIVER, ("make", str(tmp_path / "made-before"))),
        ],
    )
    _same(made_now, made_before)
    for side in ("now", "before"):
        shutil.copytree(tmp_path / "made-before", tmp_path / f"read-{side}")
    now, before, own = _all(
        trees,
        [
            ("now", _STORE_DRIVER, ("read", str(tmp_path / "read-now"))),
            ("before", _STORE_DRIVER, ("read", str(tmp_path / "read-before"))),
            ("now", _STORE_DRIVER, ("read", str(tmp_path / "made-now"))),
        ],
    )
    assert now["integrity"] == own["integrity"] == "ok"
    assert now["swept"]["tasks"] > 0
    assert now["left"]
    now_plans, before_plans = now.pop("plans"), before.pop("plans")
    assert all("TEMP B-TREE" not in step for plan in now_plans for step in plan), now_plans
    assert len(now_plans) == len(before_plans)
    own_plans = own.pop("plans")
    assert own_plans == now_plans
    _schema_moved_forward(now, before)
    _same(now, before)
    # Made by this tree: its ids are its own, so ties in time fall in another order.
    _same(_unordered(own), _unordered(before))


def _unordered(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with each listing's tasks as one sorted list and the tasks left sorted."""
    out = json.loads(json.dumps(out))
    for phase in ("first", "restart"):
        for key in ("lists", "lists_after"):
            for listing in out[phase].get(key, []):
                tasks = [t for page in listing[1] for t in page or []]
                listing[1] = sorted(json.dumps(t, sort_keys=True) for t in tasks)
    out["left"] = sorted(json.dumps(x) for x in out["left"])
    out.pop("schema", None)
    return out


# --- 5d282c8: the fast route's post-answer work (line, metrics, in-flight) ------------------
#
# A typed node in the driver's process; after each request, at once: the answer, the mesh log
# lines it made, the task metrics (mesh_tasks_total, the duration count, the in-flight gauge,
# the fast path's sends) and the executor's count in flight. Success, a skill's failure,
# invalid input, an unknown skill, REST, a direct reply and its failure, a typed ask and its
# answer (the SDK's route), a run past its deadline, one cancelled while its blocking send
# waits, one whose caller went away, a duplicate while the first runs, 30 at once, a 8 MB
# answer, and the metrics raising.

_AFTER_DRIVER = (
    prelude(ASK_IDS)
    + r'''
import asyncio, json, logging, re, sys, tempfile, time
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, SkillContext, skill
from mesh._metrics import NodeMetrics
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
VARY = re.compile(r"duration_ms=[\d.]+|0x[0-9a-f]+|\d+\.\d+ ?s\b|127\.0\.0\.1:\d+|/tmp/\w+|, \d\.\d+(e-\d+)?,")


def canon(text):
    return parsed(VARY.sub("<v>", scrub(text)))


class In(BaseModel):
    i: int = 0
    hold: float = 0.0
    size: int = 0


class Out(BaseModel):
    i: int
    pad: str = ""


class Decision(BaseModel):
    ok: bool


@skill
async def work(req: In) -> Out:
    """Holds, fails on a negative i."""
    if req.hold:
        await asyncio.sleep(req.hold)
    if req.i < 0:
        raise ValueError(f"negative {req.i}")
    return Out(i=req.i, pad="x" * req.size)


@skill
def plain(req: In) -> Out:
    """No await."""
    if req.i < 0:
        raise ValueError(f"negative {req.i}")
    return Out(i=req.i)


@skill(reply="message")
async def direct(req: In) -> Out:
    """A direct reply."""
    if req.i < 0:
        raise ValueError("negative direct")
    return Out(i=req.i)


@skill
async def asker(req: In, ctx: SkillContext) -> Out:
    """Asks."""
    answer = await ctx.ask("go?", schema=Decision)
    return Out(i=req.i, pad=repr(answer))


class Loose(BaseModel):
    model_config = {"extra": "allow"}


ODD = [{"nan": float("nan")}, {"inf": float("-inf")}, {"big": 10**400}, {"ok": 1}]


@skill
def odd(req: In) -> Loose:
    """Values an answer's JSON has no way to write, or writes its own way."""
    return Loose(**ODD[req.i % len(ODD)])


@skill(reply="message")
def odd_direct(req: In) -> Loose:
    """The same, as a direct reply."""
    return Loose(**ODD[req.i % len(ODD)])


agent = Agent(name="s35-after", description="After.", skills=[work, plain, direct, asker, odd, odd_direct])


LOGS = Logs()
KEEP = ("mesh_tasks_total", "mesh_tasks_in_flight", "mesh_task_duration_seconds_count",
        "mesh_fastpath_sends_total")


def msg(mid, skill_id, data, ctx=None, task=None, meta=None):
    m = {"role": "ROLE_USER", "messageId": mid, "parts": [{"data": data}],
         "metadata": {"skill": skill_id, **(meta or {})}}
    if ctx:
        m["contextId"] = ctx
    if task:
        m["taskId"] = task
    return m


async def metrics_raise(http, rpc, step):
    done = NodeMetrics.task_done

    def raising(self, *args, **kwargs):
        raise RuntimeError("the metrics are down")

    NodeMetrics.task_done = raising
    try:
        await step("metrics-raise", await rpc("SendMessage", {"message": msg("e1", "work", {"i": 1})}))
        await step("metrics-raise-direct", await rpc("SendMessage", {"message": msg("e2", "direct", {"i": 1})}))
        r = await http.post("/a2a/rest/message:send", json={"message": msg("e3", "work", {"i": 1})}, headers=H)
        await step("metrics-raise-rest", [r.status_code, canon(r.text)])
    finally:
        NodeMetrics.task_done = done


async def main():
    logging.getLogger().addHandler(LOGS)
    logging.getLogger().setLevel(logging.INFO)
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    url = f"http://127.0.0.1:{port}"
    res = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as http,
    ):
        async def metrics():
            text = (await http.get("/metrics")).text
            return sorted(l for l in text.splitlines() if l.startswith(KEEP))

        async def in_flight():
            for line in (await http.get("/metrics")).text.splitlines():
                if line.startswith("mesh_tasks_in_flight{"):
                    return float(line.rsplit(" ", 1)[1])
            return None

        async def settled(within=5.0):
            end = time.monotonic() + within
            while time.monotonic() < end and await in_flight():
                await asyncio.sleep(0.02)

        async def rpc(method, params):
            r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=H)
            return [r.status_code, canon(r.text)]

        async def step(name, answer, sort=False):
            # At once: what a scrape or a log reader sees right after the answer.
            lines = LOGS.lines[:]
            LOGS.lines.clear()
            res.append([name, answer, sorted(lines) if sort else lines, await metrics()])

        if sys.argv[1] == "odd":
            for k in range(len(ODD)):
                await step(f"odd-{k}", await rpc("SendMessage", {"message": msg(f"o{k}", "odd", {"i": k})}))
                await step(f"odd-direct-{k}", await rpc("SendMessage", {"message": msg(f"od{k}", "odd_direct", {"i": k})}))
                r = await http.post("/a2a/rest/message:send", json={"message": msg(f"or{k}", "odd", {"i": k})}, headers=H)
                await step(f"odd-rest-{k}", [r.status_code, canon(r.text)])
            print(json.dumps({"mesh": mesh.__file__, "res": res}))
            return
        if sys.argv[1] == "raise":
            await metrics_raise(http, rpc, step)
            await settled()
            await step("end", None)
            print(json.dumps({"mesh": mesh.__file__, "res": res}))
            return
        await step("ok", await rpc("SendMessage", {"message": msg("m1", "work", {"i": 1})}))
        await step("ok-sync", await rpc("SendMessage", {"message": msg("m1s", "plain", {"i": 1})}))
        await step("fails", await rpc("SendMessage", {"message": msg("m2", "work", {"i": -1})}))
        await step("fails-sync", await rpc("SendMessage", {"message": msg("m2s", "plain", {"i": -1})}))
        await step("invalid", await rpc("SendMessage", {"message": msg("m3", "work", {"i": "x"})}))
        await step("unknown", await rpc("SendMessage", {"message": msg("m4", "nope", {"i": 1})}))
        await step("history0", await rpc("SendMessage", {"message": msg("m5", "work", {"i": 5}), "configuration": {"historyLength": 0}}))
        for n, data in enumerate(({"i": 2}, {"i": -2}, {"i": "x"})):
            r = await http.post("/a2a/rest/message:send", json={"message": msg(f"r{n}", "work", data)}, headers=H)
            await step(f"rest-{n}", [r.status_code, canon(r.text)])
        await step("direct", await rpc("SendMessage", {"message": msg("d1", "direct", {"i": 3})}))
        await step("direct-fails", await rpc("SendMessage", {"message": msg("d2", "direct", {"i": -3})}))
        await step("direct-invalid", await rpc("SendMessage", {"message": msg("d3", "direct", {"i": "x"})}))
        asked = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": msg("q1", "asker", {"i": 4}, ctx="ctx-q")}}, headers=H)
        await step("asked", [asked.status_code, canon(asked.text)])
        tid = asked.json()["result"]["task"]["id"]
        await step("answered", await rpc("SendMessage", {"message": msg("q2", "asker", {"ok": True}, ctx="ctx-q", task=tid)}))
        await settled()
        await step("answered-settled", None)
        late = await rpc("SendMessage", {"message": msg("dl", "work", {"i": 6, "hold": 1.0}, meta={"deadline": time.time() + 0.3})})
        await step("deadline", late)
        await settled()
        await step("deadline-settled", None)
        held = asyncio.ensure_future(rpc("SendMessage", {"message": msg("c1", "work", {"i": 7, "hold": 10}, ctx="ctx-c")}))
        while True:
            listed = (await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "ctx-c"}}, headers=H)).json()
            if listed["result"]["tasks"]:
                break
            await asyncio.sleep(0.01)
        cancelled = await rpc("CancelTask", {"id": listed["result"]["tasks"][0]["id"]})
        await step("cancelled", [cancelled, await held])
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=0.3) as impatient:
            try:
                await impatient.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": msg("g1", "work", {"i": 8, "hold": 0.8})}}, headers=H)
                gone = "answered"
            except httpx.TimeoutException:
                gone = "timed out"
        await settled()
        await step("gone", gone)
        first = asyncio.ensure_future(rpc("SendMessage", {"message": msg("u1", "work", {"i": 9, "hold": 0.3})}))
        await asyncio.sleep(0.1)
        second = await rpc("SendMessage", {"message": msg("u1", "work", {"i": 9, "hold": 0.3})})
        await step("duplicate", [await first, second])
        many = await asyncio.gather(*(rpc("SendMessage", {"message": msg(f"x{k}", "work" if k % 2 else "plain", {"i": k - 10})}) for k in range(30)))
        await step("many", sorted(json.dumps(a, sort_keys=True) for a in many), sort=True)
        big = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": msg("b1", "work", {"i": 1, "size": 8 << 20})}}, headers=H)
        await step("big", [big.status_code, len(big.content)])
        await settled()
        await step("end", None)
    print(json.dumps({"mesh": mesh.__file__, "res": res}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_every_requests_line_and_metrics_are_there_right_after_its_answer(trees: Trees) -> None:
    """5d282c8's deferred work seen from the node's process right after each answer (a scrape,
    the log lines): success, failures, invalid input, REST, direct replies, an ask and its
    answer, a deadline, a cancel, a caller gone, a duplicate, 30 at once, 8 MB. Holds."""
    now, before = _both(trees, _AFTER_DRIVER, "main")
    _same(now, before)


@pytest.mark.integration
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="5d282c8: a typed answer the route cannot write (a skill's value of 10**400: "
    "JSON-RPC -32603 'int too large to convert to float', REST 500, on a task and a direct "
    "reply): 4d880a6 logged the task's line (outcome=failed) and then 'SendMessage failed'; "
    "now 'SendMessage failed' comes first and the task's line after it (the same lines, the "
    "other order). Answers and metrics unchanged; NaN, -inf and plain values unchanged",
)
def test_answers_the_route_cannot_write_log_in_the_order_before(trees: Trees) -> None:
    """Skills returning NaN, -inf, 10**400 and a plain value, as a task (JSON-RPC, REST) and as
    a direct reply: answers, lines in order, metrics right after each."""
    now, before = _both(trees, _AFTER_DRIVER, "odd")
    _same(now, before)


@pytest.mark.integration
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="5d282c8: when the task's metrics raise (NodeMetrics.task_done), 4d880a6 answers "
    "the request with the error (JSON-RPC -32603 'the metrics are down', REST 500 'unknown "
    "exception'), logs 'SendMessage failed' and no task line; now the answer is the completed "
    "task (or the direct reply), the task line is logged, and 'after an answer: "
    "MeshExecutor._finished failed' (f12dcb8's wording) is logged instead",
)
def test_a_request_whose_metrics_raise_is_answered_and_logged_as_before(trees: Trees) -> None:
    """The executor's metrics raising (patched) on JSON-RPC, a direct reply and REST."""
    now, before = _both(trees, _AFTER_DRIVER, "raise")
    _same(now, before)


# --- 5d282c8: a log reader in another process, right after the answer -----------------------
#
# ``mesh serve`` (its own logging: one line a task on stderr, into a file here) whose "mesh.task"
# logger writes slowly: a filter takes 0.3 s a record, as a line written to a pipe a busy log
# collector drains would. The caller reads the log file as soon as it has its answer.

_SLOW_LOG_AGENT = '''
import logging
import time

from pydantic import BaseModel

from mesh import Agent, skill


class In(BaseModel):
    i: int


class Out(BaseModel):
    i: int


@skill
def work(req: In) -> Out:
    """Its number back; a negative one fails."""
    if req.i < 0:
        raise ValueError("negative")
    return Out(i=req.i)


@skill(reply="message")
def direct(req: In) -> Out:
    """A direct reply."""
    return Out(i=req.i)


class SlowSink(logging.Filter):
    """A task's line takes 0.3 s to write (a slow sink)."""

    def filter(self, record: logging.LogRecord) -> bool:
        time.sleep(0.3)
        return True


logging.getLogger("mesh.task").addFilter(SlowSink())
agent = Agent(name="s35-slowlog", description="Logs slowly.", skills=[work, direct])
'''


def _log_reader_right_after_answers(trees: Trees, side: str, tmp: Path) -> list[Any]:
    from tests.support import free_port, running

    (trees.work / "s35_slowlog.py").write_text(_SLOW_LOG_AGENT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "s35_slowlog:agent", "--port", str(port), "--no-register"]
    argv += ["--data-dir", str(tmp / side)]
    env = clean_env(PYTHONPATH=f"{trees.path(side)}{os.pathsep}{trees.work}", PYTHONSAFEPATH="1")
    seen: list[Any] = []
    headers = {"A2A-Version": "1.0"}
    with (
        running(argv, name=f"slowlog-{side}", tmp=tmp, health=url + "/health", env=env) as proc,
        httpx.Client(base_url=url, trust_env=False, timeout=30) as http,
    ):
        cases = [
            ("rpc", "work", {"i": 1}),
            ("rpc", "work", {"i": -1}),
            ("rest", "work", {"i": 2}),
            ("rpc", "direct", {"i": 3}),
        ]
        for n, (binding, skill_id, data) in enumerate(cases):
            message = {
                "role": "ROLE_USER",
                "messageId": f"m{n}",
                "parts": [{"data": data}],
                "metadata": {"skill": skill_id},
            }
            if binding == "rpc":
                body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage"}
                r = http.post("/", json={**body, "params": {"message": message}}, headers=headers)
            else:
                r = http.post("/a2a/rest/message:send", json={"message": message}, headers=headers)
            lines = proc.output().count(f"skill={skill_id} ")
            scrape = http.get("/metrics").text
            counted = sum(
                float(line.rsplit(" ", 1)[1])
                for line in scrape.splitlines()
                if line.startswith("mesh_tasks_total{")
            )
            seen.append([binding, skill_id, r.status_code, lines, counted])
    return seen


@pytest.mark.integration
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="5d282c8: the task's line is written after the answer's bytes are sent: with a log "
    "sink that takes its time (here 0.3 s a record), a reader of the node's log right after "
    "the answer does not find the line; with 4d880a6 it is there (written before the answer). "
    "The metrics scraped right after are counted in both",
)
def test_a_log_reader_right_after_the_answer_finds_the_tasks_line(
    trees: Trees, tmp_path: Path
) -> None:
    """Under ``mesh serve``: for JSON-RPC (a success, a failure), REST and a direct reply, the
    number of the skill's lines in the log when the answer arrived, and the tasks counted by a
    scrape right after."""
    now = _log_reader_right_after_answers(trees, "now", tmp_path)
    before = _log_reader_right_after_answers(trees, "before", tmp_path)
    assert [c[3] for c in before] == [1, 2, 3, 1]  # the reference: each line there at once
    _same(now, before)


# --- 9fad015: the delegation line's record made while the peer works -------------------------
#
# A coordinator with ``mesh serve``'s logging (``log_lines.configure``: no caller lookup, so the
# record made at the request's write is the one logged) calls a real node in its process; each
# delegation line's text (the LineHandler's, on a stream) and its LogRecord's attributes (times
# aside), and whether its times are those of a record made when it was logged: created after the
# peer's answer and before the call returned, msecs and relativeCreated from created. Calls: ok,
# held 0.2 s, the skill failing, past the deadline, refused arguments, 20 at once, and with the
# logging set up changed while the peer works (by the peer's skill as it starts: the request is
# written) (the logger's level up or down, logging.disable,
# the caller lookup turned on, a record factory installed).

_LINE_DRIVER = (
    prelude(SPAN_IDS, traces=False, times=False)
    + r'''
import asyncio, io, json, logging, os, re, sys, tempfile, time
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._cli import log_lines
from mesh._metrics import NodeMetrics
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._node import Node
from mesh._remote import remote
from mesh._settings import NodeSettings
from mesh._tools import ToolContext
from mesh._trust import PeerTrust
from tests.support import free_port, uvicorn_serving

VARY = re.compile(r"duration_ms=[\d.]+|127\.0\.0\.1:\d+|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")


def canon(text):
    return VARY.sub("<v>", scrub(text))


class In(BaseModel):
    i: int
    hold: float = 0.0


class Out(BaseModel):
    i: int


ENDED = []
CHANGES = []


@skill
async def score(req: In) -> Out:
    """Holds, fails on a negative i; first makes the case's change (the request is written)."""
    while CHANGES:
        CHANGES.pop()()
    if req.hold:
        await asyncio.sleep(req.hold)
    ENDED.append(time.time())
    if req.i < 0:
        raise ValueError("negative")
    return Out(i=req.i)


agent = Agent(name="s35-peer", description="Peer.", skills=[score])
RECORDS = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.name == "mesh._remote":
            RECORDS.append(record)


def shown(record, t0, t1):
    d = dict(record.__dict__)
    created = d.pop("created")
    msecs, relative = d.pop("msecs"), d.pop("relativeCreated")
    times = {
        "in_call": t0 <= created <= t1,
        "after_peer": not ENDED or created >= ENDED[-1],
        "msecs": msecs == int((created - int(created)) * 1000) + 0.0,
        "relative": abs(relative - (created - logging._startTime) * 1000) < 1e-6,
    }
    # The values (the message shows them, the duration aside): their types here.
    d["args"] = [type(a).__name__ for a in d["args"]] if d.get("args") else d.get("args")
    for k in ("thread", "process"):  # each process's own: whether there is one
        d[k] = None if d.get(k) is None else "<n>"
    if d.get("lineno"):  # a caller lookup's: where the code is in its tree
        d["lineno"], d["pathname"] = "<n>", os.path.basename(d["pathname"])
    for k in ("message", "asctime"):
        if k in d:
            d[k] = canon(str(d[k]))
    return [times, {k: canon(repr(v)) for k, v in sorted(d.items())}]


async def main(which):
    log_lines.configure("INFO")
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)
    logging.getLogger().addHandler(Keep())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=Path(tempfile.mkdtemp()), registry=None))
    url = f"http://127.0.0.1:{port}"
    anywhere = NetworkPolicy.parse("any")
    res = []
    async with uvicorn_serving(node.app, port, log_level="warning"):
        http = create_http_client(anywhere, timeout=httpx.Timeout(35.0, connect=2.0))
        registry = CollectorRegistry()
        toolset = remote("s35-peer", skill="score", url=url, deadline_s=0.6)
        toolset.bind(http=http, metrics=NodeMetrics(registry, "s35-coordinator"), caller="s35-coordinator",
                     trust=PeerTrust(networks=anywhere))
        remote_log = logging.getLogger("mesh._remote")

        def ctx(n):
            return ToolContext(agent_name="s35-coordinator", user_id="a2a", session_id=f"s-{n}", invocation_id=f"i-{n}",
                               metadata={"deadline": time.time() + 30, "usage_sink": [], "task_id": f"t-{n}",
                                         "traceparent": "00-" + "12" * 16 + "-" + "34" * 8 + "-01"})

        async def call(n, args):
            (tool,) = await toolset.tools(ctx(n))
            try:
                return ["ok", json.dumps(await tool.call(args, ctx(n)), sort_keys=True)]
            except Exception as exc:
                return ["error", type(exc).__name__, canon(str(exc))]

        srcfile = logging._srcfile
        factory = logging.getLogRecordFactory()

        def tagging(*args, **kwargs):
            record = factory(*args, **kwargs)
            record.tagged = "by the factory"
            return record

        cases = {
            "main": [
                ("ok", {"i": 1}, None, None),
                ("held", {"i": 2, "hold": 0.2}, None, None),
                ("fails", {"i": -1}, None, None),
                ("refused", {"i": "x"}, None, None),
                ("level-up", {"i": 4, "hold": 0.2}, lambda: remote_log.setLevel(logging.WARNING), lambda: remote_log.setLevel(logging.NOTSET)),
                ("level-down", {"i": 5, "hold": 0.2}, lambda: remote_log.setLevel(logging.NOTSET), lambda: remote_log.setLevel(logging.NOTSET)),
                ("disabled", {"i": 6, "hold": 0.2}, lambda: logging.disable(logging.INFO), lambda: logging.disable(logging.NOTSET)),
                ("lookup-on", {"i": 7, "hold": 0.2}, lambda: setattr(logging, "_srcfile", logging.__file__), lambda: setattr(logging, "_srcfile", srcfile)),
                ("deadline", {"i": 3, "hold": 1.5}, None, None),
            ],
            "factory": [
                ("factory", {"i": 8, "hold": 0.2}, lambda: logging.setLogRecordFactory(tagging), lambda: logging.setLogRecordFactory(factory)),
            ],
            "threads": [
                ("threads-on", {"i": 9, "hold": 0.2}, lambda: setattr(logging, "logThreads", True), lambda: setattr(logging, "logThreads", False)),
                ("processes-on", {"i": 10, "hold": 0.2}, lambda: setattr(logging, "logProcesses", True), lambda: setattr(logging, "logProcesses", False)),
            ],
        }[which]
        for n, (name, args, change, undo) in enumerate(cases):
            if name == "level-down":
                remote_log.setLevel(logging.WARNING)
            RECORDS.clear()
            stream.seek(0)
            stream.truncate()
            ENDED.clear()
            if change is not None:
                CHANGES.append(change)
            t0 = time.time()
            got = await call(n, args)
            t1 = time.time()
            if undo is not None:
                undo()
            lines = [canon(l) for l in stream.getvalue().splitlines() if "mesh._remote" in l]
            res.append([name, got, lines, [shown(r, t0, t1) for r in RECORDS]])
        RECORDS.clear()
        ENDED.clear()
        t0 = time.time()
        many = await asyncio.gather(*(call(100 + k, {"i": k, "hold": 0.05 * (k % 3)}) for k in range(20)))
        t1 = time.time()
        res.append(["many", sorted(json.dumps(m) for m in many),
                    sorted(json.dumps(shown(r, t0, t1)[1], sort_keys=True) for r in RECORDS),
                    all(shown(r, t0, t1)[0]["in_call"] for r in RECORDS)])
        await toolset.aclose()
        await http.aclose()
    print(json.dumps({"mesh": mesh.__file__, "res": res}))


asyncio.run(main(sys.argv[1]))
'''
)


@pytest.mark.integration
def test_delegation_lines_and_records_under_serve_logging_are_the_tree_before(
    trees: Trees,
) -> None:
    """9fad015: the line's text and its record (every attribute but the times; the times those
    of a record made when logged) under mesh serve's logging, with the logging changed while
    the peer works (level up or down, disable, the caller lookup on). Holds."""
    now, before = _both(trees, _LINE_DRIVER, "main")
    assert now["res"][0][2], now["res"][0]  # a line
    _same(now, before)


@pytest.mark.integration
def test_a_record_factory_installed_while_the_peer_works_makes_the_line(trees: Trees) -> None:
    """A log record factory installed while the peer works (OpenTelemetry's
    LoggingInstrumentor.instrument() installs one) makes that call's delegation line, with the
    factory's attributes. Broken by 9fad015 (the record made at the request's write with the
    stock factory, the factory not asked again), fixed by ebb0287."""
    now, before = _both(trees, _LINE_DRIVER, "factory")
    assert "by the factory" in json.dumps(before)
    _same(now, before)


# --- db501ed: a task's save committed at once (write_now) once writes come alone --------------
#
# One request at a time (write_now armed after ALONE_AFTER batches of one write), then: a 24 MB
# answer (its row's write past the loop's budget), a duplicate, another connection holding the
# write lock for 0.5 s, a save that fails (the WAL cannot grow: RLIMIT_FSIZE, SIGXFSZ ignored),
# the limit lifted, more requests; each answer,
# GetTask of each, ListTasks, and the rows a new connection reads. In a process of its own.

_WRITE_NOW_DRIVER = (
    prelude()
    + r'''
import asyncio, json, os, re, resource, signal, sqlite3, sys, tempfile, time
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
H = {"A2A-Version": "1.0"}
FILES = re.compile(r"/tmp/\w+")


def canon(text):
    return parsed(FILES.sub("<dir>", scrub(text)))


class In(BaseModel):
    i: int
    size: int = 0


class Out(BaseModel):
    i: int
    pad: str = ""


@skill
def pad(req: In) -> Out:
    """Its number back, padded."""
    return Out(i=req.i, pad="p" * req.size)


agent = Agent(name="s35-now", description="Writes.", skills=[pad])


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    res, ids = [], []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        async def send(mid, i, size=0):
            message = {"role": "ROLE_USER", "messageId": mid, "contextId": "ctx",
                       "parts": [{"data": {"i": i, "size": size}}], "metadata": {"skill": "pad"}}
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                    "params": {"message": message, "configuration": {"historyLength": 0}}}
            r = await http.post("/", json=body, headers=H)
            got = r.json()
            task = got.get("result", {}).get("task")
            if task:
                ids.append(task["id"])
                for a in task.get("artifacts", []):
                    for p in a.get("parts", []):
                        if "data" in p:
                            p["data"]["pad"] = len(p["data"]["pad"])
                        if "text" in p:
                            p["text"] = len(p["text"])
            return [r.status_code, canon(json.dumps(got))]

        for i in range(12):
            res.append(await send(f"m{i}", i))
        res.append(await send("big", 100, 24 << 20))
        res.append(await send("m0", 0))  # a duplicate
        res.append(await send("after-big", 101))
        for i in range(12):
            res.append(await send(f"n{i}", 200 + i))
        # Another connection holds the write lock for 0.5 s (a `mesh tasks` command, a backup).
        holder = sqlite3.connect(tmp / "node.db", isolation_level=None, check_same_thread=False)
        holder.execute("begin immediate")
        release = asyncio.get_running_loop().call_later(0.5, holder.execute, "commit")
        t0 = time.monotonic()
        res.append(await send("locked", 150))
        res.append(["waited for the lock", time.monotonic() - t0 >= 0.45])
        release.cancel()
        holder.close()
        for i in range(10):
            res.append(await send(f"k{i}", 160 + i))
        wal = os.path.getsize(tmp / "node.db-wal")
        resource.setrlimit(resource.RLIMIT_FSIZE, (wal + 50_000, resource.RLIM_INFINITY))
        try:
            res.append(await send("full", 300, 400_000))
            res.append(await send("full-small", 301))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        res.append(await send("full", 300, 400_000))  # again, the limit lifted
        res.append(await send("later", 302))
        gets = []
        for tid in ids:
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid, "historyLength": 0}}
            r = await http.post("/", json=body, headers=H)
            got = r.json()
            gets.append([r.status_code, got.get("result", {}).get("status", {}).get("state"), canon(json.dumps(got.get("error")))])
        body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "ctx", "pageSize": 100}}
        listed = (await http.post("/", json=body, headers=H)).json()["result"]
        res.append(["list", len(listed["tasks"]), [t["status"]["state"] for t in listed["tasks"]]])
    conn = sqlite3.connect(tmp / "node.db")
    rows = [[int(s), n] for s, n in conn.execute("select state, length(data) > 1000000 from a2a_tasks order by updated_at, id")]
    keys = conn.execute("select count(*) from a2a_message_keys").fetchone()[0]
    print(json.dumps({"mesh": mesh.__file__, "res": res, "gets": gets, "rows": rows, "keys": keys}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_saves_committed_at_once_answer_and_store_as_the_tree_before(trees: Trees) -> None:
    """db501ed's write_now path (armed by one request at a time): a 24 MB row, a duplicate, a
    save the disk refuses and the requests after it: the answers, GetTask, ListTasks, the rows
    and message keys."""
    now, before = _both(trees, _WRITE_NOW_DRIVER)
    _same(now, before)


# --- 5d282c8: an answer whose send waits (the caller reads slowly) ---------------------------
#
# A caller that pipelines two requests on one connection and reads nothing: the first's 16 MB
# answer fills the connection's buffers, so the second's send waits for room (uvicorn awaits
# the transport's drain before a send when writing is paused). Meanwhile, from another
# connection: the second's task, completed (ListTasks), and a /metrics scrape; the node's log.

_SLOW_READER_DRIVER = r'''
import asyncio, importlib, json, logging, socket, sys, tempfile, time
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._listener import http_protocol
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}


class In(BaseModel):
    size: int = 0


class Out(BaseModel):
    pad: str = ""


@skill
def big(req: In) -> Out:
    """A big answer."""
    return Out(pad="b" * req.size)


@skill
def small(req: In) -> Out:
    """A small one."""
    return Out(pad="s")


agent = Agent(name="s35-reader", description="Answers.", skills=[big, small])
LINES = []


WARNINGS = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.name == "mesh.task":
            LINES.append(record.getMessage().split(" task=")[0])
        elif record.name.startswith("mesh") and record.levelno >= logging.INFO and "serving at" not in record.getMessage():
            WARNINGS.append(f"{record.levelname} {record.getMessage()}")


def request(mid, skill_id, ctx, size=0):
    message = {"role": "ROLE_USER", "messageId": mid, "contextId": ctx, "parts": [{"data": {"size": size}}],
               "metadata": {"skill": skill_id}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message,
                       "configuration": {"historyLength": 0}}}).encode()
    return (b"POST / HTTP/1.1\r\nHost: x\r\nA2A-Version: 1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


async def main():
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.INFO)
    port = free_port()
    settings = NodeSettings(port=port, data_dir=Path(tempfile.mkdtemp()), registry=None, grace_seconds=2.0)
    node = Node(agent, settings)
    out = {"mesh": mesh.__file__}
    async with (
        uvicorn_serving(node.app, port, log_level="warning", http=http_protocol()),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        async def seen():
            text = (await http.get("/metrics")).text
            counted = sorted(l for l in text.splitlines() if l.startswith(("mesh_tasks_total{", "mesh_tasks_in_flight{")))
            return {"metrics": counted, "lines": sorted(LINES)}

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(request("a", "big", "ctx-a", 16 << 20) + request("b", "small", "ctx-b"))
        await writer.drain()
        done, end = False, time.monotonic() + 10
        while not done and time.monotonic() < end:
            r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "ctx-b"}}, headers=H)
            tasks = r.json()["result"]["tasks"]
            done = bool(tasks) and tasks[0]["status"]["state"] == "TASK_STATE_COMPLETED"
            if not done:
                await asyncio.sleep(0.02)
        out["b_completed"] = done
        out["while_unread"] = await seen()
        if sys.argv[1:] == ["drain"]:  # the node stops now (mesh serve's SIGTERM)
            server, node_module = (importlib.import_module(m) for m in ("mesh._a2a.server", "mesh._node"))
            server.STOP_WAIT_S = node_module.ANSWER_WAIT_S = 1.0  # shorter waits
            t0 = time.monotonic()
            idle = await node.drain()
            out["drained"] = [idle, "within 0.5 s" if time.monotonic() - t0 < 0.5 else "after 0.5 s", sorted(WARNINGS)]
            writer.close()
            print(json.dumps(out))
            return
        async def read_all():
            while await reader.read(1 << 20):
                pass

        reading = asyncio.ensure_future(read_all())
        end = time.monotonic() + 10
        while time.monotonic() < end and len(LINES) < 2:
            await asyncio.sleep(0.02)
        out["after_reading"] = await seen()
        writer.close()
        reading.cancel()
    print(json.dumps(out))


asyncio.run(main())
'''


@pytest.mark.integration
def test_a_task_completed_behind_a_slow_reader_is_counted_and_logged(trees: Trees) -> None:
    """The second request's task is completed (ListTasks) while its answer waits for room:
    the tasks counted, the in-flight gauge and the log lines then, and after the caller read.
    Broken by 5d282c8 (the work waited behind uvicorn's drain before the send: not counted,
    in flight and unlogged until the caller read), fixed by 8ea9a87 (run while the send
    waits)."""
    now, before = _both(trees, _SLOW_READER_DRIVER, "read")
    assert before["b_completed"]
    _same(now, before)


@pytest.mark.integration
def test_thread_and_process_fields_turned_on_while_the_peer_works_are_in_the_line(
    trees: Trees,
) -> None:
    """``logging.logThreads`` / ``logProcesses`` turned on while the peer works (mesh serve
    turns them off): the line's record has the thread's and process's fields as a record made
    when logged has them. Broken by 9fad015 (thread, threadName and process None, taken at
    the request's write), fixed by 8dce996."""
    now, before = _both(trees, _LINE_DRIVER, "threads")
    assert "MainThread" in json.dumps(before)
    _same(now, before)


# --- bb68342: a slow or silent peer times out at the same budget ----------------------------
#
# DirectPool.post to a peer that answers the first request on a connection and then goes silent
# (the second goes over the kept connection: written before the deadline is entered), to one
# silent from the start (a new connection), and to one that takes the whole budget to accept
# the request's bytes (a 16 MB body, read slowly): how each ends and when (before, at or after
# the 0.5 s budget).

_DEADLINE_DRIVER = r"""
import asyncio, json, sys, time

import httpx

import mesh
from mesh._pool import DirectPool

BUDGET = 0.5


async def main():
    served = {"posts": 0}

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                slow = length > 1_000_000
                got = 0
                while got < length:
                    chunk = await reader.read(min(65536, length - got))
                    if not chunk:
                        return
                    got += len(chunk)
                    if slow:
                        await asyncio.sleep(0.05)
                served["posts"] += 1
                if served["posts"] == 1:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
                    continue
                await asyncio.sleep(5)  # silent
                return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)
    out = {"mesh": mesh.__file__, "ends": []}

    async def post(body):
        t0 = time.monotonic()
        try:
            got = await pool.post(httpx.URL(url), [("Content-Type", "application/json")], body, timeout=BUDGET, connect_timeout=2.0,
                                  max_bytes=1 << 20, too_large=lambda: ValueError("large"))
            end = ["ok", got[0]]
        except Exception as exc:
            end = ["error", type(exc).__name__, str(exc)]
        ratio = (time.monotonic() - t0) / BUDGET
        out["ends"].append([end, "early" if ratio < 0.95 else "at the budget" if ratio < 1.6 else "late"])

    await post(b"{}")  # answered: the connection kept
    await post(b"{}")  # kept connection, silent
    await post(b"{}")  # a new connection, silent
    await post(b"x" * (16 << 20))  # its bytes accepted slowly
    await pool.aclose()
    server.close()
    print(json.dumps(out))


asyncio.run(main())
"""


@pytest.mark.integration
def test_a_silent_peer_times_out_at_the_same_budget(trees: Trees) -> None:
    """Holds (bb68342): the kept connection's silent answer, a new connection's and a request
    whose bytes take the budget end the same way at the same time (the budget's end)."""
    now, before = _both(trees, _DEADLINE_DRIVER)
    assert before["ends"][0][0] == ["ok", 200]
    _same(now, before)


@pytest.mark.integration
def test_a_node_stopping_behind_a_slow_reader_drains_as_before(trees: Trees) -> None:
    """A node stopping (Node.drain, grace 2 s) while a completed task's answer waits for its
    slow reader: idle, only '1 answer(s) still unsent when stopping'. Broken by 5d282c8 (the
    task still in flight: 'draining: waiting up to 2s for 1 task(s)', the whole grace waited,
    'grace period over: ending 0 task(s)', '1 task(s) did not stop in time', drain False),
    fixed by 8ea9a87 (the work runs while the send waits)."""
    now, before = _both(trees, _SLOW_READER_DRIVER, "drain")
    _same(now, before)


@pytest.mark.integration
@pytest.mark.postgres
def test_a_postgresql_store_of_the_tree_before_is_read_listed_continued_and_swept_alike(
    trees: Trees, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same on PostgreSQL: a database made by 4d880a6 (tasks 5), copied twice (``create
    database ... template``), one opened by this tree (6: retention's index rebuilt with its
    condition as comparisons, the queries naming it; 7 a no-op there: eaf4fb2, 9acb821), one
    by 4d880a6: everything read, listed, replayed, continued and swept the same. Holds."""
    import psycopg

    url = request.getfixturevalue("pg_database")  # skips when there is no server
    _all(trees, [("before", _STORE_DRIVER, ("make", str(tmp_path / "made"), url))])
    base, _, name = url.rpartition("/")
    copies = {}
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        for side in ("now", "before"):
            copies[side] = f"{name}_{side}"
            conn.execute(f"create database {copies[side]} template {name}")
    try:
        for side in ("now", "before"):
            shutil.copytree(tmp_path / "made", tmp_path / f"read-{side}")
        now, before = _all(
            trees,
            [
                (side, _STORE_DRIVER, ("read", str(tmp_path / f"read-{side}"), f"{base}/{db}"))
                for side, db in copies.items()
            ],
        )
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            for db in copies.values():
                conn.execute(f"drop database if exists {db} with (force)")
    assert now["swept"]["tasks"] > 0
    # /v1/traces/{id}/tasks on PostgreSQL: a 500 at 4d880a6 (the tool calls' read asked
    # sqlite_master), answered since 5bce5ae: the trace's 9 tasks, then 15 with the new ones.
    for phase, tasks in (("first", 9), ("restart", 15)):
        assert before[phase]["trace"][0] == 500
        status, answer = now[phase].pop("trace")
        before[phase].pop("trace")
        assert status == 200, answer
        assert len(answer["tasks"]) == tasks
    now_schema, before_schema = dict(now.pop("schema")), dict(before.pop("schema"))
    assert now_schema["tasks"] == 7, now_schema
    assert before_schema["tasks"] == 5, before_schema
    _same(now, before)

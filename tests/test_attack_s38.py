"""Attack cases (session 38) on this session's changes, each claiming no behaviour change:

* the specialist's settled typed task not parsed back unless read (ca5802b: ``Settled.task``
  parsed lazily from its row, ``Settled.stand_in`` handed to the store and to ``FastRoute``,
  whose ``_settled_cut`` cuts the history from the held one; the 180 / 90 bytes bound of a
  history message that could nest near upb's depth) and the five-byte varints (d2333ef);
* the coordinator's first try in line in ``call_with_failover`` and the closed breaker's fast
  paths (26fe846), ``DirectPool.post``'s free slot without ``Semaphore.acquire`` and
  ``timeout.__enter__`` written out (0c0166f).

Each driver runs in a process of each tree: this checkout ("now", or ``S38_NOW``) and
``git archive d67a51c`` ("before", the session's base), with PYTHONSAFEPATH=1
(``tests.test_attack_s35._env``), and the outputs are compared: answers on both bindings,
errors, GetTask / ListTasks before and after a restart, the stored rows, log lines; for the
coordinator, every outcome of a failover call (result or error, its reason, the instances
tried, breaker changes, retries, backoffs) and the pool's slots after waiters were cancelled.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the tree before behaves otherwise; each says how and which commit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import test_attack_s34 as s34
from tests import test_attack_s35 as s35
from tests.attack_prelude import prelude, quieted
from tests.support import ROOT, archived_tree

BEFORE = "d67a51c"
NOW = Path(os.environ.get("S38_NOW", str(ROOT)))


@dataclass
class Trees:
    """Where the driver scripts run, and the tree of ``BEFORE`` (``git archive``)."""

    work: Path
    before: Path

    def path(self, side: str) -> str:
        return str(self.before) if side == "before" else str(NOW)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s38-trees")
    return Trees(tmp, archived_tree(BEFORE, tmp / "before"))


_all = s35._all
_same = s35._same


def _both(trees: Trees, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    now, before = _all(trees, [("now", source, args), ("before", source, args)])  # type: ignore[arg-type]
    return now, before


def _in_turn(trees: Trees, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``_both``, one tree's process after the other's: for drivers racing a deadline."""
    (now,) = _all(trees, [("now", source, args)])  # type: ignore[arg-type]
    (before,) = _all(trees, [("before", source, args)])  # type: ignore[arg-type]
    return now, before


# --- 26fe846: call_with_failover's first try in line; the closed breaker's fast paths ---------
#
# ~1500 seeded calls of ``call_with_failover`` in one process: one to three instances (a list,
# a callable re-read before each try whose list changes, an empty one, a callable that raises),
# each try's outcome scripted per call (an answer, a retryable ConnectionError or TimeoutError,
# a final ValueError, a try that hangs past the attempt timeout or the call's deadline, a
# cancellation of the call while it waits), breakers closed, open, half-open or with their probe
# in flight beforehand (thresholds 1 and 3), deadlines none, passed, short and far, 1 to 3
# attempts. Each call's result or error (type, text, reason, cause), the instances tried, the
# retries told, the backoffs slept, every breaker change and each breaker's state afterwards.

_FAILOVER_DRIVER = r"""
import asyncio, json, random, sys

import mesh
from mesh._failures import reason_of
from mesh._resilience import BreakerBoard, CircuitOpen, DeadlineExceeded, RetryPolicy, call_with_failover

OUTCOMES = ["ok", "ok", "unavailable", "timeout", "final", "hang", "cancel", "late_ok"]


def described(exc):
    cause = exc.__cause__
    return [type(exc).__name__, str(exc), reason_of(exc) if isinstance(exc, Exception) else None,
            type(cause).__name__ if cause is not None else None]


async def one_call(rng, n):
    fake = [1000.0]
    clock = lambda: fake[0]
    names = ["a", "b", "c"][: rng.randint(1, 3)]
    kind = rng.choice(sys.argv[3].split(","))
    reads = [0]

    def shifting():
        reads[0] += 1
        return names[reads[0] % len(names):] + names[: reads[0] % len(names)]

    def raising(exc):
        def read():
            reads[0] += 1
            if reads[0] == 1 or rng.random() < 0.5:
                raise exc
            return names
        return read

    targets = {"list": names, "callable": lambda: list(names), "shifting": shifting, "empty": [],
               "raises_timeout": raising(TimeoutError("registry slow")),
               "raises_value": raising(ValueError("registry broken"))}[kind]
    changes = []
    board = BreakerBoard(failure_threshold=rng.choice([1, 3]), cool_down=5.0, clock=clock,
                         on_change=lambda t, s: changes.append([t, s.name]))
    for name in names:  # breakers as they were before the call
        pre = rng.choice(["closed", "closed", "failed", "open", "half_open", "probing"])
        b = board.get(name)
        if pre == "failed":
            b.record_failure()
        elif pre in ("open", "half_open", "probing"):
            for _ in range(board.failure_threshold):
                b.record_failure()
            if pre != "open":
                fake[0] += 6.0
            if pre == "probing":
                b.allow()
    slept = []

    async def sleep(delay):
        slept.append(round(delay, 6))
        fake[0] += delay

    policy = RetryPolicy(attempts=rng.randint(1, 3), initial_delay=0.1, max_delay=1.0, jitter=0.05,
                         attempt_timeout=rng.choice([None, None, 0.02]), sleep=sleep,
                         rng=random.Random(n))
    bound = rng.choice([None, None, "far", "passed", "now", "short"])
    deadline = {None: None, "far": fake[0] + 100.0, "passed": fake[0] - 1.0, "now": fake[0],
                "short": fake[0] + 0.03}[bound]
    script = [rng.choice(OUTCOMES) for _ in range(4)]
    tried, retried = [], []
    me = asyncio.current_task()

    async def attempt(target):
        i = len(tried)
        tried.append(target)
        outcome = script[i % len(script)]
        if outcome == "ok":
            return f"ok:{target}:{i}"
        if outcome == "late_ok":
            await asyncio.sleep(0)
            return f"late:{target}:{i}"
        if outcome == "unavailable":
            raise ConnectionError(f"{target} down")
        if outcome == "timeout":
            raise TimeoutError(f"{target} slow")
        if outcome == "final":
            raise ValueError(f"{target} refused")
        if outcome == "cancel":
            me.cancel()
            await asyncio.sleep(0)
            return "not cancelled?"
        if policy.attempt_timeout is None and bound != "short":
            return f"unbounded:{target}:{i}"  # nothing would end it
        await asyncio.sleep(3600)

    try:
        result = ["result", await call_with_failover(
            targets, attempt, policy=policy, breakers=board, deadline=deadline, clock=clock,
            on_retry=lambda t, e: retried.append([t, type(e).__name__, str(e)]))]
    except asyncio.CancelledError:
        result = ["cancelled", me.uncancel()]
    except Exception as exc:
        result = ["error", *described(exc)]
    states = {t: [b._state.name, b.failures, b._probe_in_flight] for t, b in board._breakers.items()}
    return [n, kind, len(names), script, policy.attempts, policy.attempt_timeout,
            bound, result, tried, retried,
            slept, changes, states, reads[0]]


async def main():
    out = []
    for n in range(int(sys.argv[2])):  # each call its own draws: a difference stays its own
        out.append(await asyncio.create_task(one_call(random.Random(f"{sys.argv[1]}-{n}"), n)))
    print(json.dumps({"mesh": mesh.__file__, "calls": out}))


asyncio.run(main())
"""


_KINDS = "list,list,callable,shifting,empty,raises_value"


@pytest.mark.parametrize("seed", ["1", "2"])
def test_failover_calls_of_every_outcome_are_the_tree_befores(trees: Trees, seed: str) -> None:
    """Lists and callables of instances (one raising a ValueError now and then): every outcome
    of the first try and the ones after, breakers of every state, deadlines passed, short and
    far."""
    now, before = _in_turn(trees, _FAILOVER_DRIVER, seed, "1000", _KINDS)
    kinds = {c[7][0] for c in now["calls"]}
    assert kinds == {"result", "error", "cancelled"}, kinds
    assert {c[7][1] for c in now["calls"]} >= {"DeadlineExceeded", "CircuitOpen", "ValueError"}
    _same(now, before)


def test_failover_whose_instances_callable_raises_timeout_is_the_tree_befores(
    trees: Trees,
) -> None:
    """``targets()`` raising ``TimeoutError`` (a registry read that timed out): the tree
    before read it inside ``one``, under ``_bounded``'s deadline, whose ``except TimeoutError``
    made it ``DeadlineExceeded`` (reason "deadline", not retried); 26fe846 reads it in line
    before the deadline's ``with``, so it is the ``TimeoutError`` itself (reason "unavailable",
    retried when attempts and the deadline allow). Without a deadline both raise it as is.
    Fixed: the choice is made under the deadline again."""
    now, before = _in_turn(trees, _FAILOVER_DRIVER, "3", "200", "raises_timeout")
    _same(now, before)


# --- ca5802b / d2333ef: a settled typed task not parsed unless read; five-byte varints --------
#
# A typed node (mesh's own store) answers, on JSON-RPC and REST: every historyLength (unset,
# 0, 1, 2, 3, past the history, 2**31-1, negative), with and without progress messages; a
# messageId sent again (the replay) and again with another historyLength; data nested 20 to 36
# objects or lists deep, with one-letter and 40-letter keys, in the data and in the message's
# metadata (upb's depth is crossed in there: the task's parse decides, before and now); flat
# data over 180 bytes made of bytes a key can begin with ("bjrz": the parse at once) or not
# ("x": the stand-in); odd unicode; a message with reference task ids and extensions. Each
# answer, GetTask (unset and 1) right after it, ListTasks, GetTask after a restart, the rows
# (their JSON) and mesh's log lines.

_LAZY_DRIVER = (
    prelude(quiet=True)
    + r'''
import asyncio, json, logging, re, sqlite3, sys, tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, SkillContext, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}


VARY = re.compile(r"duration_ms=[\d.]+|127\.0\.0\.1:\d+|/tmp/[\w/.-]+")


def canon(text):
    return sorted_json(scrub(counted_runs(VARY.sub("<vary>", text))))


class Deep(BaseModel):
    v: Any = None
    s: str = ""
    said: list[str] = []


class Out(BaseModel):
    n: int
    s: str


@skill
async def deep(req: Deep, ctx: SkillContext) -> Out:
    """Answers the size of what it was given."""
    for text in req.said:
        await ctx.progress(text)
    return Out(n=len(json.dumps(req.v)), s=req.s[:40])


agent = Agent(name="s38-lazy", description="Deep.", skills=[deep])
LOGS = Logs()
logging.getLogger("mesh").addHandler(LOGS)
logging.getLogger("mesh").setLevel(logging.INFO)


def nested(kind, depth, key):
    v = "end"
    for _ in range(depth):
        v = {key: v} if kind == "obj" else [v, 1]
    return v


def cases():
    for length in (None, 0, 1, 2, 3, 4, 2**31 - 1, -1):
        for said in ([], ["one"], ["a", "b", "c"]):
            yield {"v": {"k": 1}, "s": "plain", "said": said}, {}, length
    for kind in ("obj", "list"):
        for key in ("a", "k" * 40):
            for depth in range(20, 37, 2 if key == "a" else 4):
                if kind == "list" and key != "a":
                    continue
                yield {"v": nested(kind, depth, key), "s": f"{kind}{depth}"}, {}, None
                if kind == "obj":
                    yield {"v": 1, "s": f"meta{depth}"}, {"deep": nested(kind, depth, key)}, 1
    for s in ("bjrz" * 60, "x" * 300, '"*2:' * 70, "\u2028\u2029\x00\x7f\ufeff\U0001f642" * 30, "z" * 181):
        for said in ([], [s[:200]]):
            yield {"v": s, "s": s, "said": said}, {}, None
            yield {"v": {"b": s, "j": [s, {"r": s}]}, "s": s[:10], "said": said}, {}, 2


async def serve(data, steps):
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=data, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        return await steps(http)


async def rpc(http, method, params, n=1):
    r = await http.post("/", json={"jsonrpc": "2.0", "id": n, "method": method, "params": params}, headers=H)
    return r


async def get(http, tid, length=None):
    params = {"id": tid, **({"historyLength": length} if length is not None else {})}
    return canon((await rpc(http, "GetTask", params)).text)


async def main():
    data = Path(tempfile.mkdtemp())
    ids = []

    async def first(http):
        res = []
        n = 0
        for data_, meta, length in cases():
            for rest in (False, True):
                n += 1
                msg = {"role": "ROLE_USER", "messageId": f"m-{n}", "parts": [{"data": data_}],
                       "metadata": {"skill": "deep", **meta}}
                if n % 5 == 0:
                    msg["referenceTaskIds"] = ["t-1", "t-2"]
                    msg["extensions"] = ["https://x/ext"]
                params = {"message": msg}
                if length is not None:
                    params["configuration"] = {"historyLength": length}
                if rest:
                    r = await http.post("/a2a/rest/message:send", json=params, headers=H)
                else:
                    r = await rpc(http, "SendMessage", params, n)
                try:
                    body = r.json()
                    task = (body.get("result") or body).get("task") or {}
                except ValueError:
                    task = {}
                tid = task.get("id")
                ids.append(tid)
                row = [n, length, rest, r.status_code, canon(r.text)]
                if tid:
                    row += [await get(http, tid), await get(http, tid, 1)]
                if n % 7 == 0:
                    # the same message again: the replay, then with another historyLength
                    again = await (http.post("/a2a/rest/message:send", json=params, headers=H)
                                   if rest else rpc(http, "SendMessage", params, n))
                    params["configuration"] = {"historyLength": 1}
                    third = await rpc(http, "SendMessage", params, n)
                    row += [again.status_code, canon(again.text), canon(third.text)]
                res.append(row)
        # 60 at once (the store's writes batched, GetTask racing the next ones' writes)
        async def one(k):
            said = [f"s{k}"] * (k % 3)
            params = {"message": {"role": "ROLE_USER", "messageId": f"c-{k}", "metadata": {"skill": "deep"},
                                  "parts": [{"data": {"v": {"k": k}, "s": "x" * (k * 7), "said": said}}]},
                      "configuration": {"historyLength": k % 4} if k % 5 else {}}
            if k % 2:
                r = await http.post("/a2a/rest/message:send", json=params, headers=H)
            else:
                r = await rpc(http, "SendMessage", params, k)
            tid = ((r.json().get("result") or r.json()).get("task") or {}).get("id")
            return [tid, k, r.status_code, canon(r.text), await get(http, tid, k % 3) if tid else None]

        for row in await asyncio.gather(*(one(k) for k in range(60))):
            ids.append(row.pop(0))  # in k's order: the restart reads them in it
            res.append(row)
        listed = await rpc(http, "ListTasks", {"pageSize": 100})
        listed = listed.json()
        token = listed["result"].pop("nextPageToken", None)  # its time and id: a row's
        return {"sends": res, "list": canon(json.dumps(listed)), "token": bool(token)}

    out = {"mesh": mesh.__file__, "first": await serve(data, first)}

    async def second(http):
        return [[await get(http, tid), await get(http, tid, 2)] if tid else None for tid in ids]

    out["restart"] = await serve(data, second)
    from a2a.types import Task
    from google.protobuf.json_format import MessageToJson

    conn = sqlite3.connect(data / "node.db")
    out["rows"] = sorted(json.dumps([canon(MessageToJson(Task.FromString(blob))), state])
                         for (blob, state) in conn.execute("select data, state from a2a_tasks"))
    conn.close()
    out["logs"] = LOGS.lines
    print(json.dumps(out))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_settled_typed_tasks_are_answered_read_and_stored_as_the_tree_before(
    trees: Trees,
) -> None:
    """Every historyLength, progress, replays, data and metadata nested around upb's depth,
    big history messages of key-like bytes and not, odd unicode: answers on both bindings,
    GetTask, ListTasks, GetTask after a restart, the rows and log lines."""
    now, before = _both(trees, _LAZY_DRIVER)
    sends = now["first"]["sends"]
    assert any(r[3] == 200 and '"history"' in r[4] for r in sends), sends[:2]
    _same(now, before)


# --- 0c0166f: DirectPool.post's free slot without acquire(); timeout.__enter__ written out ----
#
# A DirectPool of 2 connections against an in-process peer that answers each POST when let:
# two posts hold the slots, waiters queue (one cancelled while queued, one past its deadline:
# PoolTimeout, one cancelled right after a slot was handed to it), holders cancelled mid-answer,
# then seeded storms of posts cancelled after 0 to 3 loop turns. Each post's outcome, and the
# slots after each stage (the semaphore's value and waiters: none leaked, none released twice).
# Then ``_timeouts.timeout`` / ``timeout_at``: delays None, 0, negative, NaN, short, long,
# nested in every order, rescheduled, entered twice, left early; which fired, in what order,
# the errors' texts.

_POOL_DRIVER = r"""
import asyncio, json, math, random, sys

import httpx

import mesh
from mesh import _timeouts
from mesh._pool import DirectPool

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Peer:
    def __init__(self):
        self.gate = asyncio.Event()
        self.gate.set()
        self.seen = 0

    async def serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                await reader.readexactly(length)
                self.seen += 1
                await self.gate.wait()
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def slots(pool):
    s = pool._slots
    return None if s is None else [s._value, len(s._waiters or ())]


async def outcome(aw):
    try:
        status, body = await aw
        return ["ok", status, body.decode()]
    except asyncio.CancelledError:
        return ["cancelled"]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]


async def pools():
    peer = Peer()
    server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
    url = httpx.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/")
    pool = DirectPool(None, max_connections=2, keepalive_expiry=30.0)
    out = []

    def post(timeout=30.0):
        return pool.post(url, [("Content-Type", "application/json")], b"{}", timeout=timeout,
                         connect_timeout=30.0, max_bytes=1000, too_large=lambda: ValueError("big"))

    async def turns(n):
        for _ in range(n):
            await asyncio.sleep(0)

    async def until(check):
        for _ in range(100000):
            if check():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("never")

    out.append(["first", await outcome(post()), slots(pool)])
    # two holders, then waiters
    peer.gate.clear()
    holders = [asyncio.create_task(outcome(post())) for _ in range(2)]
    await until(lambda: peer.seen >= 3)
    waiters = [asyncio.create_task(outcome(post(30.0 if i != 1 else 0.05))) for i in range(4)]
    await turns(3)
    out.append(["queued", slots(pool)])
    waiters[0].cancel()
    await until(lambda: waiters[1].done())
    out.append(["timed out", slots(pool)])
    peer.gate.set()
    # a slot handed to waiter 2: cancel it before it runs
    await until(lambda: holders[0].done() or holders[1].done())
    waiters[2].cancel()
    res = [await h for h in holders] + [await w if not w.cancelled() else ["task cancelled"] for w in waiters]
    out.append(["after", res, slots(pool)])
    # a holder cancelled mid-answer
    peer.gate.clear()
    held = asyncio.create_task(outcome(post()))
    seen = peer.seen
    await until(lambda: peer.seen > seen)
    held.cancel()
    out.append(["holder cancelled", await held if not held.cancelled() else ["task cancelled"], slots(pool)])
    peer.gate.set()
    out.append(["again", await outcome(post()), slots(pool)])
    # storms: posts cancelled after 0..3 turns
    rng = random.Random(int(sys.argv[1]))
    for storm in range(8):
        tasks = [asyncio.create_task(outcome(post())) for _ in range(rng.randint(1, 9))]
        cut = [rng.choice([None, None, 0, 1, 2, 3]) for _ in tasks]
        for t, c in zip(tasks, cut):
            if c == 0:
                t.cancel()
        for n in range(1, 4):
            await asyncio.sleep(0)
            for t, c in zip(tasks, cut):
                if c == n:
                    t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await until(lambda: slots(pool)[0] == 2)
        ok = [t.result()[0] for t, c in zip(tasks, cut) if c is None]
        out.append(["storm", storm, ok, slots(pool)])
    out.append(["last", [await outcome(post()) for _ in range(3)], slots(pool)])
    await pool.aclose()
    server.close()
    return out


async def deadlines():
    out = []
    loop = asyncio.get_running_loop()

    async def run(name, delays, body):
        fired = []
        async def inner(level):
            if level == len(delays):
                return await body(fired)
            d = delays[level]
            cm = _timeouts.timeout(d) if not (isinstance(d, tuple)) else _timeouts.timeout_at(loop.time() + d[0])
            try:
                with cm:
                    r = await inner(level + 1)
                fired.append([level, "left", cm.expired()])
                return r
            except TimeoutError:
                fired.append([level, "TimeoutError", cm.expired()])
                raise
        try:
            r = await inner(0)
            out.append([name, "returned", r, fired])
        except BaseException as exc:
            out.append([name, type(exc).__name__, str(exc), fired])

    async def sleeper(seconds):
        async def body(fired):
            await asyncio.sleep(seconds)
            return "slept"
        return body

    # Deadlines that may fire 140 ms apart at least: a loaded host does not swap them.
    values = [None, 0, -1, math.nan, 0.01, 0.15, 1000, (0.3,), (-1,)]
    for a in values:
        for b in [None] + values[::2]:
            fires = {a, b} - {None, 1000}
            await run(f"{a} {b}", [a] if b is None else [a, b], await sleeper(0.6 if fires else 0))
    await run("three", [0.3, 0.01, 1000], await sleeper(1))
    await run("three'", [1000, 0.3, 0.01], await sleeper(1))

    async def resched(fired):
        t = _timeouts.timeout(1000)
        with t:
            t.reschedule(loop.time() + 0.01)
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                fired.append("cancelled inside")
                raise
        return "not reached"
    try:
        await resched([])
    except TimeoutError as exc:
        out.append(["rescheduled", type(exc).__name__])
    t = _timeouts.timeout(1)
    with t:
        pass
    for op in (lambda: t.__enter__(), lambda: t.reschedule(1.0), lambda: _timeouts.timeout(1).reschedule(1.0)):
        try:
            op()
            out.append(["op", "ok"])
        except Exception as exc:
            out.append(["op", type(exc).__name__, str(exc)])
    try:
        _timeouts.timeout("x").__enter__()
    except Exception as exc:
        out.append(["str delay", type(exc).__name__, str(exc)])
    # many deadlines of one task entered and left early, then one that fires
    for i in range(300):
        with _timeouts.timeout(10 + i % 7):
            await asyncio.sleep(0)
    try:
        with _timeouts.timeout(0.01):
            await asyncio.sleep(1)
    except TimeoutError:
        out.append(["after 300 left", "fired"])
    return out


def outside():
    try:
        _timeouts.timeout(1).__enter__()
    except RuntimeError as exc:
        return str(exc)


async def main():
    print(json.dumps({"mesh": mesh.__file__, "pools": await pools(), "deadlines": await deadlines(), "outside": outside()}))


asyncio.run(main())
"""


@pytest.mark.integration
def test_pool_slots_and_deadlines_are_the_tree_befores(trees: Trees) -> None:
    """A pool's slots with waiters queued, cancelled, timed out, handed a slot and cancelled,
    holders cancelled, storms of cancelled posts: each outcome and the slots after (2 free, no
    waiter left). Deadlines of every delay nested in every order, rescheduled, misused."""
    now, before = _in_turn(trees, _POOL_DRIVER, "5")
    for stage in now["pools"]:
        if stage[0] in ("after", "again", "storm", "last"):
            assert stage[-1] == [2, 0], stage
    _same(now, before)


# --- 26fe846 / 0c0166f over the wire: remote() against a real node and hostile replicas -------
#
# Session 34's remote() driver (tests/test_attack_s34.py, run here against d67a51c): a real
# node and 19 hostile peers, 40 calls in flight, a 3 MB argument, then failover between the
# node and a replica that resets, is refused, answers 503 or garbage or cuts its answer, in
# either order. Answers, errors, retries, breaker changes, metrics and every mesh log line.


@pytest.mark.integration
def test_remote_calls_to_hostile_peers_and_failover_are_the_tree_befores(trees: Trees) -> None:
    """One tree after the other (deadlines of a second against resetting peers); a second
    pair of runs when the first differs: a loaded host may decide one race otherwise, a break
    differs again."""
    modes = ("rst_at_once", "refused", "s503", "garbage", "cut_mid_body", "rst_mid_body")
    args = (*s34._REMOTE_HELD, *(f"failover:{m}" for m in modes))
    source = s35._SERVE_LOGGING + quieted(s34._REMOTE_DRIVER)
    now, before = _in_turn(trees, source, *args)
    assert now["score"][0][0][0] == "ok", now["score"]
    if now != before:
        now, before = _in_turn(trees, source, *args)
    _same(now, before)

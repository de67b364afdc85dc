"""A delegation's bookkeeping that its answer does not need runs while the peer works.

``DirectPool.post`` calls ``sent()`` as soon as the request's bytes are written, before it waits
for the answer; a ``remote()`` call makes its delegation line's record there (``_Line``), and
logs it with its values and the time of its end, the same line as before. A failing ``sent()``
loses nothing: the answer is read as ever, the line logged the ordinary way. Real servers on
127.0.0.1: a raw HTTP/1.1 one that holds its answer, and a node on uvicorn whose skill waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel

from mesh import _remote
from mesh._agent import Agent
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._node import Node
from mesh._pool import DirectPool
from mesh._remote import RemoteAgent
from mesh._settings import NodeSettings
from mesh._skills import skill
from mesh._tools import ToolContext
from mesh._trust import PeerTrust
from tests.raw_http import connection_server, read_request
from tests.support import eventually, free_port, uvicorn_serving

pytestmark = pytest.mark.integration

ANSWER = b'{"ok":true}'


@contextlib.asynccontextmanager
async def held_server(release: asyncio.Event, bodies: list[bytes]) -> AsyncIterator[int]:
    """Answers each request once ``release`` is set (recording its body when it arrives)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            bodies.append(body)
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
            await writer.drain()

    async with connection_server(serve) as port:
        yield port


async def _post(
    pool: DirectPool,
    port: int,
    sent: object,
    body: bytes = b'{"q":1}',
    timeout: float = 10.0,  # noqa: ASYNC109 - the post's own budget
) -> tuple[int, bytes]:
    return await pool.post(
        httpx.URL(f"http://127.0.0.1:{port}/"),
        [("Content-Type", "application/json")],
        body,
        timeout=timeout,
        connect_timeout=5.0,
        max_bytes=1_000,
        too_large=lambda: AssertionError("too large"),
        sent=sent,  # type: ignore[arg-type]
    )


async def test_sent_runs_once_the_request_is_written_before_its_answer() -> None:
    release, bodies, calls = asyncio.Event(), list[bytes](), list[int]()
    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)
    try:
        async with held_server(release, bodies) as port:
            for round_ in (1, 2):  # a new connection, then the kept one
                release.clear()
                call = asyncio.ensure_future(_post(pool, port, lambda: calls.append(len(bodies))))
                await eventually(lambda n=round_: len(bodies) == n)  # type: ignore[misc]
                # The server holds the request: the bookkeeping ran, the answer is not read.
                assert len(calls) == round_
                assert not call.done()
                release.set()
                assert await call == (200, ANSWER)
            # Called right after each write, before the server had read a byte of it.
            assert calls == [0, 1]
    finally:
        await pool.aclose()


async def test_a_failing_sent_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    release, bodies = asyncio.Event(), list[bytes]()
    release.set()

    def broken() -> None:
        raise RuntimeError("the bookkeeping broke")

    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)
    try:
        async with held_server(release, bodies) as port:
            assert await _post(pool, port, broken) == (200, ANSWER)
            assert await _post(pool, port, broken) == (200, ANSWER)  # the connection was kept
        assert len(pool._idle) == 1
    finally:
        await pool.aclose()
    failures = [r for r in caplog.records if r.name == "mesh._pool" and r.exc_info]
    assert len(failures) == 2
    assert "the bookkeeping broke" in str(failures[0].exc_info[1])  # type: ignore[index]


# -- through remote() -------------------------------------------------------------------------


class Ask(BaseModel):
    applicant_id: str


class Score(BaseModel):
    score: int


#: The bureau's skill waits for this (set per test) before it answers.
_GO: dict[str, asyncio.Event] = {}


async def _score(req: Ask) -> Score:
    """Score an applicant (held until the test lets it answer)."""
    _GO["started"].set()
    await _GO["go"].wait()
    return Score(score=len(req.applicant_id))


@contextlib.asynccontextmanager
async def bureau(tmp: Path) -> AsyncIterator[str]:
    agent = Agent(name="bureau", description="scores", skills=[skill(_score, id="score")])
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None, grace_seconds=1))
    async with uvicorn_serving(node.app, port, what="the bureau", log_level="warning"):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def served_logging() -> Iterator[None]:
    """``mesh serve``'s logging switches (``mesh._cli.log_lines.configure``): no caller
    lookup, no thread or process fields."""
    names = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")
    kept = {name: getattr(logging, name) for name in names}
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(logging, name, value)


async def _call(url: str) -> tuple[object, float]:
    """One held call of the bureau's skill through ``remote()``; its answer and the time
    the skill was let go."""
    _GO.update(started=asyncio.Event(), go=asyncio.Event())
    anywhere = NetworkPolicy.parse("any")
    http = create_http_client(anywhere, timeout=httpx.Timeout(10.0, connect=2.0))
    rem = RemoteAgent(None, "score", url=url)
    rem.bind(http=http, caller="test-caller", trust=PeerTrust(networks=anywhere))
    ctx = ToolContext(agent_name="test-caller", user_id="u", session_id="s", invocation_id="i")
    try:
        (tool,) = await rem.tools(ctx)
        call = asyncio.ensure_future(tool.call({"applicant_id": "APP-1"}, ctx))
        await asyncio.wait_for(_GO["started"].wait(), 10.0)
        # The peer works: the line's record was made meanwhile (or not, per the test).
        await asyncio.sleep(0)
        released = time.time()
        _GO["go"].set()
        answer = await asyncio.wait_for(call, 10.0)
        assert rem.recent[-1].outcome == "ok"
        return answer, released
    finally:
        await rem.aclose()
        await http.aclose()


def _line(caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    (record,) = [
        r for r in caplog.records if r.getMessage().startswith("delegation caller=test-caller")
    ]
    assert re.fullmatch(
        r"delegation caller=test-caller peer=bureau skill=score outcome=ok attempts=1 "
        r"target=http://127\.0\.0\.1:\d+ task=[0-9a-f-]{36} duration_ms=\d+\.\d trace_id=[0-9a-f]{32}",
        record.getMessage(),
    ), record.getMessage()
    return record


async def test_the_line_is_made_while_the_peer_works_and_logged_at_the_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="mesh._remote")
    prepared: list[float] = []
    prepare = _remote._Line.prepare

    def noted(line: _remote._Line) -> None:
        prepare(line)
        prepared.append(time.time())

    monkeypatch.setattr(_remote._Line, "prepare", noted)
    with served_logging():
        async with bureau(tmp_path) as url:
            answer, released = await _call(url)
    assert answer == {"score": 5}
    # Made while the skill was held (before it was let go), logged after it answered, with
    # the time it was logged at, as log.info makes it.
    assert len(prepared) == 1
    assert prepared[0] <= released
    record = _line(caplog)
    assert record.created >= released
    assert record.msecs == int((record.created - int(record.created)) * 1000)
    assert (record.pathname, record.lineno, record.funcName) == (
        "(unknown file)",
        0,
        "(unknown function)",
    )
    assert isinstance(record.args, tuple)
    assert record.args[0] == "test-caller"


async def test_a_failing_preparation_loses_neither_the_answer_nor_the_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="mesh._remote")

    def broken(line: _remote._Line) -> None:
        raise RuntimeError("no record today")

    monkeypatch.setattr(_remote._Line, "prepare", broken)
    with served_logging():
        async with bureau(tmp_path) as url:
            answer, released = await _call(url)
    assert answer == {"score": 5}
    assert _line(caplog).created >= released  # logged the ordinary way
    assert any("no record today" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_with_the_callers_lookup_the_line_is_logged_as_ever(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A node inside someone else's application: logging finds the caller, so no record is
    # made ahead (it would not name its caller); the line is log.info's.
    caplog.set_level(logging.INFO, logger="mesh._remote")
    assert logging._srcfile is not None
    async with bureau(tmp_path) as url:
        answer, _ = await _call(url)
    assert answer == {"score": 5}
    record = _line(caplog)
    assert record.funcName == "_log_delegation"


# -- the deadline still bounds the whole exchange ---------------------------------------------


async def test_the_deadline_bounds_a_kept_connections_answer_from_its_write() -> None:
    # On a kept connection the request is written before the deadline is entered; the
    # answer it waits for is still cut at the deadline, counted from the call's start.
    release, bodies = asyncio.Event(), list[bytes]()
    release.set()
    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)
    try:
        async with held_server(release, bodies) as port:
            assert await _post(pool, port, None) == (200, ANSWER)  # the connection is kept
            release.clear()
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                await _post(pool, port, None, b'{"q":2}', timeout=0.3)
            assert 0.25 <= time.monotonic() - started < 2.0
            assert len(bodies) == 2  # it was sent, then its answer not waited for past 0.3 s
            release.set()
    finally:
        await pool.aclose()


async def test_the_deadline_bounds_the_wait_for_a_slot() -> None:
    release, bodies = asyncio.Event(), list[bytes]()
    pool = DirectPool(None, max_connections=1, keepalive_expiry=30.0)
    try:
        async with held_server(release, bodies) as port:
            first = asyncio.ensure_future(_post(pool, port, None))
            await eventually(lambda: len(bodies) == 1)
            started = time.monotonic()
            with pytest.raises(httpx.PoolTimeout):
                await _post(pool, port, None, b'{"q":2}', timeout=0.3)
            assert 0.25 <= time.monotonic() - started < 2.0
            release.set()
            assert await first == (200, ANSWER)
            assert await _post(pool, port, None) == (200, ANSWER)  # its slot was given back
    finally:
        await pool.aclose()


async def test_a_record_factory_installed_while_the_peer_works_makes_the_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As OpenTelemetry's LoggingInstrumentor installs one: the line is then the factory's
    # record, made when it is logged (the one made ahead with the stock one is dropped).
    caplog.set_level(logging.INFO, logger="mesh._remote")
    stock = logging.getLogRecordFactory()

    def traced(*args: object, **kwargs: object) -> logging.LogRecord:
        record = stock(*args, **kwargs)
        record.traced = True
        return record

    prepare = _remote._Line.prepare

    def then_installed(line: _remote._Line) -> None:
        prepare(line)
        assert line.record is not None  # made ahead with the stock factory
        logging.setLogRecordFactory(traced)

    monkeypatch.setattr(_remote._Line, "prepare", then_installed)
    try:
        with served_logging():
            async with bureau(tmp_path) as url:
                answer, _ = await _call(url)
    finally:
        logging.setLogRecordFactory(stock)
    assert answer == {"score": 5}
    assert getattr(_line(caplog), "traced", False)

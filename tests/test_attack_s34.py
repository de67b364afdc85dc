"""Attack cases (session 34) on this session's changes, each claiming no behaviour change:

* 506702b ``mesh._pool``: ``DirectPool``'s connections a protocol of their own
  (``_Connection``) instead of asyncio's ``StreamReader`` / ``StreamWriter`` (three breaks:
  a reset under a waiting write said 'Connection lost', an early answer then a half-close
  raised AttributeError, a 70 KB head in one piece was read; fixed by 70bdaef), and
  79c10a4's plain-call write;
* 79c10a4 ``mesh._timeouts``: a deadline left while it is the soonest popped at once (one
  difference, judged acceptable: two tasks' events at one loop instant may run in the other
  order, which asyncio leaves unspecified);
* 6646e05 a delegation's frozen dataclasses made without their ``__init__``; f6f55cf the
  direct call's headers; c24f883 the metadata's C encoder; 4357956 the retry hooks;
  55bacd8 the fast schema check's object step (end to end through ``remote()``);
* 1ef875b ``one_shot``: a held run's WORKING message kept as its fields;
* bcbfdf2 / b8f2990 fastroute/executor: the request's metadata and data part handed from
  the gate's parse instead of read back from their Structs; 5b87454 a held run's row made
  from its Settled.

Each driver runs in a process of each tree: this checkout ("now") and ``git archive 19420e3``
("before", the session's base), with PYTHONSAFEPATH=1 (``_env``): ``python -c`` puts the
working directory first on sys.path, and a child started in the checkout would import the
checkout's ``mesh`` before PYTHONPATH's tree.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the tree before, ``git archive 19420e3``, behaves otherwise; each says how and which commit);
a break fixed since is a passing test naming the commit that broke it and the one that fixed it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.attack_prelude import ASK_IDS, SPAN_IDS, prelude
from tests.support import ROOT, archived_tree, clean_env

BEFORE = "19420e3"


@dataclass
class Trees:
    """Where the driver scripts run, and the tree of ``BEFORE`` (``git archive``)."""

    work: Path
    before: Path

    def path(self, side: str) -> str:
        return str(self.before) if side == "before" else str(ROOT)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s34-trees")
    return Trees(tmp, archived_tree(BEFORE, tmp / "before"))


def _env(trees: Trees, side: str, **extra: str) -> dict[str, str]:
    """A driver's environment on ``side``'s tree (PYTHONSAFEPATH: see the module docstring),
    with one hash seed: jsonschema orders some errors by a set of the instance's keys (the
    order of a message's problems is the seed's, in either tree)."""
    return clean_env(PYTHONPATH=trees.path(side), PYTHONSAFEPATH="1", PYTHONHASHSEED="34", **extra)


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
    if not out.pop("mesh").startswith(str(trees.before if side == "before" else ROOT)):
        raise RuntimeError(f"the {side} driver imported another tree's mesh")
    return out


def _both(
    trees: Trees, source: str, *args: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The driver's output in each tree, both run at once (their own servers and ports)."""
    now = _start(trees, "now", source, *args, env=env)
    try:
        before = _start(trees, "before", source, *args, env=env)
    except BaseException:
        now.kill()
        now.wait()
        raise
    try:
        got_now = _read(trees, "now", now)
    finally:
        got_before = _read(trees, "before", before)
    return got_now, got_before


# --- 506702b: DirectPool's connections a protocol of their own ---------------------------------
#
# ``DirectPool.post`` (the coordinator's SendMessage to a peer) against a raw asyncio server in
# the driver's process that answers each scenario its way: what each post returns or raises
# (type and message: ``A2APeer``'s RemoteError says "the connection to ... failed: {error}"),
# how many connections stay idle, how many the server saw.

_POOL_DRIVER = r"""
import asyncio, json, os, socket, ssl, struct, sys, tempfile
from pathlib import Path
import httpx
import mesh
from mesh._pool import DirectPool

# With S34_TLS: the server speaks TLS (a trustme CA this process trusts, mesh._tls.trust).
TLS = None
if os.environ.get("S34_TLS"):
    import trustme
    from mesh._tls import trust

    _ca = trustme.CA()
    _bundle = Path(tempfile.mkdtemp()) / "ca.pem"
    _ca.cert_pem.write_to_path(str(_bundle))
    trust(_bundle)
    TLS = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _ca.issue_cert("127.0.0.1").configure_cert(TLS)

URL = None
HEAD = [("Content-Type", "application/json"), ("A2A-Version", "1.0")]


def rst(writer):
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, length


def ok(body=b'{"ok":1}', extra=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def one(scenario):
    seen = {"connections": 0, "requests": 0}
    gate = asyncio.Event()

    async def handle(reader, writer):
        seen["connections"] += 1
        try:
            await serve(scenario, reader, writer, seen, gate)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=TLS)
    port = server.sockets[0].getsockname()[1]
    url = httpx.URL(f"{'https' if TLS else 'http'}://127.0.0.1:{port}/")
    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)

    class TooLarge(Exception):
        pass

    async def post(body=b'{"q":1}', timeout=5.0, max_bytes=1 << 20, error_bytes=4096):
        try:
            status, answer = await pool.post(url, HEAD, body, timeout=timeout, connect_timeout=2.0,
                                             max_bytes=max_bytes, too_large=lambda: TooLarge("too large"),
                                             error_bytes=error_bytes)
            return ["ok", status, len(answer), answer[:200].decode("latin-1")]
        except Exception as exc:
            return ["error", type(exc).__name__, str(exc)]

    out = []
    if scenario == "reset_mid_body":
        out.append(await post(body=b"x" * (32 << 20)))
    elif scenario == "halfclose_early_answer":
        out.append(await post(body=b"x" * (8 << 20)))
    elif scenario == "reset_idle_then_post":
        out.append(await post())
        await gate.wait()
        await asyncio.sleep(0.05)
        out.append(await post())
    elif scenario == "fin_idle_then_post":
        out.append(await post())
        await gate.wait()
        await asyncio.sleep(0.05)
        out.append(await post())
    elif scenario == "stall_write":  # the peer never reads the body: the deadline
        out.append(await post(body=b"x" * (32 << 20), timeout=0.5))
    elif scenario == "stall_answer":  # it reads it all and never answers
        out.append(await post(timeout=0.5))
    elif scenario == "pool_timeout":  # one connection, held by a stalled post
        small = DirectPool(None, max_connections=1, keepalive_expiry=30.0)
        pool = small

        async def one(i):
            try:
                await small.post(url, HEAD, b"{}", timeout=0.3 + 0.3 * i, connect_timeout=2.0,
                                 max_bytes=1 << 20, too_large=lambda: TooLarge("too large"))
                return ["ok"]
            except Exception as exc:
                return ["error", type(exc).__name__, str(exc)]

        first = asyncio.ensure_future(one(1))
        await asyncio.sleep(0)
        out.append(await one(0))
        out.append(await first)
    elif scenario in ("close_on_accept", "rst_on_accept"):
        for _ in range(20):
            out.append(await post())
    elif scenario == "concurrent":
        got = await asyncio.gather(*(post(body=b'{"i":%d}' % i) for i in range(60)))
        out.append(sorted(json.dumps(g) for g in got))
    elif scenario.startswith("big_"):
        out.append(await post(max_bytes=64 << 20))
        out.append(await post(max_bytes=1 << 20))
        out.append(await post(max_bytes=64 << 20, error_bytes=1 << 20))
    elif scenario.startswith("stale_race"):
        for _ in range(4):
            out.append(await post())
    else:
        out.append(await post())
        out.append(await post())
    out.append(["idle", len(pool._idle)])
    await pool.aclose()
    server.close()
    out.append(seen)
    return out


async def serve(scenario, reader, writer, seen, gate):
    if scenario == "reset_mid_body":
        await read_request(reader)
        await reader.readexactly(1 << 20)
        rst(writer)
        return
    if scenario == "close_on_accept":
        writer.close()
        return
    if scenario == "rst_on_accept":
        rst(writer)
        return
    if scenario in ("stall_write", "stall_answer", "pool_timeout"):
        head, length = await read_request(reader)
        if scenario != "stall_write":
            await reader.readexactly(length)
        await asyncio.sleep(5)
        return
    if scenario == "halfclose_early_answer":
        head, length = await read_request(reader)
        writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 5\r\nConnection: close\r\n\r\nlarge")
        await writer.drain()
        writer.write_eof()
        left = length
        while left > 0:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                break
            left -= len(data)
        writer.close()
        return
    while True:
        try:
            head, length = await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        body = await reader.readexactly(length)
        seen["requests"] += 1
        n = seen["requests"]
        if scenario in ("stale_race_fin", "stale_race_rst"):
            # A kept connection's second request read and not answered: closed (or reset)
            # as a server closing an idle connection does when the request crosses it.
            if n == 2:
                if scenario == "stale_race_rst":
                    rst(writer)
                else:
                    writer.close()
                return
            writer.write(ok(b'{"n":%d}' % n))
            await writer.drain()
            continue
        if scenario in ("reset_idle_then_post", "fin_idle_then_post"):
            writer.write(ok())
            await writer.drain()
            if n == 1:
                if scenario == "reset_idle_then_post":
                    rst(writer)
                else:
                    writer.close()
                gate.set()
                return
            continue
        answer = ANSWERS[scenario](body)
        if isinstance(answer, list):
            for piece in answer:
                if piece == "sleep":
                    await asyncio.sleep(0.05)
                elif piece == "rst":
                    rst(writer)
                    return
                elif piece == "close":
                    writer.close()
                    return
                else:
                    writer.write(piece)
                    await writer.drain()
        else:
            writer.write(answer)
            await writer.drain()


BIG = b"y" * (3 << 20)
ANSWERS = {
    "textbook": lambda body: ok(body),
    "concurrent": lambda body: ok(body),
    "chunked": lambda body: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "to_close": lambda body: [b"HTTP/1.1 200 OK\r\n\r\nuntil-close", "close"],
    "http10": lambda body: [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", "close"],
    "extra_after": lambda body: ok(b"{}", ) + b"garbage",
    "short_body_close": lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", "close"],
    "short_body_rst": lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", "sleep", "rst"],
    "garbage": lambda body: [b"NOT HTTP AT ALL\r\n\r\n", "close"],
    "bare_lf": lambda body: b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
    "huge_head": lambda body: [b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 70000 + b"\r\nContent-Length: 2\r\n\r\nhi", "close"],
    "head_20k": lambda body: b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 20000 + b"\r\nContent-Length: 2\r\n\r\nhi",
    "continue_1xx": lambda body: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}"),
    "gzip": lambda body: ok(b"{}", b"Content-Encoding: gzip\r\n"),
    "conn_close": lambda body: [ok(b"{}", b"Connection: close\r\n"), "close"],
    "error_big": lambda body: b"HTTP/1.1 500 Oops\r\nContent-Length: 200000\r\n\r\n" + b"e" * 200000,
    "error_chunked": lambda body: b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"4000\r\n" + b"e" * 0x4000 + b"\r\n") * 4 + b"0\r\n\r\n",
    "trickle_head": lambda body: [b"HTTP/1.1 200 OK\r\n", "sleep", b"Content-Length: 2\r\n", "sleep", b"\r\nh", "sleep", b"i"],
    "big_textbook": lambda body: ok(BIG),
    "big_chunked": lambda body: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(BIG) + BIG + b"\r\n0\r\n\r\n",
    "big_error": lambda body: b"HTTP/1.1 502 Bad\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG,
    "dup_length": lambda body: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
    "bad_length": lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nhi", "close"],
    "no_reason": lambda body: b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nhi",
    "reset_at_once": lambda body: ["rst"],
    "close_at_once": lambda body: ["close"],
    "slow": lambda body: ["sleep", "sleep", ok(b"{}")],
}

async def main(scenarios):
    got = {}
    for scenario in scenarios:
        got[scenario] = await one(scenario)
    print(json.dumps({"mesh": mesh.__file__, "got": got}))


if os.environ.get("S34_UVLOOP"):
    import uvloop
    uvloop.run(main(sys.argv[1:]))
else:
    asyncio.run(main(sys.argv[1:]))
"""

# Answers that read alike (each scenario two posts on one pool, unless said).
HELD = [
    "textbook",  # kept alive, reused
    "chunked",
    "reset_idle_then_post",  # a kept connection reset while idle: a fresh one
    "fin_idle_then_post",  # ... closed while idle
    "concurrent",  # 60 posts in flight over 4 connections
    "to_close",  # read to its close
    "http10",
    "extra_after",  # bytes past the answer: not kept
    "short_body_close",  # a Content-Length the peer does not keep, then FIN
    "short_body_rst",  # ... then RST
    "garbage",
    "bare_lf",
    "head_20k",  # a head past h11's 16 KiB in one read of under 64 KiB: read
    "continue_1xx",
    "gzip",
    "conn_close",
    "error_big",  # an error's body cut at error_bytes
    "error_chunked",
    "trickle_head",  # the head in pieces
    "big_textbook",  # 3 MiB, then too large, then as an error's
    "big_chunked",
    "big_error",
    "dup_length",
    "bad_length",
    "no_reason",
    "reset_at_once",  # RST before any byte of the answer
    "close_at_once",
    "slow",
    "stall_write",  # deadlines: a body never read, an answer never sent, no free connection
    "stall_answer",
    "pool_timeout",
    "stale_race_fin",  # a kept connection closed under the next request: sent again
    "stale_race_rst",
    "close_on_accept",  # 20 posts each to a peer that closes / resets every connection at once
    "rst_on_accept",
]


@pytest.mark.integration
def test_pool_answers_and_failures_are_the_trees_before(trees: Trees) -> None:
    """Holds (506702b): every scenario of ``HELD`` returns, raises, keeps and reconnects as
    19420e3's pool did."""
    now, before = _both(trees, _POOL_DRIVER, *HELD)
    assert now == before


@pytest.mark.integration
@pytest.mark.parametrize("tls", ["", "1"])
def test_pool_answers_and_failures_on_uvloop_are_the_trees_before(trees: Trees, tls: str) -> None:
    """Holds (506702b): ``HELD`` on uvloop's loop (``mesh serve``'s), plain and TLS, and
    there the early answer then a half-close too (uvloop's transport reads it as before)."""
    uv = {"S34_UVLOOP": "1", "S34_TLS": tls}
    fixed = ("reset_mid_body", "huge_head")  # broken there too by 506702b, fixed by 70bdaef
    now, before = _both(trees, _POOL_DRIVER, *HELD, "halfclose_early_answer", *fixed, env=uv)
    assert now["got"]["halfclose_early_answer"][0] == ["ok", 413, 5, "large"]
    assert now == before


@pytest.mark.integration
def test_pool_answers_and_failures_over_tls_are_the_trees_before(trees: Trees) -> None:
    """Holds (506702b): ``HELD`` over TLS (a trustme CA the driver trusts), and there the
    reset under a waiting write (a ReadError in both trees: the TLS transport reads the
    reset first) and the early answer then a half-close."""
    tls = {"S34_TLS": "1"}
    now, before = _both(
        trees, _POOL_DRIVER, *HELD, "reset_mid_body", "halfclose_early_answer", env=tls
    )
    assert now["got"]["textbook"][2] == ["idle", 1]
    assert now == before


@pytest.mark.integration
def test_a_reset_under_a_waiting_write_says_what_reset_it(trees: Trees) -> None:
    """A connection reset under a write waiting for room (a 32 MiB body, the peer resets
    after 1 MiB): WriteError('[Errno 104] Connection reset by peer'), as StreamWriter.drain
    raised connection_lost's exception. Broken by 506702b (WriteError('Connection lost'):
    A2APeer's RemoteError said 'the connection to ... failed: Connection lost'), fixed by
    70bdaef."""
    now, before = _both(trees, _POOL_DRIVER, "reset_mid_body")
    assert before["got"]["reset_mid_body"][0] == [
        "error",
        "WriteError",
        "[Errno 104] Connection reset by peer",
    ]
    assert now == before


@pytest.mark.integration
def test_an_early_answer_then_a_half_close_is_read(trees: Trees) -> None:
    """A peer that answers early (413, Connection: close) and half-closes (write_eof) while
    it drains an 8 MiB body: the 413 is read (StreamReaderProtocol keeps a half-closed TCP
    transport open). Broken by 506702b on asyncio's own loop (uvloop and TLS held):
    _Connection.eof_received returned False, the transport closed itself once its buffer was
    sent, the post failed with WriteError and its abort() of the closed transport raised
    AttributeError ('NoneType' object has no attribute 'call_soon'), not an httpx error;
    fixed by 70bdaef."""
    now, before = _both(trees, _POOL_DRIVER, "halfclose_early_answer")
    assert before["got"]["halfclose_early_answer"][0] == ["ok", 413, 5, "large"]
    assert now == before


@pytest.mark.integration
@pytest.mark.parametrize("tls", ["", "1"])
def test_a_head_past_h11s_limit_is_refused(trees: Trees, tls: str) -> None:
    """An answer whose head is 70 KB (past h11's 16 KiB limit) arriving in one piece, plain
    or over TLS: RemoteProtocolError('Receive buffer too long'), as 19420e3 (64 KiB a read:
    no blank line within _MAX_HEAD, h11 refused it). Broken by 506702b (_Connection.read
    returned all that was buffered: the head read as a textbook answer, 200 'hi'), fixed by
    70bdaef (at most 64 KiB a read)."""
    now, before = _both(trees, _POOL_DRIVER, "huge_head", env={"S34_TLS": tls})
    assert before["got"]["huge_head"][0] == [
        "error",
        "RemoteProtocolError",
        "Receive buffer too long",
    ]
    assert now == before


# --- bcbfdf2 / 1ef875b: typed requests' values handed from the gate's parse; held WORKING -----
#
# Typed skills whose answers show what their input model got (each value's type and repr,
# an object's members sorted: a nested object comes from a Struct, whose order is the
# process's in either tree), sent as raw JSON text (duplicate keys, big ints, -0.0, 1e400,
# lone surrogates, 50 nested lists, a 100 KB string, members out of order) under metadata of
# many shapes (caller a number, a list, duplicated; deadline past, huge, text), on JSON-RPC
# and as a text object on REST; every fifth again (its message key); each task by GetTask
# under history lengths; then a new node on the same database reads them all back. A skill
# that awaits (its run released: the held WORKING message published as an event) and one
# that fails.

_TYPED_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sqlite3, sys, tempfile
from pathlib import Path
from typing import Any, Literal, Optional

import httpx
from pydantic import BaseModel, Field, field_validator

import mesh
from mesh import Agent, skill, SkillContext
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def canon(status, text):
    return [status, parsed(scrub(text))]


class Out(BaseModel):
    view: str


def shown(v):
    # A dict's members sorted: a nested object comes from a Struct, whose order is the
    # process's (the hash seed of its map), in either tree.
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {shown(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(shown(x) for x in v) + "]"
    return f"{type(v).__name__}:{v!r}"


def view(req, ctx=None):
    d = {k: shown(v) for k, v in req.__dict__.items()}
    if ctx is not None:
        d["_caller"] = repr(getattr(ctx, "caller", None))
    return Out(view=json.dumps(d, sort_keys=True))


class Anys(BaseModel):
    a: Any = None
    b: Any = None
    c: Any = None


class Nums(BaseModel):
    i: int = 0
    f: float = 0.0
    u: int | float = 0
    s: str = ""
    o: Optional[int] = None
    l: list[Any] = []


class Strict(BaseModel):
    model_config = {"strict": True}
    i: int = 0
    f: float = 0.0
    s: str = ""
    b: bool = False


class Checked(BaseModel):
    x: Any = None

    @field_validator("x")
    @classmethod
    def seen(cls, v):
        if isinstance(v, float) and v.is_integer() and str(v) == "3.0":
            raise ValueError("three as a float")
        return v


class Lit(BaseModel):
    k: Literal[1, "a", True] = "a"
    g: int = Field(default=0, gt=-5)


@skill
def anys(req: Anys) -> Out:
    """Anything."""
    return view(req)


@skill
def nums(req: Nums) -> Out:
    """Numbers."""
    return view(req)


@skill
def strict(req: Strict) -> Out:
    """Strict."""
    return view(req)


@skill
def checked(req: Checked) -> Out:
    """Checked."""
    return view(req)


@skill
def lit(req: Lit) -> Out:
    """Literal."""
    return view(req)


@skill
async def meta(req: Anys, ctx: SkillContext) -> Out:
    """Its context."""
    seen = {k: repr(getattr(ctx, k, None)) for k in ("caller", "deadline", "traceparent", "task_id") if k != "task_id"}
    return Out(view=json.dumps(seen, sort_keys=True) + json.dumps(view(req).view))


@skill
async def awaits(req: Nums) -> Out:
    """Awaits: its run released (its events published)."""
    await asyncio.sleep(0.001)
    return view(req)


@skill
def fails(req: Nums) -> Out:
    """Fails on an odd i."""
    if req.i % 2:
        raise ValueError(f"odd {req.i}")
    return view(req)


agent = Agent(name="s34-typed", description="Typed.", skills=[anys, nums, strict, checked, lit, meta, awaits, fails])

DATA = [
    '{"a": 1, "b": 1.0, "c": -0.0}',
    '{"a": 9007199254740993, "b": 18446744073709551616, "c": 1e308}',
    '{"a": 1e400}',
    '{"a": -1e400}',
    '{"a": 123456789012345678901234567890}',
    '{"a": 0.1, "b": 5e-324, "c": 2.5e-320}',
    '{"a": "\\u00e9\\ud83d\\ude42\\u2028\\u0000", "b": "", "c": "\\ud800"}',
    '{"a": 1, "a": "dup", "b": {"x": 1, "x": 2}}',
    '{"a": [1, 2.0, -0.0, [3], {"z": 1, "y": 2}], "b": {}}',
    '{"a": [], "b": null, "c": true}',
    '{}',
    '{"a": {"n": {"m": [1, {"k": 1.5}]}}}',
    '{"c": 3, "b": 2, "a": 1}',
    '{"a": 1E2, "b": 1e-0, "c": 100000000000000000000000}',
    '{"zzz": 1, "a": 2}',
    '{"a": 1.7976931348623157e308, "b": -1.7976931348623157e308}',
    '{"a": 4.9e-324}',
    '{"a": ' + '[' * 50 + ']' * 50 + '}',
    '{"a": "' + 'x' * 100000 + '"}',
    '{"i": 3, "f": 3, "u": 3, "s": "3", "o": null, "l": [1, 1.5]}',
    '{"i": 3.0, "f": 3.5, "u": 3.0, "s": 3, "o": 2.0}',
    '{"i": 3.5}',
    '{"i": 9007199254740993, "f": 9007199254740993}',
    '{"i": 1e20, "u": 1e20}',
    '{"i": -0.0, "u": -0.0, "f": -0}',
    '{"i": true, "f": false, "s": null}',
    '{"i": "7", "f": "7.5", "u": "7"}',
    '{"o": 1.5}',
    '{"l": 5}',
    '{"s": "x", "extra": 1, "extra2": {"a": 1}}',
    '{"i": 1, "f": 1.0, "s": "s", "b": true}',
    '{"i": 1.0}',
    '{"f": 1}',
    '{"b": 1}',
    '{"x": 3}',
    '{"x": 3.0}',
    '{"x": 3.5}',
    '{"k": 1}',
    '{"k": 1.0}',
    '{"k": true}',
    '{"k": "a", "g": -4.0}',
    '{"k": 2}',
    '{"g": -5}',
    '{"g": -5.0}',
]

SKILLS_FOR = {"anys": range(0, 19), "nums": range(19, 30), "strict": range(30, 34),
              "checked": range(34, 37), "lit": range(37, 44), "meta": range(0, 3),
              "awaits": range(19, 30), "fails": range(19, 30)}

METAS = [
    '{"skill": "%s"}',
    '{"skill": "%s", "caller": 5}',
    '{"skill": "%s", "caller": 5.5, "deadline": 4102444800}',
    '{"skill": "%s", "caller": "c\\u00e9", "deadline": 4102444800.25, "traceparent": "00-' + 'ab' * 16 + '-' + 'cd' * 8 + '-01"}',
    '{"skill": "%s", "deadline": 1e400}',
    '{"skill": "%s", "deadline": "soon"}',
    '{"skill": "%s", "caller": true, "x": {"b": 1, "a": [1, {"c": null}]}}',
    '{"caller": "first", "skill": "%s", "caller": "second"}',
    '{"skill": "%s", "deadline": 1}',
    '{"skill": "%s", "caller": 1e20}',
    '{"skill": "%s", "caller": -0.0}',
    '{"skill": "%s", "caller": [1, 2]}',
    '{"skill": "%s", "caller": {}}',
    '{"skill": "%s", "caller": 0}',
]


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    answers = []
    tasks = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        n = 0
        for skill_id, cases in SKILLS_FOR.items():
            metas = METAS if skill_id == "meta" else METAS[:2]
            for case in cases:
                for m in metas:
                    n += 1
                    meta_text = m % skill_id
                    body = ('{"jsonrpc": "2.0", "id": %d, "method": "SendMessage", "params": {"message": '
                            '{"role": "ROLE_USER", "messageId": "m%d", "parts": [{"data": %s, "mediaType": "application/json"}], '
                            '"metadata": %s}}}' % (n, n, DATA[case], meta_text))
                    r = await http.post("/", content=body.encode("utf-8", "surrogatepass"), headers=H)
                    answers.append([skill_id, case, canon(r.status_code, r.text)])
                    task = (r.json().get("result") or {}).get("task") if r.status_code == 200 else None
                    if task:
                        tasks.append(task["id"])
                    if n % 5 == 0:  # the same message again: its task
                        r = await http.post("/", content=body.encode("utf-8", "surrogatepass"), headers=H)
                        answers.append([skill_id, case, "again", canon(r.status_code, r.text)])
                    # the same as REST and as text
                    rest = ('{"message": {"role": "ROLE_USER", "messageId": "r%d", "parts": [{"text": %s}], "metadata": %s}}'
                            % (n, json.dumps(DATA[case]), meta_text))
                    r = await http.post("/a2a/rest/message:send", content=rest.encode("utf-8", "surrogatepass"), headers=H)
                    answers.append([skill_id, case, "text", canon(r.status_code, r.text)])
        for i, tid in enumerate(tasks):
            hl = (None, 0, 1, 3)[i % 4]
            params = {"id": tid, **({} if hl is None else {"historyLength": hl})}
            r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": params}, headers=H)
            answers.append(["get", hl, canon(r.status_code, r.text)])
    # A new node on the same database: the stored tasks read back, a duplicate answered.
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        for tid in tasks:
            r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid}}, headers=H)
            answers.append(["restart", canon(r.status_code, r.text)])
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "role": "ROLE_USER", "messageId": "m5", "parts": [{"data": {}}], "metadata": {"skill": "anys"}}}}
        r = await http.post("/", json=body, headers=H)
        answers.append(["restart-again", canon(r.status_code, r.text)])
    conn = sqlite3.connect(tmp / "node.db")
    states = sorted(int(s) for (s,) in conn.execute("select state from a2a_tasks"))
    # Each row's columns against its task's bytes, read here by the rules of 19420e3's _row:
    # the state, the status time in ns, the trace id of the metadata's traceparent, else the
    # request's; the fixed traceparent of the metadata cases kept as is.
    from a2a.types import Task

    def trace_of(struct):
        value = struct.fields.get("traceparent")
        if value is None or not value.HasField("string_value"):
            return None
        parts = value.string_value.split("-")
        return parts[1] if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32 else None

    rows = []
    for owner, tid, ctx, state, at, data, trace, created in conn.execute(
        "select owner, id, context_id, state, updated_at, data, trace_id, created_at from a2a_tasks"
    ):
        task = Task.FromString(data)
        want = trace_of(task.metadata) or (trace_of(task.history[0].metadata) if task.history else None)
        rows.append([owner, tid == task.id, ctx == task.context_id, state == int(task.status.state),
                     at == task.status.timestamp.ToNanoseconds(), trace == want,
                     trace if trace == "ab" * 16 else (trace is not None), state])
    rows.sort(key=json.dumps)
    print(json.dumps({"mesh": mesh.__file__, "answers": answers, "states": states, "rows": rows}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_typed_requests_of_odd_values_are_answered_and_stored_as_the_tree_before(
    trees: Trees,
) -> None:
    """Holds (bcbfdf2, 1ef875b): 683 answers, GetTask and restart reads equal 19420e3's."""
    now, before = _both(trees, _TYPED_DRIVER)
    assert len(now["answers"]) > 600
    assert now == before


# --- 506702b, 6646e05, 79c10a4: remote() end to end -------------------------------------------
#
# A coordinator's ``remote()`` toolset (bound as a node binds it: guarded client, PeerTrust,
# metrics) calls a real node's typed skills (answers, a skill that fails, arguments refused
# locally, attachments, a direct message answer), then fake peers serving the node's card
# and answering SendMessage their way (garbage, not JSON-RPC, JSON-RPC errors, no result,
# wrong content type, chunked, cut or reset mid-body, reset or closed at once, 500/503/403/404,
# 40 MB, slow past the deadline, gzip, a 70 KB head, a reset under a 32 MiB request): each
# call's answer or error (type, message, reason), the counters and gauges of the caller's
# metrics, and the caller's log lines (sorted; durations, ids and ports replaced).

_REMOTE_DRIVER = (
    prelude(SPAN_IDS, traces=False)
    + r'''
import asyncio, json, logging, re, socket, struct, sys, tempfile, time
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

import mesh
from mesh import Agent, File, SkillContext, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from mesh._metrics import NodeMetrics
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._remote import remote
from mesh._tools import ToolContext
from mesh._trust import PeerTrust
from mesh._discovery.base import Instance
from mesh._discovery.client import DiscoveryClient
from tests.support import free_port, uvicorn_serving

PORTS = re.compile(r"127\.0\.0\.1:\d+")
FLOATS = re.compile(r"\d+\.\d+ ?(ms|s)\b|duration_ms=[\d.]+|/tmp/[\w/.-]+")
# A request's own deadline (now + 30 s), its length (the deadline's digits) and JSON-RPC id.
REQUEST_VARIES = re.compile(r'"deadline":[\d.e+-]+|Content-Length: \d+|"id":\d+')


def canon(text):
    text = REQUEST_VARIES.sub("<varies>", text)
    return FLOATS.sub("<dur>", PORTS.sub("<host>", scrub(text)))


class ScoreIn(BaseModel):
    applicant_id: str
    amount: float


class ScoreOut(BaseModel):
    applicant_id: str
    score: int
    ratio: float
    tags: list[str]
    note: str | None = None


@skill
def score(req: ScoreIn) -> ScoreOut:
    """Score."""
    if req.applicant_id == "boom":
        raise ValueError("the bureau is down")
    return ScoreOut(applicant_id=req.applicant_id, score=int(req.amount) % 1000, ratio=req.amount / 3,
                    tags=["a", "\u00e9\U0001f642"], note=None if req.amount > 5 else "small")


@skill
async def files(req: ScoreIn, ctx: SkillContext) -> ScoreOut:
    """With attachments."""
    ctx.attach(File(b"\x89PNG" * 3, media_type="image/png", name="c.png"))
    ctx.attach({"rate": 1.5, "k": [1, None]}, "the rate", name="rate")
    return ScoreOut(applicant_id=req.applicant_id, score=1, ratio=0.5, tags=[])


@skill(reply="message")
def direct(req: ScoreIn) -> ScoreOut:
    """A direct answer."""
    return ScoreOut(applicant_id=req.applicant_id, score=2, ratio=-0.0, tags=["x"])


agent = Agent(name="s34-bureau", description="Scores.", skills=[score, files, direct])


def rst(writer):
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def ok(body, ctype=b"application/json", extra=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (ctype, len(body), extra, body)


def task_answer(rid):
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"task": {
        "id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_COMPLETED"},
        "artifacts": [{"artifactId": "a", "parts": [{"data": {"applicant_id": "x", "score": 1, "ratio": 1.0, "tags": []}}]}]}}}).encode()


HOSTILE = {
    "garbage": lambda rid: [ok(b"<html>nope</html>", b"text/html")],
    "not_rpc": lambda rid: [ok(b'{"hello": 1}')],
    "rpc_error": lambda rid: [ok(json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "inner"}}).encode())],
    "invalid_params": lambda rid: [ok(json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad field x"}}).encode())],
    "no_result": lambda rid: [ok(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}).encode())],
    "good": lambda rid: [ok(task_answer(rid))],
    "wrong_type": lambda rid: [ok(task_answer(rid), b"text/plain")],
    "chunked": lambda rid: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(task_answer(rid)), task_answer(rid))],
    "cut_mid_body": lambda rid: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" + task_answer(rid)[:40], "close"],
    "rst_mid_body": lambda rid: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" + task_answer(rid)[:40], "rst"],
    "rst_at_once": lambda rid: ["rst"],
    "close_at_once": lambda rid: ["close"],
    "s500": lambda rid: [b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\noops!"],
    "s503": lambda rid: [b"HTTP/1.1 503 Unavailable\r\nContent-Length: 4\r\n\r\nbusy"],
    "s403": lambda rid: [b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n" + b'{"error": {"message": "not you, sorry"}}'],
    "s404": lambda rid: [b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"],
    "huge": lambda rid: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40000000\r\n\r\n", "close"],
    "slow": lambda rid: ["sleep"],
    "gzip": lambda rid: [ok(task_answer(rid), extra=b"Content-Encoding: gzip\r\n")],
    "rst_mid_request": None,
    "huge_head": lambda rid: [b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 70000 + b"\r\n" + ok(task_answer(rid)).split(b"\r\n", 1)[1]],
}


async def fake_peer(box, mode, counts):
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if mode == "rst_mid_request" and head.startswith(b"POST"):
                    counts["posts"] = counts.get("posts", 0) + 1
                    await reader.readexactly(1 << 20)
                    rst(writer)
                    return
                body = await reader.readexactly(length)
                if head.startswith(b"GET"):
                    writer.write(ok(box["card"]))
                    await writer.drain()
                    continue
                counts["posts"] = counts.get("posts", 0) + 1
                # What the caller sent: its headers (by name, sorted) and body, ids replaced.
                lines = sorted(canon(line.decode("latin-1")) for line in head.split(b"\r\n")[1:] if line)
                counts.setdefault("requests", []).append([lines, canon(body.decode())])
                rid = json.loads(body).get("id")
                for piece in HOSTILE[mode](rid):
                    if piece == "rst":
                        rst(writer)
                        return
                    if piece == "close":
                        writer.close()
                        return
                    if piece == "sleep":
                        await asyncio.sleep(3)
                        return
                    writer.write(piece)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    return await asyncio.start_server(handle, "127.0.0.1", 0)


LOGS = None


class StaticBackend:
    """Discovery of fixed instances (their order as given)."""

    url = "http://registry.test"

    def __init__(self, urls):
        self.instances = [Instance(f"i-{n}", "s34-bureau", u, skills=("score",)) for n, u in enumerate(urls)]

    async def register(self, registration): ...

    async def heartbeat(self, instance_id): ...

    async def deregister(self, instance_id): ...

    async def find(self, *, agent=None, skill=None, passing_only=True):
        return list(self.instances)

    async def aclose(self): ...


async def call_tool(url, skill_id, args, deadline_s=2.0, gather=False, replicas=None):
    LOGS.lines = []
    anywhere = NetworkPolicy.parse("any")
    http = create_http_client(anywhere, timeout=httpx.Timeout(35.0, connect=2.0))
    registry = CollectorRegistry()
    if replicas is None:
        toolset = remote("s34-bureau", skill=skill_id, url=url, deadline_s=deadline_s)
        discovery = None
    else:  # by name: discovery names the replicas, in this order
        toolset = remote("s34-bureau", skill=skill_id, deadline_s=deadline_s)
        discovery = DiscoveryClient(StaticBackend(replicas))
    toolset.bind(http=http, metrics=NodeMetrics(registry, "s34-coordinator"), caller="s34-coordinator",
                 trust=PeerTrust(networks=anywhere), **({"discovery": discovery} if discovery else {}))
    out = []
    if gather:
        try:
            ctxs = [ToolContext(agent_name="s34-coordinator", user_id="a2a", session_id=f"s-{i}", invocation_id=f"i-{i}",
                                metadata={"deadline": time.time() + 30, "usage_sink": [], "task_id": f"t-{i}"})
                    for i in range(len(args))]
            (tool,) = await toolset.tools(ctxs[0])
            got = await asyncio.gather(*(tool.call(a, c) for a, c in zip(args, ctxs)), return_exceptions=True)
            out = sorted(canon(json.dumps(g, sort_keys=True, default=repr)) for g in got)
        finally:
            await toolset.aclose()
            await http.aclose()
        return out, len(LOGS.lines)
    try:
        for i, a in enumerate(args):
            # The client's own headers changed between calls: each call sends the current ones.
            if i % 2:
                http.headers.pop("x-s34", None)
            else:
                http.headers["X-S34"] = f"v{i}"
            ctx = ToolContext(agent_name="s34-coordinator", user_id="a2a", session_id=f"s-{i}", invocation_id=f"i-{i}",
                              metadata={"deadline": time.time() + 30, "traceparent": "00-" + "12" * 16 + "-" + "34" * 8 + "-01",
                                        "usage_sink": [], "durable_children": True, "task_id": f"t-{i}"})
            try:
                (tool,) = await toolset.tools(ctx)
                got = await tool.call(a, ctx)
                out.append(["ok", canon(json.dumps(got, sort_keys=True, default=repr))])
            except Exception as exc:
                out.append(["error", type(exc).__name__, canon(str(exc)),
                            canon(json.dumps({k: getattr(exc, k, None) for k in ("reason", "peer", "skill", "detail")}, default=repr))])
    finally:
        await toolset.aclose()
        await http.aclose()
    metrics = []
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(("#", "process_", "python_")) or "_bucket" in line or "_sum" in line or "_created" in line:
            continue
        metrics.append(canon(line))
    return out, sorted(metrics), sorted(LOGS.lines)


async def main():
    global LOGS
    logs = LOGS = Logs()
    logging.getLogger().addHandler(logs)
    logging.getLogger().setLevel(logging.DEBUG)
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    url = f"http://127.0.0.1:{port}"
    result = {"mesh": mesh.__file__}
    async with uvicorn_serving(node.app, port, log_level="warning"):
        async with httpx.AsyncClient(trust_env=False) as http:
            card = (await http.get(url + "/.well-known/agent-card.json")).text
        good = [{"applicant_id": "a-1", "amount": 25000}, {"applicant_id": "a-2", "amount": 1.5},
                {"applicant_id": "boom", "amount": 1}, {"applicant_id": "a-3"}, {"applicant_id": 5, "amount": "x"},
                {"applicant_id": "\u00e9" * 10, "amount": 2**60}, {"applicant_id": "a-4", "amount": -0.0}]
        for skill_id in ("score", "files", "direct"):
            result[skill_id] = await call_tool(url, skill_id, good if skill_id == "score" else good[:2])
        failovers = [a for a in sys.argv[1:] if a.startswith("failover:")]
        for spec in failovers:  # while the node serves: it is the good replica
            result[spec] = await failover(card, url, spec.split(":", 1)[1])
        if len(sys.argv) != 2 and not failovers:  # not for a single hostile mode
            # 40 calls in flight over one toolset's pool; a 3 MB answer.
            result["concurrent"] = await call_tool(url, "score", [{"applicant_id": f"c-{i}", "amount": i} for i in range(40)], gather=True)
            result["big"] = await call_tool(url, "score", [{"applicant_id": "q" * (3 << 20), "amount": 7}], deadline_s=20.0)
    for mode in [a for a in sys.argv[1:] if not a.startswith("failover:")] or ([] if len(sys.argv) > 1 else HOSTILE):
        result["hostile-" + mode] = await hostile(card, url, mode)
    print(json.dumps(result))


async def failover(card, url, mode):
    """The real node and a replica answering ``mode`` (or a port nobody listens on), both
    orders: four calls each."""
    counts = {}
    box = {}
    if mode == "refused":
        bad_url, server = f"http://127.0.0.1:{free_port()}", None
    else:
        server = await fake_peer(box, mode, counts)
        bad_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        box["card"] = card.replace(url, bad_url).encode()
    got = []
    try:
        for replicas in ([bad_url, url], [url, bad_url]):
            args = [{"applicant_id": f"f-{i}", "amount": i} for i in range(4)]
            result = await call_tool(url, "score", args, deadline_s=3.0, replicas=replicas)
            got.append([canon(json.dumps(result, default=repr).replace(bad_url, "<bad>"))])
    finally:
        if server is not None:
            server.close()
    return [got, counts.get("posts", 0)]


async def hostile(card, url, mode):
    counts = {}
    box = {}
    server = await fake_peer(box, mode, counts)
    port = server.sockets[0].getsockname()[1]
    box["card"] = card.replace(url, f"http://127.0.0.1:{port}").encode()
    try:
        big = "x" * (32 << 20) if mode == "rst_mid_request" else ""
        out = await call_tool(f"http://127.0.0.1:{port}", "score",
                              [{"applicant_id": "a-1" + big, "amount": 1}, {"applicant_id": "a-2", "amount": 2}],
                              deadline_s=1.0 if not big else 10.0)
    finally:
        server.close()
    return [out, counts]


asyncio.run(main())
'''
)

_REMOTE_HELD = [
    "garbage",
    "not_rpc",
    "rpc_error",
    "invalid_params",
    "no_result",
    "good",
    "wrong_type",
    "chunked",
    "cut_mid_body",
    "rst_mid_body",
    "rst_at_once",
    "close_at_once",
    "s500",
    "s503",
    "s403",
    "s404",
    "huge",
    "slow",
    "gzip",
]


@pytest.mark.integration
def test_remote_calls_answers_errors_metrics_and_logs_are_the_trees_before(trees: Trees) -> None:
    """Holds (506702b, 6646e05, 79c10a4): every answer, error, retry count, breaker state and
    log line as 19420e3's."""
    now, before = _both(trees, _REMOTE_DRIVER, *_REMOTE_HELD)
    assert now["score"][0][0][0] == "ok"
    assert now == before


@pytest.mark.integration
def test_remote_failover_between_replicas_is_the_tree_before(trees: Trees) -> None:
    """Holds (506702b, 79c10a4, 4357956): a replica that resets, is refused, answers 503 or
    garbage, or cuts its answer, beside the real node, in either order: answers, retries,
    breaker states, log lines as 19420e3's."""
    modes = ("rst_at_once", "refused", "s503", "garbage", "cut_mid_body", "rst_mid_body")
    now, before = _both(trees, _REMOTE_DRIVER, *(f"failover:{m}" for m in modes))
    assert "ok" in json.dumps(now["failover:rst_at_once"])
    assert now == before


@pytest.mark.integration
def test_remote_a_peers_oversized_head_is_refused(trees: Trees) -> None:
    """A peer answering SendMessage with a 70 KB head (one piece): RemoteError unavailable
    after 3 attempts, logged 'the connection to ... failed: Receive buffer too long',
    mesh_delegation_retries_total 6, the breaker open, as 19420e3. Broken by 506702b (the
    call answered ok, the breaker closed), fixed by 70bdaef. (Its first check indexed one
    level short of the call's list until this commit: the xfail held on that too.)"""
    now, before = _both(trees, _REMOTE_DRIVER, "huge_head")
    assert before["hostile-huge_head"][0][0][0][0] == "error"
    assert now == before


@pytest.mark.integration
def test_remote_a_reset_under_a_big_request_is_logged_as_before(trees: Trees) -> None:
    """A peer that resets the connection while a 32 MiB SendMessage waits for room: the
    retry's log line says '... failed: [Errno 104] Connection reset by peer', as 19420e3's.
    Broken by 506702b (it said 'Connection lost'; the same outcome, retries and metrics), fixed
    by 70bdaef."""
    now, before = _both(trees, _REMOTE_DRIVER, "rst_mid_request")
    assert "Connection reset by peer" in json.dumps(before["hostile-rst_mid_request"])
    assert now == before


# --- 55bacd8: the fast schema check's object step refusing a non-object itself ----------------
#
# 4000 seeded random (schema, value) pairs: object schemas (typed or not, properties, required,
# additionalProperties false / true / a schema, through $ref), nested arrays, enums, consts,
# anyOf, multiple types, numbers' bounds; values of every kind, integral floats among them.
# ``check``'s coerced copy (ints vs floats kept apart) or its violation (message and errors).

_SCHEMA_DRIVER = r"""
import json, random, sys
import mesh
from mesh._schema_check import check
from mesh._errors import SchemaViolation

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 34)


def scalar_schema(depth):
    kind = rng.choice(["string", "integer", "number", "boolean", "null", "any", "enum", "const", "anyOf", "multi", "array", "object"])
    if depth > 2 and kind in ("array", "object", "anyOf"):
        kind = "string"
    if kind == "string":
        s = {"type": "string"}
        if rng.random() < 0.3: s["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.2: s["maxLength"] = rng.randint(1, 5)
        if rng.random() < 0.2: s["pattern"] = rng.choice(["^a", "\\d+", "^[A-Z]-\\d$"])
        return s
    if kind in ("integer", "number"):
        s = {"type": kind}
        if rng.random() < 0.3: s["minimum"] = rng.choice([0, 1000, -5, 0.5])
        if rng.random() < 0.2: s["exclusiveMaximum"] = rng.choice([10, 1e6])
        if rng.random() < 0.1: s["multipleOf"] = rng.choice([0.1, 5, 2])
        return s
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "any":
        return rng.choice([{}, True])
    if kind == "enum":
        return {"enum": rng.sample(["a", 1, 1.0, None, True, "b", [1], {"k": 1}], 3)}
    if kind == "const":
        return {"const": rng.choice(["a", 1, 2.0, None, False, {"x": [1]}])}
    if kind == "multi":
        return {"type": rng.sample(["string", "integer", "null", "object", "array", "number"], 2)}
    if kind == "anyOf":
        return {"anyOf": [scalar_schema(depth + 1), {"type": "null"}]}
    if kind == "array":
        s = {"type": "array", "items": scalar_schema(depth + 1)}
        if rng.random() < 0.3: s["maxItems"] = rng.randint(0, 3)
        if rng.random() < 0.2: s["minItems"] = 1
        return s
    return object_schema(depth + 1)


def object_schema(depth=0):
    s = {}
    if rng.random() < 0.9:
        s["type"] = "object"
    names = rng.sample(["a", "b", "c", "amount", "id", "é", ""], rng.randint(0, 4))
    if names or rng.random() < 0.5:
        s["properties"] = {n: scalar_schema(depth + 1) for n in names}
    if names and rng.random() < 0.7:
        s["required"] = rng.sample(names, rng.randint(0, len(names)))
    if rng.random() < 0.4:
        s["additionalProperties"] = rng.choice([False, True, {"type": "integer"}])
    if rng.random() < 0.1:
        s["title"] = "T"
    return s


def value(depth=0):
    kind = rng.choice(["str", "int", "float", "intfloat", "bool", "none", "list", "dict", "dict", "dict"])
    if depth > 3 and kind in ("list", "dict"):
        kind = "int"
    if kind == "str": return rng.choice(["a", "", "A-1", "123", "é" * 6, "abc"])
    if kind == "int": return rng.choice([0, 1, -7, 1000, 5000, 2**60, 10])
    if kind == "float": return rng.choice([0.5, -0.0, 1e6, 3.3, 0.30000000000000004])
    if kind == "intfloat": return rng.choice([1.0, 1000.0, 2.0, 10.0])
    if kind == "bool": return rng.choice([True, False])
    if kind == "none": return None
    if kind == "list": return [value(depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "c", "amount", "id", "é", "", "zz"]): value(depth + 1) for _ in range(rng.randint(0, 4))}


out = []
for i in range(4000):
    schema = object_schema() if rng.random() < 0.8 else scalar_schema(0)
    if rng.random() < 0.1:
        schema = {"$defs": {"D": schema}, "$ref": "#/$defs/D", **({"type": "object"} if rng.random() < 0.5 else {})}
    v = value() if rng.random() < 0.5 else {k: value(1) for k in ((schema.get("properties") if isinstance(schema, dict) else None) or {"a": 0})}
    try:
        got = ["ok", json.dumps(check(v, schema), sort_keys=True)]
    except SchemaViolation as exc:
        got = ["violation", str(exc), json.dumps(getattr(exc, "errors", None), sort_keys=True, default=repr)]
    except Exception as exc:
        got = ["raised", type(exc).__name__, str(exc)[:300]]
    out.append(got)
print(json.dumps({"mesh": mesh.__file__, "out": out}))
"""


def test_schema_checks_of_random_pairs_are_the_trees_before(trees: Trees) -> None:
    """Holds (55bacd8): all 4000 results equal 19420e3's (same hash seed: see ``_env``)."""
    now, before = _both(trees, _SCHEMA_DRIVER)
    assert {kind for kind, *_ in now["out"]} == {"ok", "violation", "raised"}
    assert now == before


# --- c24f883: a delegation's metadata written by a C encoder made once ------------------------
#
# 3000 seeded ``send_message_body`` calls: metadata of every kind of value (NaN, infinities,
# -0.0, big ints, an IntEnum, a float subclass with its own repr, a str subclass, bytes, a
# tuple, a set, a lone surrogate, nested lists and objects, non-str keys), one that contains
# itself and one 3000 deep: the bytes, or the error.

_BODY_DRIVER = r"""
import enum, json, math, random, sys
from collections import OrderedDict
import mesh
from mesh._a2a.jsonrpc import send_message_body

rng = random.Random(34)


class Level(enum.IntEnum):
    HIGH = 3


class F(float):
    def __repr__(self):
        return "F!"


class S(str):
    pass


def val(d=0):
    k = rng.randrange(22)
    if d > 3 and k > 15:
        k = 0
    return [
        lambda: "t\u00e9\u2028\x00\"\\",
        lambda: rng.choice([0, -1, 2**64, 10**30]),
        lambda: rng.choice([0.1, -0.0, 1e308, 5e-324, 1e16, 123456789.123456789, 1.0]),
        lambda: rng.choice([True, False, None]),
        lambda: float("nan"),
        lambda: rng.choice([float("inf"), float("-inf")]),
        lambda: Level.HIGH,
        lambda: F(1.5),
        lambda: S("sub"),
        lambda: "",
        lambda: "\ud800",
        lambda: 4102444800.123456,
        lambda: "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
        lambda: b"bytes",
        lambda: (1, 2),
        lambda: {1, 2} if rng.random() < 0.2 else "x",
        lambda: [val(d + 1) for _ in range(rng.randrange(3))],
        lambda: {rng.choice(["a", "b", 1, 2.5, True, None, "\u00e9"]): val(d + 1) for _ in range(rng.randrange(3))},
        lambda: OrderedDict([("z", 1), ("a", 2)]),
        lambda: [[[]]],
        lambda: {},
        lambda: {"deep": [val(d + 1)]},
    ][k]()


def meta():
    m = {}
    for _ in range(rng.randrange(6)):
        m[rng.choice(["traceparent", "deadline", "caller", "x", "y", "skill", "\u00e9", "usage"])] = val()
    if rng.random() < 0.05:
        m[rng.choice([1, None, 2.5, True, ("t",)])] = 1
    return m


out = []
for i in range(3000):
    m = meta() if rng.random() < 0.95 else None
    if i % 500 == 7:
        m = {"self": None}
        m["self"] = m
    if i % 500 == 9:
        deep = x = {}
        for _ in range(3000):
            x["d"] = {}
            x = x["d"]
        m = deep
    payload = rng.choice([{"applicant_id": "a", "amount": 1.0}, "text \u00e9", {"n": [val()]}])
    try:
        body = send_message_body(payload, skill=rng.choice([None, "score", ""]), message_id=f"m{i}",
                                 context_id=rng.choice([None, "ctx"]), metadata=m, wait=rng.random() < 0.5,
                                 task_id=rng.choice([None, "t"]))
        got = ["ok", body.decode("utf-8", "backslashreplace")]
    except RecursionError:
        got = ["recursion"]
    except Exception as exc:
        got = ["raised", type(exc).__name__, str(exc)[:300]]
    out.append(got)
print(json.dumps({"mesh": mesh.__file__, "out": out}))
"""


def test_send_message_bodies_are_the_trees_before(trees: Trees) -> None:
    """Holds (c24f883): every body to the byte, every refusal (426 InvalidParamsError, 6
    RecursionError) as 19420e3's."""
    now, before = _both(trees, _BODY_DRIVER)
    assert len({kind for kind, *_ in now["out"]}) == 3
    assert now == before


# --- 1ef875b: a typed run released (its skill awaits): its held WORKING message published -----
#
# A typed skill waiting on a gate (opened by another skill's request, or never: canceled; or
# sent as a stream): while it runs, ListTasks, GetTask under history lengths, a subscription
# and a duplicate of its message; then its answer, the subscription's events, the duplicate's
# answer, GetTask, the message again; a new node on the same database: GetTask and the message
# again.

_HELD_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sqlite3, sys, tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
GATES = {}


class Gate(BaseModel):
    name: str
    n: float = 0


class Out(BaseModel):
    name: str
    n: float
    meta: dict = {}


def gate(name):
    return GATES.setdefault(name, asyncio.Event())


@skill
async def hold(req: Gate) -> Out:
    """Waits for its gate."""
    await gate(req.name).wait()
    return Out(name=req.name, n=req.n, meta={"b": 1, "a": [1.5, None]})


@skill
def open_gate(req: Gate) -> Out:
    """Opens a gate."""
    gate(req.name).set()
    return Out(name=req.name, n=-0.0)


agent = Agent(name="s34-held", description="Held.", skills=[hold, open_gate])


def msg(mid, ctx, skill, data, task=None):
    m = {"role": "ROLE_USER", "messageId": mid, "contextId": ctx, "parts": [{"data": data}],
         "metadata": {"skill": skill, "caller": "c"}}
    if task:
        m["taskId"] = task
    return m


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    out = {"mesh": mesh.__file__}
    res = []
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        async def rpc(method, params, stream=False):
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            if stream:
                r = await http.post("/", json=body, headers={**H, "Accept": "text/event-stream"})
                return [canon(l[5:]) for l in r.text.splitlines() if l.startswith("data:")]
            r = await http.post("/", json=body, headers=H)
            return canon(r.text)

        async def task_of(ctx):
            while True:
                listed = await rpc("ListTasks", {"contextId": ctx})
                tasks = listed.get("result", {}).get("tasks", [])
                if tasks:
                    return tasks
                await asyncio.sleep(0.01)

        raw_ids = {}

        async def raw_task_of(ctx):
            while True:
                body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": ctx}}
                r = await http.post("/", json=body, headers=H)
                tasks = r.json().get("result", {}).get("tasks", [])
                if tasks:
                    return tasks[0]["id"]
                await asyncio.sleep(0.01)

        for name, end in (("g1", "open"), ("g2", "cancel"), ("g3", "stream")):
            ctx = "ctx-" + name
            first = msg("m-" + name, ctx, "hold", {"name": name, "n": 2})
            if end == "stream":
                blocking = asyncio.ensure_future(rpc("SendStreamingMessage", {"message": first}, stream=True))
            else:
                blocking = asyncio.ensure_future(rpc("SendMessage", {"message": first}))
            tid = await raw_task_of(ctx)
            res.append(["listed", name, await task_of(ctx)])
            for hl in (None, 0, 1):
                res.append(["get", name, hl, await rpc("GetTask", {"id": tid, **({} if hl is None else {"historyLength": hl})})])
            sub = asyncio.ensure_future(rpc("SubscribeToTask", {"id": tid}, stream=True))
            dup = asyncio.ensure_future(rpc("SendMessage", {"message": first}))
            # Nothing outside shows a subscription or a duplicate waiting on the task: a moment
            # for both to reach it before it ends (a late one would see the task ended).
            await asyncio.sleep(0.2)
            res.append(["dup-done-early", name, dup.done()])
            if end == "cancel":
                res.append(["cancel", name, await rpc("CancelTask", {"id": tid})])
            else:
                res.append(["open", name, await rpc("SendMessage", {"message": msg("o-" + name, "ctx-o", "open_gate", {"name": name})})])
            res.append(["blocking", name, await blocking])
            res.append(["sub", name, await sub])
            res.append(["dup", name, await dup])
            res.append(["after", name, await rpc("GetTask", {"id": tid})])
            res.append(["again", name, await rpc("SendMessage", {"message": first})])
            raw_ids[name] = tid
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        for name, tid in raw_ids.items():
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid}}
            r = await http.post("/", json=body, headers=H)
            res.append(["restart-get", name, canon(r.text)])
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": msg("m-" + name, "ctx-" + name, "hold", {"name": name, "n": 2})}}
            r = await http.post("/", json=body, headers=H)
            res.append(["restart-again", name, canon(r.text)])
    out["res"] = res
    print(json.dumps(out))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_released_typed_runs_are_seen_as_the_tree_before(trees: Trees) -> None:
    """Holds (1ef875b): every answer, event and read equals 19420e3's."""
    now, before = _both(trees, _HELD_DRIVER)
    assert now["res"][1][3]["result"]["status"]["state"] == "TASK_STATE_WORKING"
    assert now == before


# --- bcbfdf2 / b8f2990: request shapes the handed values meet ---------------------------------
#
# 26 part lists (data that is not an object, two data parts, data beside text, a text object,
# two of them, none, an empty part, a file beside data, a data part with both data and text,
# values the model refuses, nested values, not a list at all) under 12 metadata shapes (not an
# object, skill not a string, unknown, 300 characters, null, empty, a past deadline), on
# JSON-RPC and (every third) REST: each answer, never a 500.

_SHAPES_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sys, tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def canon(status, text):
    return [status, parsed(scrub(text))]


class In(BaseModel):
    a: float = 0
    s: str = ""


class Out(BaseModel):
    seen: str


@skill
def echo(req: In) -> Out:
    """Echo."""
    return Out(seen=repr(req))


@skill
def other(req: In) -> Out:
    """Other."""
    return Out(seen="other " + repr(req))


agent = Agent(name="s34-shapes", description="Shapes.", skills=[echo, other])

PARTS = [
    '[{"data": 5}]', '[{"data": [1, 2]}]', '[{"data": "s"}]', '[{"data": null}]', '[{"data": true}]',
    '[{"data": {"a": 1}}, {"data": {"a": 2}}]', '[{"data": {"a": 1}}, {"text": "hi"}]', '[{"text": "{\\"a\\": 3}"}]',
    '[{"text": "{\\"a\\": 3}"}, {"text": "{\\"a\\": 4}"}]', '[{"text": "not json"}]', '[]', '[{}]',
    '[{"data": {}}]', '[{"data": {"a": 1}, "mediaType": "text/plain"}]', '[{"data": {"a": 1}, "text": "x"}]',
    '[{"raw": "AAAA", "mediaType": "application/octet-stream"}, {"data": {"a": 1}}]',
    '[{"url": "http://x/y", "mediaType": "text/plain"}]', '[{"data": {"a": "1"}}]', '[{"data": {"a": 1, "zz": 2}}]',
    '[{"data": {"s": 1}}]', '[{"data": {"a": 1e400}}]', '[{"data": {"a": [1]}}]', '[{"data": {"a": {"b": 1}}}]',
    '{"data": {"a": 1}}', '"x"', 'null',
]
METAS = ['{"skill": "echo"}', 'null', '[1]', '"echo"', '{"skill": 5}', '{"skill": ["echo"]}', '{"skill": "nope"}',
         '{}', '{"skill": "echo", "deadline": -1}', '{"skill": "' + 'e' * 300 + '"}', '{"skill": null}', '{"skill": ""}']


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    answers = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        n = 0
        for parts in PARTS:
            for meta in METAS:
                n += 1
                msg = '{"role": "ROLE_USER", "messageId": "m%d", "parts": %s, "metadata": %s}' % (n, parts, meta)
                body = '{"jsonrpc": "2.0", "id": %d, "method": "SendMessage", "params": {"message": %s}}' % (n, msg)
                r = await http.post("/", content=body, headers=H)
                answers.append([parts, meta, canon(r.status_code, r.text)])
                if n % 3 == 0:
                    rest = '{"message": %s}' % msg.replace('"m%d"' % n, '"r%d"' % n)
                    r = await http.post("/a2a/rest/message:send", content=rest, headers=H)
                    answers.append([parts, meta, "rest", canon(r.status_code, r.text)])
    print(json.dumps({"mesh": mesh.__file__, "answers": answers}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_odd_request_shapes_are_answered_as_the_tree_before(trees: Trees) -> None:
    """Holds (bcbfdf2, b8f2990): 416 answers equal 19420e3's, none a 500."""
    now, before = _both(trees, _SHAPES_DRIVER)
    assert {answer[-1][0] for answer in now["answers"]} == {200, 400}
    assert now == before


# --- 506702b: get_once (the registry's probes) over the same checked connect -------------------
#
# ``mesh._outbound.get_once`` (its streams now built over ``_connect_checked``) and a plain
# POST of the guarded client, to 127.0.0.1 and to localhost (resolved by the guard), for eight
# answers under two caps.

_ONCE_DRIVER = r"""
import asyncio, json, os, ssl, sys, tempfile
from pathlib import Path
import httpx
import mesh
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._outbound import get_once

# With S34_TLS: the server speaks TLS (a trustme CA this process trusts).
TLS, SCHEME = None, "http"
if os.environ.get("S34_TLS"):
    import trustme
    from mesh._tls import trust

    _ca = trustme.CA()
    _bundle = Path(tempfile.mkdtemp()) / "ca.pem"
    _ca.cert_pem.write_to_path(str(_bundle))
    trust(_bundle)
    TLS, SCHEME = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), "https"
    _ca.issue_cert("127.0.0.1", "localhost").configure_cert(TLS)


ANSWERS = {
    "ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    "to_close": b"HTTP/1.1 200 OK\r\n\r\nuntil close",
    "big": b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n" + b"b" * 300000,
    "garbage": b"NOPE\r\n\r\n",
    "huge_head": b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 70000 + b"\r\nContent-Length: 2\r\n\r\nhi",
    "503": b"HTTP/1.1 503 No\r\nContent-Length: 4\r\n\r\nbusy",
    "nothing": b"",
}


async def main():
    out = {}
    for mode, answer in ANSWERS.items():
        async def handle(reader, writer):
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
                writer.close()
            except Exception:
                pass
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=TLS)
        port = server.sockets[0].getsockname()[1]
        http = create_http_client(NetworkPolicy.parse("any"), timeout=httpx.Timeout(5.0, connect=2.0))
        got = []
        for host in ("127.0.0.1", "localhost"):
            for cap in (100, 1 << 20):
                try:
                    r = await get_once(http, f"{SCHEME}://{host}:{port}/health", max_bytes=cap, timeout_s=2.0)
                    got.append(["ok", r.status_code, len(r.content), r.content[:20].decode()])
                except Exception as exc:
                    got.append(["error", type(exc).__name__, str(exc).replace(str(port), "<port>")[:200]])
            try:
                r = await http.post(f"{SCHEME}://{host}:{port}/", content=b"{}")
                got.append(["post", r.status_code, r.content[:20].decode()])
            except Exception as exc:
                got.append(["post-error", type(exc).__name__, str(exc).replace(str(port), "<port>")[:200]])
        await http.aclose()
        server.close()
        out[mode] = got
    print(json.dumps({"mesh": mesh.__file__, "out": out}))


asyncio.run(main())
"""


@pytest.mark.integration
@pytest.mark.parametrize("tls", ["", "1"])
def test_probes_over_the_checked_connect_are_the_trees_before(trees: Trees, tls: str) -> None:
    """Holds (506702b), plain and TLS."""
    now, before = _both(trees, _ONCE_DRIVER, env={"S34_TLS": tls})
    assert now["out"]["ok"][0] == ["ok", 200, 2, "hi"]
    assert now == before


# --- 506702b: one connection object offered to each resolved address --------------------------
#
# A resolver whose first address refuses (127.0.0.2, ::1) or is the server itself: DirectPool's
# ``_connect_checked`` hands the same ``_Connection`` to each address's attempt.

_ADDRESSES_DRIVER = r"""
import asyncio, json, socket
import httpx
import mesh
from mesh._pool import DirectPool


class Two:
    def __init__(self, first):
        self.first = first

    async def allowed_addresses(self, host, port, timeout=None):
        return [self.first, "127.0.0.1"]


async def main():
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                await reader.readexactly(n)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
                await writer.drain()
        except (Exception, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # a port nobody listens on, on another loopback address: refused
    out = []
    for first in ("127.0.0.2", "127.0.0.1", "::1"):
        pool = DirectPool(Two(first), max_connections=2, keepalive_expiry=30.0)
        for _ in range(3):
            try:
                got = await pool.post(httpx.URL(f"http://peer.example:{port}/"), [("X", "y")], b"{}", timeout=3.0,
                                      connect_timeout=2.0, max_bytes=100, too_large=lambda: ValueError("big"))
                out.append([first, "ok", got[0], got[1].decode(), len(pool._idle)])
            except Exception as exc:
                out.append([first, "error", type(exc).__name__, str(exc).replace(str(port), "<port>"), repr(exc.__cause__).replace(str(port), "<port>")])
        await pool.aclose()
    server.close()
    print(json.dumps({"mesh": mesh.__file__, "out": out}))


asyncio.run(main())
"""


@pytest.mark.integration
def test_a_refused_first_address_is_passed_over_as_before(trees: Trees) -> None:
    """Holds (506702b)."""
    now, before = _both(trees, _ADDRESSES_DRIVER)
    assert [row[1] for row in now["out"]] == ["ok"] * 9
    assert now == before


# --- 1ef875b: typed runs that report progress, never await, or ask ---------------------------
#
# Blocking and streamed, under four history lengths: the answer (or the stream's events),
# GetTask, the question answered (``asker``), the message again.

_PROGRESS_DRIVER = (
    prelude(ASK_IDS)
    + r'''
import asyncio, json, re, sys, tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, SkillContext, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}


class In(BaseModel):
    n: int = 2


class Out(BaseModel):
    n: int
    note: str = ""


class Decision(BaseModel):
    ok: bool


@skill
async def prog(req: In, ctx: SkillContext) -> Out:
    """Reports progress."""
    for i in range(req.n):
        await ctx.progress(f"step {i} \u00e9")
    return Out(n=req.n)


@skill
def prog_sync(req: In) -> Out:
    """No await at all."""
    return Out(n=req.n, note="sync")


@skill
async def asker(req: In, ctx: SkillContext) -> Out:
    """Asks."""
    answer = await ctx.ask(f"go with {req.n}?", schema=Decision)
    return Out(n=req.n, note=repr(answer))


agent = Agent(name="s34-prog", description="Progress.", skills=[prog, prog_sync, asker])


def msg(mid, ctx, skill, data, task=None):
    m = {"role": "ROLE_USER", "messageId": mid, "contextId": ctx, "parts": [{"data": data}],
         "metadata": {"skill": skill}}
    if task:
        m["taskId"] = task
    return m


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    res = []
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        async def rpc(method, params, stream=False, raw=False):
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            if stream:
                r = await http.post("/", json=body, headers={**H, "Accept": "text/event-stream"})
                return [canon(l[5:]) for l in r.text.splitlines() if l.startswith("data:")]
            r = await http.post("/", json=body, headers=H)
            return r.json() if raw else canon(r.text)

        n = 0
        for skill_id in ("prog", "prog_sync", "asker"):
            for streamed in (False, True):
                for hl in (None, 0, 1, 5):
                    n += 1
                    ctx = f"ctx-{n}"
                    params = {"message": msg(f"m{n}", ctx, skill_id, {"n": 2})}
                    if hl is not None:
                        params["configuration"] = {"historyLength": hl}
                    if streamed:
                        got = await rpc("SendStreamingMessage", params, stream=True)
                        res.append([skill_id, hl, "stream", got])
                        raw = await rpc("ListTasks", {"contextId": ctx}, raw=True)
                        tid = raw["result"]["tasks"][0]["id"]
                    else:
                        raw = await rpc("SendMessage", params, raw=True)
                        res.append([skill_id, hl, "send", canon(json.dumps(raw))])
                        tid = raw["result"]["task"]["id"]
                    res.append(["get", canon(json.dumps(await rpc("GetTask", {"id": tid}, raw=True)))])
                    if skill_id == "asker":
                        ans = await rpc("SendMessage", {"message": msg(f"a{n}", ctx, skill_id, {"ok": True}, task=tid)})
                        res.append(["answered", ans])
                        res.append(["get2", await rpc("GetTask", {"id": tid, "historyLength": 10})])
                    res.append(["again", await rpc("SendMessage", params)])
    print(json.dumps({"mesh": mesh.__file__, "res": res}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_progress_and_asking_typed_runs_are_the_tree_before(trees: Trees) -> None:
    """Holds (1ef875b): 88 reads equal 19420e3's."""
    now, before = _both(trees, _PROGRESS_DRIVER)
    assert len(now["res"]) == 88
    assert now == before


# --- 6646e05: TaskResult / Artifact / TraceParent made without their frozen __init__ ----------
#
# 3000 seeded task answers of every shape (states known or not, status messages, artifacts of
# text, data, files, bad base64, junk parts, error metadata) read by ``TaskResult.from_json``:
# the repr, the instance dict's order, equality with the object ``__init__`` makes, a deep
# copy and a pickle; six ``traceparent`` headers parsed.

_RESULTS_DRIVER = r"""
import base64, json, pickle, random, copy, dataclasses
import mesh
from mesh._a2a.results import TaskResult
from mesh._tracing import TraceParent

rng = random.Random(34)
STATES = ["TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_REJECTED", "TASK_STATE_CANCELED",
          "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED", "TASK_STATE_WORKING", "TASK_STATE_SUBMITTED", "", "junk", None, 5]


def part():
    k = rng.randrange(9)
    return [
        lambda: {"text": rng.choice(["hi", "", "\u00e9"])},
        lambda: {"data": {"a": rng.choice([1, 1.0, None, [1], {"b": 2}])}},
        lambda: {"data": rng.choice([[1], "s", None])},
        lambda: {"raw": base64.b64encode(b"\x89PNG").decode(), "mediaType": "image/png", "filename": "c.png"},
        lambda: {"raw": "!!notbase64", "mediaType": "image/png"},
        lambda: {"url": "http://x/y.pdf", "mediaType": "application/pdf"},
        lambda: {},
        lambda: "junk",
        lambda: {"text": 5},
    ][k]()


def task():
    t = {}
    if rng.random() < 0.9: t["id"] = rng.choice(["t-1", "", None, 7])
    if rng.random() < 0.9: t["contextId"] = rng.choice(["c-1", ""])
    st = {}
    if rng.random() < 0.95: st["state"] = rng.choice(STATES)
    if rng.random() < 0.5: st["message"] = rng.choice([{"parts": [part() for _ in range(rng.randrange(3))], "role": "ROLE_AGENT"}, "junk", None, {}])
    if rng.random() < 0.5: st["timestamp"] = rng.choice(["2026-01-01T00:00:00Z", "", None])
    t["status"] = rng.choice([st, st, st, None, "junk"])
    if rng.random() < 0.7:
        t["artifacts"] = [{"artifactId": "a", "name": rng.choice(["answer", "", None]), "description": rng.choice(["d", None]),
                           "parts": [part() for _ in range(rng.randrange(4))]} for _ in range(rng.randrange(3))]
    if rng.random() < 0.5:
        t["metadata"] = rng.choice([{"error": {"reason": "failed", "message": "m"}}, {"error": "x"}, {"usage": {"a": 1}}, "junk", {}])
    if rng.random() < 0.3:
        t["history"] = [{"role": "ROLE_AGENT", "parts": [part()]}]
    return t


out = []
for i in range(3000):
    t = task()
    try:
        r = TaskResult.from_json(t)
        row = ["ok", repr(r), list(vars(r)), r == TaskResult(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}),
               r == copy.deepcopy(r), [list(vars(a)) for a in r.artifacts], repr(pickle.loads(pickle.dumps(r))) == repr(r)]
    except Exception as exc:
        row = ["raised", type(exc).__name__, str(exc)[:200]]
    out.append(row)
for h in ("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "00-" + "0" * 32 + "-" + "cd" * 8 + "-01", "junk", None, "ff-" + "ab" * 16 + "-" + "cd" * 8 + "-01-x", "00-" + "AB" * 16 + "-" + "cd" * 8 + "-01"):
    p = TraceParent.parse(h)
    out.append(["tp", repr(p), p is not None and list(vars(p)), p is not None and hash(p) == hash(TraceParent(p.trace_id, p.span_id, p.flags, p.version))])
print(json.dumps({"mesh": mesh.__file__, "out": out}))
"""


def test_read_answers_are_the_objects_of_the_tree_before(trees: Trees) -> None:
    """Holds (6646e05)."""
    now, before = _both(trees, _RESULTS_DRIVER)
    assert {row[0] for row in now["out"]} == {"ok", "tp"}
    assert now == before


# --- 5b87454: the rows ListTasks and the trace page read ---------------------------------------
#
# 30 typed tasks over three contexts (a traceparent of one trace, an invalid one, none; some
# failing): ListTasks unfiltered, by context, by status, paged by 7, without history, with
# artifacts (every page), and the trace's task rows; again after a restart on the database.

_LIST_DRIVER = r'''
import asyncio, json, re, sys, tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}
TRACE = "ab" * 16


class In(BaseModel):
    i: int


class Out(BaseModel):
    i: int


@skill
def num(req: In) -> Out:
    """Its number back; an odd multiple of 7 fails, a request of 5 is refused below."""
    if req.i % 7 == 0 and req.i % 2:
        raise ValueError("seven")
    return Out(i=req.i)


agent = Agent(name="s34-list", description="Lists.", skills=[num])


def key_of(task):
    """A task named by its request's number (ids are random)."""
    for m in task.get("history", []):
        for p in m.get("parts", []):
            if "data" in p and "i" in p["data"]:
                return int(p["data"]["i"])
    for a in task.get("artifacts", []):
        for p in a.get("parts", []):
            if "data" in p and "i" in p["data"]:
                return int(p["data"]["i"])
    return None


def shown(task):
    return [key_of(task), task.get("contextId"), task["status"]["state"], len(task.get("history", [])),
            len(task.get("artifacts", [])), sorted(task.get("metadata", {}))]


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    out = {"mesh": mesh.__file__}
    for phase in ("first", "restart"):
        node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
        async with (
            uvicorn_serving(node.app, port, log_level="warning"),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
        ):
            async def rpc(method, params):
                r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=H)
                return r.json()

            if phase == "first":
                for i in range(30):
                    meta = {"skill": "num"}
                    if i % 3 == 0:
                        meta["traceparent"] = f"00-{TRACE}-{i:016x}-01"
                    elif i % 3 == 1:
                        meta["traceparent"] = "00-junk"
                    msg = {"role": "ROLE_USER", "messageId": f"m{i}", "contextId": f"ctx-{i % 3}",
                           "parts": [{"data": {"i": i}}], "metadata": meta}
                    await rpc("SendMessage", {"message": msg})
            got = []
            for params in ({}, {"contextId": "ctx-1"}, {"status": "TASK_STATE_FAILED"}, {"pageSize": 7},
                           {"contextId": "ctx-0", "historyLength": 0}, {"includeArtifacts": True, "pageSize": 50}):
                pages, token = [], None
                for _ in range(10):
                    listed = await rpc("ListTasks", {**params, **({"pageToken": token} if token else {})})
                    result = listed.get("result", {})
                    pages.append([shown(t) for t in result.get("tasks", [])])
                    token = result.get("nextPageToken")
                    if not token:
                        break
                got.append([params, pages, result.get("totalSize"), result.get("pageSize")])
            r = await http.get(f"/v1/traces/{TRACE}/tasks")
            rows = r.json()
            rows = rows if isinstance(rows, list) else rows.get("tasks", [rows])
            got.append(["trace", r.status_code, len(rows), sorted(
                json.dumps([row.get("input"), row.get("state"), row.get("skill"), sorted(row)], sort_keys=True)
                for row in rows)])
            out[phase] = got
    print(json.dumps(out))


asyncio.run(main())
'''


@pytest.mark.integration
def test_listed_tasks_and_trace_rows_are_the_tree_before(trees: Trees) -> None:
    """Holds (5b87454)."""
    now, before = _both(trees, _LIST_DRIVER)
    assert now["first"][-1][2] == 9  # the trace's tasks
    assert now == before


# --- 506702b / 70bdaef: answers' heads of every size, however they arrive ---------------------
#
# Heads of 100 B to 300 KB (around h11's 16 KiB and the old 64 KiB read), sent at once or in
# pieces of 1 KB, 16 KiB and 50 KB (a loop turn between), with bodies of 2 B to 200 KB, CRLF or
# bare LF: each post's status, length or error, and whether the connection is kept.

_SWEEP_DRIVER = r"""
import asyncio, json, sys
import httpx
import mesh
from mesh._pool import DirectPool

SIZES = [100, 16 * 1024 - 200, 16 * 1024 + 10, 30000, 64 * 1024 - 100, 64 * 1024 + 10, 70000, 130000, 300000]
CHUNKS = [0, 1000, 16 * 1024, 50000]  # 0: all at once
BODIES = [2, 70000, 200000]


async def main():
    plan = {}

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                body = await reader.readexactly(n)
                size, chunk, blen, lf = json.loads(body)
                eol = b"\n" if lf else b"\r\n"
                answer = (b"HTTP/1.1 200 OK" + eol + b"X-Pad: " + b"p" * size + eol
                          + b"Content-Length: %d" % blen + eol + eol + b"b" * blen)
                if chunk == 0:
                    writer.write(answer)
                    await writer.drain()
                else:
                    for i in range(0, len(answer), chunk):
                        writer.write(answer[i:i + chunk])
                        await writer.drain()
                        await asyncio.sleep(0)  # a turn of the loop: the client may read a piece
        except (Exception, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = httpx.URL(f"http://127.0.0.1:{port}/")
    pool = DirectPool(None, max_connections=2, keepalive_expiry=30.0)
    out = []
    for size in SIZES:
        for chunk in CHUNKS:
            for blen in BODIES:
                for lf in (0, 1):
                    try:
                        st, body = await pool.post(url, [("A", "b")], json.dumps([size, chunk, blen, lf]).encode(), timeout=5.0,
                                                   connect_timeout=2.0, max_bytes=1 << 20, too_large=lambda: ValueError("big"))
                        got = ["ok", st, len(body)]
                    except Exception as exc:
                        got = ["error", type(exc).__name__, str(exc)[:120]]
                    out.append([size, chunk, blen, lf, got, len(pool._idle)])
    await pool.aclose()
    server.close()
    print(json.dumps({"mesh": mesh.__file__, "out": out}))


if sys.argv[1:] == ["uvloop"]:
    import uvloop

    uvloop.run(main())
else:
    asyncio.run(main())
"""


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_heads_of_every_size_and_arrival_read_as_the_tree_before(trees: Trees, loop: str) -> None:
    """Holds (506702b after 70bdaef)."""
    args = ("uvloop",) if loop == "uvloop" else ()
    now, before = _both(trees, _SWEEP_DRIVER, *args)
    assert {row[4][0] for row in now["out"]} == {"ok", "error"}
    assert now == before


# --- the coordinator's LLM turns delegating over A2A (tests.bench.agents) ---------------------
#
# The bench's coordinator (scripted model) calling the bench's specialist over A2A, both served
# in the driver's process: five turns over three contexts, one message sent again, one turn
# with the specialist gone; the answers, the coordinator's session events, the specialist's
# task rows.

_COORDINATOR_DRIVER = (
    prelude(SPAN_IDS, traces=False)
    + r"""
import asyncio, json, os, re, sqlite3, sys, tempfile
from pathlib import Path

import httpx

import mesh
from tests.support import free_port, uvicorn_serving

PEER_PORT = free_port()
os.environ["BENCH_PEER_URL"] = f"http://127.0.0.1:{PEER_PORT}"

from mesh._node import Node  # noqa: E402
from mesh._settings import NodeSettings  # noqa: E402
from tests.bench.agents.coordinator import remote_agent  # noqa: E402
from tests.bench.agents.specialist import agent as specialist  # noqa: E402

H = {"A2A-Version": "1.0"}
NUMS = re.compile(r'"(durationMs|startedAt|endedAt|at|created_at|updated_at|timestamp|started_at|ended_at|deadline|duration_ms)":\s?[0-9.e+-]+')
PORTS = re.compile(r"127\.0\.0\.1:\d+")


def canon(text):
    return parsed(PORTS.sub("<host>", NUMS.sub(r'"\1":0', scrub(text))))


async def main():
    peer_dir, coord_dir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    coord_port = free_port()
    out = {"mesh": mesh.__file__}
    res = []
    coordinator = Node(remote_agent, NodeSettings(port=coord_port, data_dir=coord_dir, registry=None))
    async with (
        uvicorn_serving(coordinator.app, coord_port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{coord_port}", trust_env=False, timeout=60) as http,
    ):
        async def turn(n, text, ctx):
            body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": {
                "role": "ROLE_USER", "messageId": f"m{n}", "contextId": ctx, "parts": [{"text": text}]}}}
            r = await http.post("/", json=body, headers=H)
            return canon(r.text)

        peer = Node(specialist, NodeSettings(port=PEER_PORT, data_dir=peer_dir, registry=None))
        async with uvicorn_serving(peer.app, PEER_PORT, log_level="warning"):
            for n, (text, ctx) in enumerate([("score a-1 for 25000", "c1"), ("score a-2 for 1", "c1"),
                                             ("score \u00e9-3 for 999999999", "c2"), ("hello", "c2"),
                                             ("score a-1 for 25000", "c3")]):
                res.append(await turn(n, text, ctx))
            res.append(await turn(0, "score a-1 for 25000", "c1"))  # the same message again
        # the peer gone: the tool's error as the turn tells it
        res.append(await turn(10, "score a-9 for 5", "c4"))
    conn = sqlite3.connect(coord_dir / "node.db")
    out["events"] = [[s, a, canon(d)] for s, a, d in conn.execute(
        "select session_id, author, data from mesh_session_events order by seq")]
    conn = sqlite3.connect(peer_dir / "node.db")
    out["peer_tasks"] = sorted(json.dumps(canon(json.dumps([c, s]))) for c, s in conn.execute("select context_id, state from a2a_tasks"))
    out["answers"] = res
    print(json.dumps(out))


asyncio.run(main())
"""
)


@pytest.mark.integration
def test_coordinator_turns_over_a2a_are_the_tree_before(trees: Trees) -> None:
    """Holds (every client-side change of the session, end to end)."""
    now, before = _both(trees, _COORDINATOR_DRIVER)
    assert "score 647 tier C" in json.dumps(now["answers"][0])
    assert now == before


# --- 506702b: 400 posts in flight over eight connections, each answered its own way -----------
#
# Each request names how it is answered (answered, answered then closed, reset or closed
# unanswered, slowly, chunked, 200 KB, a 100 KB error, cut short), 400 seeded ones at once
# over a pool of eight: each post's outcome (a reused connection's stale retry meets the same
# answer again, so the outcome is the request's, whatever connection it got).

_STORM_DRIVER = r"""
import asyncio, json, random, socket, struct, sys
import httpx
import mesh
from mesh._pool import DirectPool

KINDS = ["ok", "ok", "ok", "ok_close", "rst", "fin", "slow", "chunked", "big", "err_big", "cut"]


def rst(writer):
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def main():
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                kind, i = json.loads(await reader.readexactly(n))
                body = b'{"i":%d}' % i
                if kind == "rst":
                    rst(writer)
                    return
                if kind == "fin":
                    writer.close()
                    return
                if kind == "slow":
                    await asyncio.sleep(0.01)
                if kind == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                elif kind == "big":
                    big = b"z" * 200000
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big))
                elif kind == "err_big":
                    big = b"e" * 100000
                    writer.write(b"HTTP/1.1 500 No\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big))
                elif kind == "cut":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + body)
                    await writer.drain()
                    writer.close()
                    return
                else:
                    extra = b"Connection: close\r\n" if kind == "ok_close" else b""
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))
                await writer.drain()
                if kind == "ok_close":
                    writer.close()
                    return
        except (Exception, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = httpx.URL(f"http://127.0.0.1:{port}/")
    pool = DirectPool(None, max_connections=8, keepalive_expiry=30.0)
    rng = random.Random(34)
    jobs = [(rng.choice(KINDS), i) for i in range(400)]

    async def one(kind, i):
        try:
            st, body = await pool.post(url, [("A", "b")], json.dumps([kind, i]).encode(), timeout=10.0,
                                       connect_timeout=2.0, max_bytes=1 << 20, too_large=lambda: ValueError("big"))
            return [kind, i, "ok", st, len(body), body[:12].decode()]
        except Exception as exc:
            return [kind, i, "error", type(exc).__name__, str(exc)[:100]]

    got = await asyncio.gather(*(one(k, i) for k, i in jobs))
    await pool.aclose()
    server.close()
    print(json.dumps({"mesh": mesh.__file__, "out": got}))


if sys.argv[1:] == ["uvloop"]:
    import uvloop

    uvloop.run(main())
else:
    asyncio.run(main())
"""


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_many_posts_in_flight_end_as_the_tree_before(trees: Trees, loop: str) -> None:
    """Holds (506702b, 79c10a4, 70bdaef)."""
    args = ("uvloop",) if loop == "uvloop" else ()
    now, before = _both(trees, _STORM_DRIVER, *args)
    assert {row[2] for row in now["out"]} == {"ok", "error"}
    assert now == before


# --- 5b87454: a held run's row made from its Settled when the clock is far off ----------------
#
# The node's wall clock in the year 2200 or before the epoch (a host whose clock is wrong):
# the answers, ListTasks and the rows' status times (``_made_row`` takes at_ns as it is in
# range; ``_row`` read it from the task before).

_CLOCK_DRIVER = (
    prelude(times=False)
    + r'''
import asyncio, json, re, sqlite3, sys, tempfile, time
from pathlib import Path

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}

# The process's wall clock moved (a host whose clock is wrong): to the year 2200, or before
# the epoch. (Past 2262-04-11 a status time in ns overflows SQLite's integer: an internal
# error in both trees, not guarded here.)
OFFSET_NS = {"y2200": 7258118400_000_000_000 + 500_000_000, "before_epoch": -9_500_000_000}[sys.argv[1]]
_real = time.time_ns
START = _real()
# It runs a thousand times slower: every request of the run falls in one second.
time.time_ns = lambda: OFFSET_NS + (_real() - START) // 1000


class In(BaseModel):
    i: int


class Out(BaseModel):
    i: int


@skill
def num(req: In) -> Out:
    """Its number."""
    return Out(i=req.i)


agent = Agent(name="s34-clock", description="Clock.", skills=[num])


TIMES = re.compile(r'"(\d{4,5})-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"')


def canon(status, text):
    # A time kept to its year: the runs' clocks differ by the milliseconds they took.
    return [status, parsed(TIMES.sub(r'"year \1"', scrub(text)))]


async def main():
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp, registry=None))
    res = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        for i in range(3):
            msg = {"role": "ROLE_USER", "messageId": f"m{i}", "parts": [{"data": {"i": i}}], "metadata": {"skill": "num"}}
            r = await http.post("/", json={"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {"message": msg}}, headers=H)
            res.append(canon(r.status_code, r.text))
        r = await http.post("/", json={"jsonrpc": "2.0", "id": 9, "method": "ListTasks", "params": {}}, headers=H)
        res.append(canon(r.status_code, r.text))
    conn = sqlite3.connect(tmp / "node.db")
    rows = [[s, u // 10**9 if u >= 0 else -((-u) // 10**9 + 1)] for s, u in conn.execute(
        "select state, updated_at from a2a_tasks order by updated_at")]
    print(json.dumps({"mesh": mesh.__file__, "res": res, "rows": rows}))


asyncio.run(main())
'''
)


@pytest.mark.integration
@pytest.mark.parametrize("clock", ["y2200", "before_epoch"])
def test_tasks_under_a_wrong_clock_are_stored_as_the_tree_before(trees: Trees, clock: str) -> None:
    """Holds (5b87454)."""
    now, before = _both(trees, _CLOCK_DRIVER, clock)
    assert len(now["rows"]) == 3
    assert now == before


# --- 79c10a4: a deadline left while it is the soonest popped at once ---------------------------
#
# mesh._timeouts on a loop whose clock jumps to each timer (a selector that, with no I/O, moves
# the clock by the wait it is asked for: deterministic): 40 tasks (each its own seeded
# program, so the order tasks run in changes no one's program) entering deadlines
# (none, due now, past, short, long; ``with`` or ``async with``), rescheduling them, nesting
# them two deep, sleeping in them, some tasks cancelled from outside: each step's outcome
# (done, TimeoutError, cancelled), its loop time and ``expired()``.

_TIMEOUTS_DRIVER = r'''
import asyncio, json, random, selectors, sys
import mesh
from mesh import _timeouts


class FastForward(selectors.DefaultSelector):
    """No I/O here: a wait of t seconds moves the loop's clock by t at once."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        if timeout is not None and timeout > 0:
            self.clock[0] += timeout
        return super().select(0)


class Loop(asyncio.SelectorEventLoop):
    def __init__(self):
        self.clock = [1000.0]
        super().__init__(FastForward(self.clock))

    def time(self):
        return self.clock[0]


SEED = "34"
log = []


async def worker(w, depth=0):
    # Each worker's own program (its own generator): the order tasks run in changes no one's.
    rng = random.Random(f"{SEED}/{w}")
    t0 = asyncio.get_running_loop().time()
    for step in range(rng.randrange(1, 4)):
        delay = rng.choice([None, 0, 0.01, 0.05, 0.1, 0.2, 1.0, -1])
        sleep = rng.choice([0, 0.005, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.5])
        use_async = rng.random() < 0.3
        resched = rng.choice([None, None, None, 0.02, 0.3, "none"])
        nested = depth < 2 and rng.random() < 0.4
        try:
            cm = _timeouts.timeout(delay)
            if use_async:
                async with cm:
                    if resched is not None:
                        cm.reschedule(None if resched == "none" else asyncio.get_running_loop().time() + resched)
                    if nested:
                        await worker(f"{w}.{step}", depth + 1)
                    await asyncio.sleep(sleep)
            else:
                with cm:
                    if resched is not None:
                        cm.reschedule(None if resched == "none" else asyncio.get_running_loop().time() + resched)
                    if nested:
                        await worker(f"{w}.{step}", depth + 1)
                    await asyncio.sleep(sleep)
            log.append([w, step, "done", round(asyncio.get_running_loop().time() - t0, 6), cm.expired()])
        except TimeoutError:
            log.append([w, step, "timeout", round(asyncio.get_running_loop().time() - t0, 6), cm.expired()])
        except asyncio.CancelledError:
            log.append([w, step, "cancelled"])
            raise


async def main():
    tasks = [asyncio.ensure_future(worker(str(i))) for i in range(40)]
    # some cancelled from outside mid-way
    await asyncio.sleep(0.04)
    for t in tasks[::7]:
        t.cancel()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    log.append(["results", [type(g).__name__ if g is not None else None for g in got]])


first, last = (int(x) for x in sys.argv[1].split("-"))
runs = {}
for number in range(first, last + 1):
    SEED, log = str(number), []
    loop = Loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    runs[SEED] = log
print(json.dumps({"mesh": mesh.__file__, "runs": runs}))
'''


def test_deadlines_end_each_task_as_the_tree_before(trees: Trees) -> None:
    """Holds (79c10a4): over 200 seeded programs, every task's every step ends as in
    19420e3 (done, TimeoutError or cancelled, at the same loop time, ``expired()`` alike)."""
    now, before = _both(trees, _TIMEOUTS_DRIVER, "100-299")
    assert len(now["runs"]) == 200
    for seed, log in now["runs"].items():
        assert len(log) > 50
        assert sorted(map(json.dumps, log)) == sorted(map(json.dumps, before["runs"][seed])), seed


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="79c10a4: two tasks' events at the same loop instant run in the other order (6 of "
    "200 programs: 122, 145, 166, 170, 262, 277). A deadline left while it was the heap's "
    "root is popped at once, so the wheel's next timer is armed straight for the next "
    "deadline, before another task's asyncio.sleep timer due at that same instant; 19420e3 "
    "kept the left deadline in the heap, fired its timer first (nothing due) and armed the "
    "next one after that sleep's timer. Equal loop times are ordered by the loop's heap: "
    "no task's outcome changes (test_deadlines_end_each_task_as_the_tree_before), only which "
    "of the two runs first. Judged acceptable (session 34's lead): asyncio orders timers due "
    "at one loop time by its heap, with no promise between tasks, and 19420e3's order came "
    "from a no-op wake-up this commit takes out; kept strict so a change of it is seen",
)
def test_deadlines_and_timers_at_one_instant_run_in_the_trees_before_order(trees: Trees) -> None:
    now, before = _both(trees, _TIMEOUTS_DRIVER, "122-122")
    assert sorted(map(json.dumps, now["runs"]["122"])) == sorted(
        map(json.dumps, before["runs"]["122"])
    )
    assert now == before

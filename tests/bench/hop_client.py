"""The client side of one delegation, measured against candidate HTTP clients
(``python -m tests.bench.hop_client``; issue 19 item 2). ``--breakdown`` times where one
call's wall time goes instead (``breakdown``).

It starts one ``bench-bureau`` node (typed skill ``score``, the fast path) and sends it the
delegation's blocking ``SendMessage`` from this process, one call at a time on one kept-alive
connection, by each way below, in rounds that alternate the ways (a loaded host moves every way
alike within a round). From ``a2apeer`` down every way does the same JSON work
(``mesh._a2a.jsonrpc`` builds the body, ``result_of`` and ``TaskResult.from_json`` read the
answer, which is checked); only the HTTP layer differs:

- ``local-tool``: the same tool in process (``coord-local``'s function tool): the floor;
- ``remote-tool``: the ``remote()`` tool's ``call``: the whole client side of a delegation
  (admission, retry policy, breakers, argument and answer schemas, the call record);
- ``remote-tool-httpx``: the same through httpx (as before ``DirectPool``);
- ``a2apeer``: ``A2APeer.send`` as a node calls it (the ``mesh._netguard`` client: since issue
  19 ``mesh._pool.DirectPool``, h11 on asyncio streams to addresses the guard checked);
- ``a2apeer-httpx``: the same through httpx (``A2APeer``'s way for a client not mesh's own);
- ``httpx-transport``: the same client's transport called directly (no ``AsyncClient.send``:
  auth, redirects, cookies, hooks);
- ``httpcore``: the same ``CancelSafePool`` called directly (no httpx request/response);
- ``h11``: a minimal HTTP/1.1 client, asyncio streams and h11, one connection;
- ``h11-anyio``: the same over the guarded backend's (httpcore's) anyio stream;
- ``aiohttp``: ``aiohttp.ClientSession`` (when installed; measured only, not a dependency).

Per way and round: CPU of this process per call (``time.process_time``, what a loaded machine
inflates least) and the wall p50; the table has the median over rounds. The node's own CPU is
the same for every way and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h11
import httpcore
import httpx

from mesh._a2a import jsonrpc
from mesh._a2a.client import A2APeer
from mesh._a2a.results import TaskResult
from mesh._netguard import GuardedBackend, create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._pool import REPLAYABLE, CancelSafePool, MeshTransport
from tests.bench.harness import spawn
from tests.bench.scenarios import Ctx, ServerSpec, _mesh_serve
from tests.support import free_port

__all__ = ["main", "measure"]

PAYLOAD = {"applicant_id": "APP-501", "amount": 250000}
# What a delegation sends along (mesh._delegation.Delegation._metadata): its size matters.
METADATA = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "deadline": 1.0e10,
    "caller": "bench-coordinator",
}
MAX_BYTES = 32 * 1024 * 1024

Call = Callable[[], Awaitable[TaskResult]]


def _body() -> bytes:
    return jsonrpc.send_message_body(
        PAYLOAD, skill="score", message_id=None, context_id=None, metadata=METADATA, wait=True
    )


def _task(content: bytes) -> TaskResult:
    result = jsonrpc.result_of(content)
    return TaskResult.from_json(result["task"])


_HEADERS = {**jsonrpc.HEADERS}


def _http() -> httpx.AsyncClient:
    """A node's peer client (``mesh._netguard``), as the ways through it have it."""
    return create_http_client(
        NetworkPolicy.parse("any"),
        timeout=httpx.Timeout(35.0, connect=2.0),
        limits=httpx.Limits(max_connections=16, max_keepalive_connections=16),
    )


def _h11_request(conn: h11.Connection, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """The bytes of one ``POST /`` of ``body`` on ``conn``."""
    out = conn.send(
        h11.Request(
            method="POST", target="/", headers=[*headers, ("Content-Length", str(len(body)))]
        )
    )
    return out + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())


async def _h11_answer(conn: h11.Connection, read: Callable[[], Awaitable[bytes]]) -> bytes:
    """The body of the answer on ``conn`` (``read`` gives the bytes that came in); ``conn``
    is then ready for the next request."""
    chunks: list[bytes] = []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await read())
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("closed")
    conn.start_next_cycle()
    return b"".join(chunks)


async def _a2apeer(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    http = _http()
    peer = A2APeer(http, url)

    async def call() -> TaskResult:
        return await peer.send(PAYLOAD, skill="score", metadata=METADATA, timeout=30.0)

    return call, http.aclose


async def _remote_tool(
    url: str, *, direct: bool = True
) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """The whole client side of a delegation: the ``remote()`` tool's ``call`` (admission,
    retry policy, breakers, metadata, the call record and its log line) on a node's client;
    without ``direct``, through httpx (as before ``DirectPool``)."""
    from mesh._remote import remote
    from mesh._tools import ToolContext

    http = _http()
    if not direct:
        transport = http._transport_for_url(httpx.URL(url))
        assert isinstance(transport, MeshTransport)
        transport.direct = None
    toolset = remote("bench-bureau", skill="score", url=url)
    toolset.bind(http=http)
    ctx = ToolContext(
        agent_name="bench-coordinator", user_id="u", session_id="s", invocation_id="i"
    )
    (tool,) = await toolset.tools(ctx)

    async def call() -> TaskResult:
        answer = await tool.call(dict(PAYLOAD), ctx)
        return TaskResult(task_id="-", context_id="-", state="completed", data=answer)

    async def close() -> None:
        await toolset.aclose()
        await http.aclose()

    return call, close


async def _local_tool(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """The same tool in process (``coord-local``'s): what the hop is measured against."""
    from mesh._tools import ToolContext
    from tests.bench.agents.coordinator import score

    ctx = ToolContext(
        agent_name="bench-coordinator", user_id="u", session_id="s", invocation_id="i"
    )

    async def call() -> TaskResult:
        answer = await score.call(dict(PAYLOAD), ctx)
        return TaskResult(task_id="-", context_id="-", state="completed", data=answer)

    async def close() -> None:
        return None

    return call, close


async def _a2apeer_httpx(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """``A2APeer.send`` through httpx, as before ``DirectPool`` (its fallback for a client
    that is not mesh's own)."""
    call, close = await _a2apeer(url)
    peer: A2APeer = call.__closure__[0].cell_contents  # type: ignore[index]
    peer._direct_pool = lambda: None  # type: ignore[method-assign]
    return call, close


async def _httpx_transport(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    http = _http()
    transport = http._transport_for_url(httpx.URL(url))

    async def call() -> TaskResult:
        request = httpx.Request(
            "POST",
            url,
            content=_body(),
            headers=_HEADERS,
            extensions={
                REPLAYABLE: True,
                "timeout": {"connect": 2.0, "read": 30.0, "write": 30.0, "pool": 30.0},
            },
        )
        async with asyncio.timeout(30.0):
            response = await transport.handle_async_request(request)
            try:
                chunks = [chunk async for chunk in response.stream]  # type: ignore[union-attr]
            finally:
                await response.aclose()
        return _task(b"".join(chunks))

    return call, http.aclose


async def _httpcore(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    pool = CancelSafePool(
        max_connections=16,
        max_keepalive_connections=16,
        network_backend=GuardedBackend(NetworkPolicy.parse("any")),
    )
    target = url.encode()
    netloc = httpx.URL(url).netloc
    headers = [(b"Host", netloc), *((k.encode(), v.encode()) for k, v in _HEADERS.items())]

    async def call() -> TaskResult:
        body = _body()
        request = httpcore.Request(
            b"POST",
            target,
            headers=[*headers, (b"Content-Length", str(len(body)).encode())],
            content=httpx.ByteStream(body),
            extensions={
                REPLAYABLE: True,
                "timeout": {"connect": 2.0, "read": 30.0, "write": 30.0, "pool": 30.0},
            },
        )
        async with asyncio.timeout(30.0):
            response = await pool.handle_async_request(request)
            try:
                size, chunks = 0, []
                async for chunk in response.stream:  # type: ignore[union-attr]
                    size += len(chunk)
                    if size > MAX_BYTES:
                        raise ValueError("too large")
                    chunks.append(chunk)
            finally:
                await response.aclose()
        return _task(b"".join(chunks))

    return call, pool.aclose


async def _h11(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    state: dict[str, Any] = {}
    headers = [("Host", f"{host}:{port}"), *_HEADERS.items()]

    async def call() -> TaskResult:
        body = _body()
        async with asyncio.timeout(30.0):
            if "conn" not in state:
                reader, writer = await asyncio.open_connection(host, port)
                state.update(conn=h11.Connection(h11.CLIENT), reader=reader, writer=writer)
            conn: h11.Connection = state["conn"]
            reader, writer = state["reader"], state["writer"]
            writer.write(_h11_request(conn, headers, body))
            answer = await _h11_answer(conn, functools.partial(reader.read, 65536))
        return _task(answer)

    async def close() -> None:
        if "writer" in state:
            state["writer"].close()

    return call, close


async def _h11_anyio(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    backend = GuardedBackend(NetworkPolicy.parse("any"))
    state: dict[str, Any] = {}
    headers = [("Host", f"{host}:{port}"), *_HEADERS.items()]

    async def call() -> TaskResult:
        body = _body()
        async with asyncio.timeout(30.0):
            if "conn" not in state:
                stream = await backend.connect_tcp(host, port, timeout=2.0)
                state.update(conn=h11.Connection(h11.CLIENT), stream=stream)
            conn: h11.Connection = state["conn"]
            stream = state["stream"]
            await stream.write(_h11_request(conn, headers, body))
            answer = await _h11_answer(conn, functools.partial(stream.read, 65536))
        return _task(answer)

    async def close() -> None:
        if "stream" in state:
            await state["stream"].aclose()

    return call, close


async def _aiohttp(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=16),
        timeout=aiohttp.ClientTimeout(total=30.0, connect=2.0),
        skip_auto_headers=("User-Agent",),
    )

    async def call() -> TaskResult:
        async with session.post(url, data=_body(), headers=_HEADERS) as response:
            size, chunks = 0, []
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ValueError("too large")
                chunks.append(chunk)
        return _task(b"".join(chunks))

    return call, session.close


WAYS: dict[str, Callable[[str], Awaitable[tuple[Call, Callable[[], Awaitable[None]]]]]] = {
    "local-tool": _local_tool,
    "remote-tool": _remote_tool,
    "remote-tool-httpx": functools.partial(_remote_tool, direct=False),
    "a2apeer": _a2apeer,
    "a2apeer-httpx": _a2apeer_httpx,
    "httpx-transport": _httpx_transport,
    "httpcore": _httpcore,
    "h11": _h11,
    "h11-anyio": _h11_anyio,
    "aiohttp": _aiohttp,
}


async def _round(call: Call, n: int) -> tuple[float, float]:
    """CPU ms per call and wall p50 ms over ``n`` sequential calls."""
    walls: list[float] = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        result = await call()
        walls.append(time.perf_counter() - t0)
        if result.state != "completed" or not result.data or "score" not in result.data:
            raise RuntimeError(f"unexpected answer: {result}")
    cpu = time.process_time() - cpu0
    return 1000 * cpu / n, 1000 * statistics.median(walls)


async def measure(url: str, ways: list[str], n: int, runs: int) -> dict[str, dict[str, float]]:
    """Median over ``runs`` alternated rounds of ``n`` calls per way."""
    opened = {way: await WAYS[way](url) for way in ways}
    samples: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    try:
        for way in ways:  # warm up: connections, caches
            for _ in range(50):
                await opened[way][0]()
        for index in range(runs):
            order = ways if index % 2 == 0 else list(reversed(ways))
            for way in order:
                samples[way].append(await _round(opened[way][0], n))
    finally:
        for _, close in opened.values():
            await close()
    return {
        way: {
            "cpu_ms": statistics.median(c for c, _ in found),
            "p50_ms": statistics.median(w for _, w in found),
            "cpu_min_ms": min(c for c, _ in found),
            "cpu_max_ms": max(c for c, _ in found),
        }
        for way, found in samples.items()
    }


# The ways ``breakdown`` times (those through ``mesh._pool.DirectPool``).
_DIRECT_WAYS = ("remote-tool", "a2apeer")
# The stages of one call ``breakdown`` times (ms, medians over the calls).
STAGES = ("before_write", "write", "to_first_byte", "first_to_last_byte", "after_answer", "total")


async def breakdown(url: str, way: str, n: int) -> dict[str, float]:
    """Where one call's wall time goes, for a way through ``mesh._pool.DirectPool``: the
    client's work before the request is written, the write itself, the wait for the answer's
    first byte, from it to the last read, the client's work after it (the ``STAGES``, p50 ms);
    the reads per call, the client's CPU per call and the specialist's own mean task time from
    its ``/metrics`` (``mesh_task_duration_seconds``), over ``n`` sequential calls."""
    from mesh import _pool

    marks: dict[str, float] = {}
    read, write = _pool._read, asyncio.StreamWriter.write

    async def timed_read(reader: asyncio.StreamReader) -> bytes:
        data = await read(reader)
        marks.setdefault("first", time.perf_counter())
        marks["last"] = time.perf_counter()
        marks["reads"] = marks.get("reads", 0) + 1
        return data

    def timed_write(self: asyncio.StreamWriter, data: Any) -> None:
        marks["write0"] = time.perf_counter()
        write(self, data)
        marks["write1"] = time.perf_counter()

    async def task_seconds() -> tuple[float, float]:
        async with httpx.AsyncClient() as client:
            text = (await client.get(url + "/metrics")).text
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith("mesh_task_duration_seconds_sum"):
                total += float(line.split()[-1])
            elif line.startswith("mesh_task_duration_seconds_count"):
                count += float(line.split()[-1])
        return total, count

    _pool._read = timed_read
    asyncio.StreamWriter.write = timed_write  # type: ignore[method-assign]
    try:
        call, close = await WAYS[way](url)
        for _ in range(100):
            await call()
        rows: list[tuple[float, ...]] = []
        sum0, count0 = await task_seconds()
        cpu0 = time.process_time()
        for _ in range(n):
            marks.clear()
            start = time.perf_counter()
            await call()
            end = time.perf_counter()
            rows.append(
                (
                    marks["write0"] - start,
                    marks["write1"] - marks["write0"],
                    marks["first"] - marks["write1"],
                    marks["last"] - marks["first"],
                    end - marks["last"],
                    end - start,
                    marks["reads"],
                )
            )
        cpu = time.process_time() - cpu0
        sum1, count1 = await task_seconds()
        await close()
    finally:
        _pool._read = read
        asyncio.StreamWriter.write = write  # type: ignore[method-assign]
    found = {
        stage: 1000 * statistics.median(row[index] for row in rows)
        for index, stage in enumerate(STAGES)
    }
    found["reads_per_call"] = statistics.mean(row[-1] for row in rows)
    found["client_cpu_ms"] = 1000 * cpu / n
    found["specialist_task_ms"] = 1000 * (sum1 - sum0) / max(1.0, count1 - count0)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="calls per way per round")
    parser.add_argument("--runs", type=int, default=5, help="alternated rounds")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (as uvicorn does)")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="where each call's wall time goes (remote-tool, a2apeer: through DirectPool)",
    )
    args = parser.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    if args.breakdown:
        return _main_breakdown(args, [w for w in ways if w in _DIRECT_WAYS])
    if "aiohttp" in ways:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            print("aiohttp not installed: skipped", file=sys.stderr)
            ways.remove("aiohttp")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(ports={"bureau": free_port()}, tmp=Path(tmp))
        spec = ServerSpec("bureau", _mesh_serve("tests.bench.agents.specialist:agent", "bureau"))
        proc, _ = spawn(spec, ctx, 60.0)
        try:
            run = measure(ctx.url("bureau"), ways, args.n, args.runs)
            if args.uvloop:
                import uvloop

                found = uvloop.run(run)
            else:
                found = asyncio.run(run)
        finally:
            proc.terminate()
    load = os.getloadavg()
    print(f"{'way':18}{'client cpu ms':>15}{'(min-max)':>16}{'wall p50 ms':>13}")
    for way, row in found.items():
        spread = f"{row['cpu_min_ms']:.3f}-{row['cpu_max_ms']:.3f}"
        print(f"{way:18}{row['cpu_ms']:>15.3f}{spread:>16}{row['p50_ms']:>13.3f}")
    print(f"{args.runs} rounds x {args.n} calls per way, load average {load[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"ways": found, "load": load[0]}, indent=2))
    return 0


def _main_breakdown(args: argparse.Namespace, ways: list[str]) -> int:
    if not ways:
        print(f"--breakdown times the ways through DirectPool: {_DIRECT_WAYS}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(ports={"bureau": free_port()}, tmp=Path(tmp))
        spec = ServerSpec("bureau", _mesh_serve("tests.bench.agents.specialist:agent", "bureau"))
        proc, _ = spawn(spec, ctx, 60.0)
        try:
            found: dict[str, dict[str, float]] = {}
            for way in ways:
                run = breakdown(ctx.url("bureau"), way, args.n * args.runs)
                if args.uvloop:
                    import uvloop

                    found[way] = uvloop.run(run)
                else:
                    found[way] = asyncio.run(run)
        finally:
            proc.terminate()
    print(f"{'way':14}" + "".join(f"{stage:>19}" for stage in STAGES))
    for way, row in found.items():
        print(f"{way:14}" + "".join(f"{row[stage]:>19.3f}" for stage in STAGES))
    for way, row in found.items():
        print(
            f"{way}: {row['reads_per_call']:.2f} reads a call, client CPU "
            f"{row['client_cpu_ms']:.3f} ms a call, the specialist's own task "
            f"{row['specialist_task_ms']:.3f} ms (mean)"
        )
    print(f"p50 ms over {args.n * args.runs} calls per way, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"breakdown": found}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

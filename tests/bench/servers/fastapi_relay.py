"""The floor of a hop: a bare FastAPI app that answers ``/echo`` by asking another one.

python -m tests.bench.servers.fastapi_relay --port 8002 --upstream http://127.0.0.1:8001/echo

What any Python service pays to put one HTTP call to another process in the middle of its
answer, with nothing of mesh or A2A in it: the body is forwarded to the bare echo
(``fastapi_echo``) over one kept-alive connection by the least a client can do (asyncio streams,
the request written as one block, the answer read by its ``Content-Length``), and the upstream's
answer is returned. ``python -m tests.bench.hops`` serves it beside the echo: ``fastapi-relay`` -
``fastapi`` is the hop's floor on the machine it runs on (two processes, each waking once per
request, and the loopback between them), to read mesh's hop against (docs/performance.md, "Where
the hop's time goes on this host").
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI


class Upstream:
    """One kept-alive HTTP/1.1 connection to the echo; one call at a time (the hop is measured
    at one connection), opened again when the server closed it while idle."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self._lock = asyncio.Lock()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, body: bytes) -> bytes:
        async with self._lock:
            try:
                return await self._once(body)
            except (ConnectionError, asyncio.IncompleteReadError):
                # The server's keep-alive expiry closed the connection between bursts: the
                # request was not taken, so sending it again on a new connection is safe.
                await self.close()
                return await self._once(body)

    async def _once(self, body: bytes) -> bytes:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._streams
        writer.write(self._head + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        status = head.split(b" ", 2)[1]
        answer = await reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"upstream answered {status.decode()}: {answer[:200]!r}")
        return answer

    async def close(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()


def make_app(upstream_url: str) -> FastAPI:
    upstream = Upstream(upstream_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await upstream.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(
            await upstream.call(json.dumps(body, separators=(",", ":")).encode())
        )
        return answer

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the echo's URL, .../echo")
    args = parser.parse_args()
    # As fastapi_echo: uvloop/httptools when installed, no access log.
    uvicorn.run(
        make_app(args.upstream),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()

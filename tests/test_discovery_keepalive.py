"""The heartbeat on a kept-alive connection the server is closing (issue 11: false "no registry"
warnings while the registry was up). ``RegistryBackend`` retries such a request once, at once,
on a fresh connection; the registry keeps idle connections longer than a heartbeat interval."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

from mesh._discovery import Registrar, Registration
from mesh._discovery.registry_client import RegistryBackend
from registry.app import create_app
from registry.metrics import RegistryMetrics
from registry.server import KEEP_ALIVE_S
from registry.settings import RegistrySettings
from tests.raw_http import connection_server, read_request
from tests.registry_support import start_node
from tests.support import eventually, free_port, wait_until_ok

INTERVAL_S = 0.2


@contextlib.asynccontextmanager
async def closing_registry() -> AsyncIterator[tuple[str, list[int]]]:
    """A registry stand-in that answers the FIRST request of each connection (keeping it
    alive) and closes the connection without a word on the next one: the keep-alive race,
    every time. Yields its URL and a list that grows by one per answered request."""
    answered: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = json.dumps({"secret": "s" * 43}).encode()
        writer.write(
            b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        answered.append(1)
        await read_request(reader)  # the request on the reused connection: dropped

    async with connection_server(serve, close_clients=True) as port:
        yield f"http://127.0.0.1:{port}", answered


REG = Registration(instance_id="n-1", agent="echo", url="http://127.0.0.1:9", version="1")


async def test_a_request_on_a_connection_the_server_closed_is_retried_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with closing_registry() as (url, answered):
        backend = RegistryBackend(url)
        registrar = Registrar(backend, REG, interval_s=INTERVAL_S)
        try:
            with caplog.at_level(logging.INFO, logger="mesh._discovery"):
                await registrar.start()
                # The registration, then 5 heartbeats, each meeting a closed pooled connection.
                await eventually(lambda: len(answered) >= 6, within=10, what="6 answers")
                assert registrar.state == "registered"
                await registrar.aclose()
        finally:
            await backend.aclose()
    assert "discovery unavailable" not in caplog.text
    assert "registering again" not in caplog.text


async def test_against_a_real_registry_whose_keep_alive_equals_the_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    card = start_node(tmp_path, None, name="echo")
    with card.proc:
        wait_until_ok(f"{card.url}/health", proc=card.proc)
        port = free_port()
        settings = RegistrySettings(port=port, data_dir=tmp_path / "reg", probe_interval_s=60)
        metrics = RegistryMetrics.create()
        config = uvicorn.Config(
            create_app(settings, metrics=metrics),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            timeout_keep_alive=INTERVAL_S,
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        backend = RegistryBackend(f"http://127.0.0.1:{port}")
        reg = Registration(instance_id="e-1", agent="echo", url=card.url, version="1")
        registrar = Registrar(backend, reg, interval_s=INTERVAL_S)
        beats = metrics.requests.labels(route="/v1/instances/{instance_id}/heartbeat", status="200")
        try:
            await eventually(lambda: server.started, within=10, what="registry started")
            with caplog.at_level(logging.INFO, logger="mesh._discovery"):
                await registrar.start()
                await eventually(lambda: beats._value.get() >= 12, within=15, what="heartbeats")
                assert registrar.state == "registered"
                await registrar.aclose()
            assert "discovery unavailable" not in caplog.text
            assert "registering again" not in caplog.text
        finally:
            await backend.aclose()
            server.should_exit = True
            await serving


def test_the_registry_keeps_idle_connections_longer_than_a_heartbeat_interval() -> None:
    registrar = Registrar(RegistryBackend(), REG)
    assert registrar.interval_s < KEEP_ALIVE_S

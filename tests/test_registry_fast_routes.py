"""The lookup and the heartbeat answered below FastAPI (``registry.fast_routes``) answer exactly as
FastAPI's routes do: two registry apps over ONE store, each served by a real uvicorn on loopback,
one with the fast routes and one without, are sent the same requests (errors included) and must
give the same status, headers and bytes, and count them under the same metric labels.

A heartbeat's answer carries the time it was received, so ``last_heartbeat_at`` is compared as
"a number" there; everything else byte for byte."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from starlette.types import Receive, Scope, Send

from registry.app import create_app
from registry.card import agent_record
from registry.settings import RegistrySettings
from registry.sqlite_store import SqliteRegistryStore
from registry.store import InstanceRecord, secret_hash
from tests.echo_node import build_card
from tests.support import free_port, uvicorn_serving

pytestmark = pytest.mark.integration

TOKEN = "t" * 32
SECRET = "s" * 43
OTHER_SECRET = "o" * 43
WRITE = {"Authorization": f"Bearer {TOKEN}"}
_HOST = re.compile(r"127\.0\.0\.1:[0-9]+")
_HEARTBEAT_AT = re.compile(rb'"last_heartbeat_at":[0-9.e+-]+')


async def _instances_answer(scope: Scope, receive: Receive, send: Send) -> None:
    """What the seeded instances' URLs serve: ``/i/<id>/health`` names ``<id>`` (a passing
    instance, for the two probe rounds the apps run as they start)."""
    if scope["type"] != "http":
        return
    instance_id = scope["path"].removeprefix("/i/").removesuffix("/health")
    body = json.dumps({"status": "ok", "instance_id": instance_id}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _seed(store: SqliteRegistryStore, instances_url: str) -> None:
    now = time.time()
    seeded = [("alpha", "alpha-1", "echo"), ("alpha", "alpha-2", "echo"),
              ("beta", "beta-1", "sum"), ("beta", "beta-gone", "sum")]  # fmt: skip
    for agent, instance_id, skill in seeded:
        # beta-gone's port refuses: critical after the first probe round.
        base = f"http://127.0.0.1:{free_port()}" if instance_id.endswith("gone") else instances_url
        url = f"{base}/i/{instance_id}"
        card = MessageToDict(build_card(agent, url, description="Seeded.", skill_id=skill))
        record = InstanceRecord(instance_id=instance_id, agent=agent, url=url, version="1",
                                status_changed_at=now, last_heartbeat_at=now, registered_at=now)  # fmt: skip
        await store.put(
            agent_record(card, expected_name=agent, now=now),
            record,
            secret_hash=secret_hash(SECRET),
            presented=None,
        )


@dataclass
class Pair:
    fast: httpx.AsyncClient
    fastapi: httpx.AsyncClient


@contextlib.asynccontextmanager
async def _pair(tmp: Path) -> AsyncIterator[Pair]:
    instances_port = free_port()
    store = await SqliteRegistryStore.open(tmp / "registry.db")
    # Probes every hour: nothing changes between the two answers compared but what the test does.
    settings = RegistrySettings(data_dir=tmp, token=TOKEN, probe_interval_s=3600.0,
                                probe_timeout_s=1.0, ttl_s=3600.0)  # fmt: skip
    ports = free_port(), free_port()
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                uvicorn_serving(_instances_answer, instances_port, log_level="warning")
            )
            await _seed(store, f"http://127.0.0.1:{instances_port}")
            clients = []
            for port, fast in zip(ports, (True, False), strict=True):
                app = create_app(settings, store=store, fast_routes=fast)
                await stack.enter_async_context(
                    uvicorn_serving(app, port, log_level="warning", lifespan="on")
                )
                client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)
                clients.append(await stack.enter_async_context(client))
            yield Pair(*clients)
    finally:
        await store.aclose()


def _answer(
    r: httpx.Response, *, heartbeat: bool = False
) -> tuple[int, list[tuple[str, str]], bytes]:
    # A redirect's Location names the port each app listens on.
    headers = [
        (k, _HOST.sub("HOST", v)) for k, v in r.headers.multi_items() if k not in ("date", "server")
    ]
    body = r.content
    if heartbeat and r.status_code == 200:
        # The time's digits vary, and the length with them: checked, then left out.
        assert _HEARTBEAT_AT.search(body), body
        assert ("content-length", str(len(body))) in headers, headers
        headers.remove(("content-length", str(len(body))))
        body = _HEARTBEAT_AT.sub(b'"last_heartbeat_at":0', body)
    return r.status_code, headers, body


LOOKUPS = [
    "/v1/instances",
    "/v1/instances?agent=alpha",
    "/v1/instances?agent=beta&status=any",
    "/v1/instances?status=critical",
    "/v1/instances?status=any&skill=echo",
    "/v1/instances?skill=nope&status=any",
    "/v1/instances?agent=",
    "/v1/instances?agent=beta&agent=alpha",  # the last wins
    "/v1/instances?agent=%61lpha&other=1",
    "/v1/instances?agent=al+pha",
    "/v1/instances?agent=%ff&skill=%C3%A9cho",  # not UTF-8, then UTF-8
    "/v1/instances?agent&status=any",  # a name without '='
    "/v1/instances?&&status=critical&",
    "/v1/instances?status=bogus",  # 422 naming the field
    "/v1/instances?status=",
    "/v1/instances?status=any&status=nope",
    "/v1/instances/",
]


async def test_a_lookup_answers_as_fastapi_does(tmp_path: Path) -> None:
    async with _pair(tmp_path) as pair:
        seen_statuses = set()
        for target in LOOKUPS:
            fast = _answer(await pair.fast.get(target))
            slow = _answer(await pair.fastapi.get(target))
            assert fast == slow, target
            seen_statuses.add(fast[0])
        assert {200, 422} <= seen_statuses
        passing = (await pair.fast.get("/v1/instances?status=any")).json()["instances"]
        assert {(i["instance_id"], i["status"]) for i in passing} == {
            ("alpha-1", "passing"), ("alpha-2", "passing"),
            ("beta-1", "passing"), ("beta-gone", "critical"),
        }  # fmt: skip
        for method in ("HEAD", "POST", "DELETE"):
            fast = _answer(await pair.fast.request(method, "/v1/instances", headers=WRITE))
            slow = _answer(await pair.fastapi.request(method, "/v1/instances", headers=WRITE))
            assert fast == slow, method


def _heartbeats() -> list[tuple[str, str, list[tuple[str, str]], bytes]]:
    secret = ("Mesh-Instance-Secret", SECRET)
    token = ("Authorization", f"Bearer {TOKEN}")
    hb = "/v1/instances/alpha-1/heartbeat"
    return [
        ("owner", hb, [token, secret], b""),
        ("owner, percent-encoded id", "/v1/instances/alpha%2D1/heartbeat", [token, secret], b""),
        ("no secret", hb, [token], b""),
        ("empty secret", hb, [token, ("Mesh-Instance-Secret", "")], b""),
        ("wrong secret", hb, [token, ("Mesh-Instance-Secret", OTHER_SECRET)], b""),
        ("right secret first", hb, [token, secret, ("Mesh-Instance-Secret", OTHER_SECRET)], b""),
        ("wrong secret first", hb, [token, ("Mesh-Instance-Secret", OTHER_SECRET), secret], b""),
        ("unknown instance", "/v1/instances/nobody/heartbeat", [token, secret], b""),
        ("no token", hb, [secret], b""),
        ("wrong token", hb, [("Authorization", "Bearer nope"), secret], b""),
        ("a body, ignored", hb, [token, secret], b'{"instance_id": 7, "not json'),
        ("a body over the cap", hb, [token, secret], b"x" * (64 * 1024 + 1)),
        ("empty id", "/v1/instances//heartbeat", [token, secret], b""),
        ("two segments", "/v1/instances/a/b/heartbeat", [token, secret], b""),
        ("a trailing slash", hb + "/", [token, secret], b""),
    ]


async def test_a_heartbeat_answers_as_fastapi_does(tmp_path: Path) -> None:
    async with _pair(tmp_path) as pair:
        statuses = set()
        for what, target, headers, body in _heartbeats():
            fast = _answer(
                await pair.fast.put(target, headers=headers, content=body), heartbeat=True
            )
            slow = _answer(
                await pair.fastapi.put(target, headers=headers, content=body), heartbeat=True
            )
            assert fast == slow, what
            statuses.add(fast[0])
        assert {200, 401, 403, 404, 413} <= statuses, statuses
        # Both heartbeats reached the store: the lookups agree on the newest time.
        fast_view = (await pair.fast.get("/v1/instances?agent=alpha")).content
        assert fast_view == (await pair.fastapi.get("/v1/instances?agent=alpha")).content


async def test_the_fast_routes_count_requests_as_fastapi_does(tmp_path: Path) -> None:
    async with _pair(tmp_path) as pair:
        for client in (pair.fast, pair.fastapi):
            for target in ("/v1/instances?agent=alpha", "/v1/instances?status=bogus"):
                await client.get(target)
            for _, target, headers, body in _heartbeats():
                await client.put(target, headers=headers, content=body)
        counted = []
        for client in (pair.fast, pair.fastapi):
            text = (await client.get("/metrics")).text
            counted.append(
                sorted(
                    line
                    for line in text.splitlines()
                    if line.startswith("mesh_registry_requests_total{")
                    and ('route="/v1/instances' in line or 'route="gate"' in line)
                )
            )
        assert counted[0] == counted[1]
        assert any(
            'route="/v1/instances/{instance_id}/heartbeat",status="200"' in line
            for line in counted[0]
        ), counted[0]
        assert any('route="/v1/instances",status="200"' in line for line in counted[0])

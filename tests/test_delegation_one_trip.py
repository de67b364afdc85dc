"""A delegation is one HTTP round trip: the streamed events rebuild the finished task exactly
as ``GetTask`` returns it, so ``remote()`` never asks for it afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from agents.credit_bureau import _score
from mesh.a2a.client import A2APeer
from mesh.remote import remote
from mesh.tools import ToolContext
from mesh.tracing import TraceParent
from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bureau(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("bureau")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data"), "--no-register", "--grace", "1"]
    with running(argv, name="bureau", tmp=tmp, health=f"{url}/health", env=clean_env()):
        yield url


async def test_streamed_task_equals_get_task(bureau: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, bureau)
        seen: list[str] = []
        try:
            streamed = await peer.run(
                {"applicant_id": "APP-501", "amount": 250000},
                skill="score",
                metadata={"caller": "one-trip-test"},
                on_task=seen.append,
            )
            assert streamed is not None
            stored = await peer.get_task(streamed.task_id)
        finally:
            await peer.aclose()
    assert seen == [streamed.task_id]
    assert streamed == stored
    assert streamed.state == "completed"
    assert streamed.data is not None
    assert streamed.data["score"] == _score("APP-501")
    assert streamed.metadata["skill"] == "score"


async def test_remote_call_sends_one_request(bureau: str) -> None:
    methods: list[str] = []

    async def log_method(request: httpx.Request) -> None:
        if request.method == "POST":
            methods.append(json.loads(request.content)["method"])

    async with httpx.AsyncClient(
        timeout=30, trust_env=False, event_hooks={"request": [log_method]}
    ) as http:
        rem = remote("credit-bureau", url=bureau)
        rem.bind(http=http)
        ctx = ToolContext(
            agent_name="one-trip-test",
            user_id="u",
            session_id="s",
            invocation_id=TraceParent.new().span_id,
        )
        try:
            tools = {t.name: t for t in await rem.tools(ctx)}
            result = await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-612", "amount": 1000}, ctx
            )
        finally:
            await rem.aclose()
    assert result["score"] == _score("APP-612")
    assert methods == ["SendStreamingMessage"]

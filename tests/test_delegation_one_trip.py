"""A delegation is one HTTP round trip: a blocking ``SendMessage`` whose JSON answer
(``A2APeer.call``, read without the SDK's protobuf types) is the finished task exactly as
``GetTask`` returns it, so ``remote()`` never asks for it afterwards. The streamed events
(``A2APeer.run``) rebuild the same task."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from agents.credit_bureau import _score
from mesh.a2a.client import A2APeer
from mesh.errors import RemoteError
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
    assert methods == ["SendMessage"]


async def test_lean_call_equals_get_task_and_speaks_a2a_1_0(bureau: str) -> None:
    sent: list[httpx.Request] = []

    async def keep(request: httpx.Request) -> None:
        if request.method == "POST":
            sent.append(request)

    async with httpx.AsyncClient(
        timeout=30,
        trust_env=False,
        headers={"X-Client": "kept"},
        event_hooks={"request": [keep]},
    ) as http:
        peer = A2APeer(http, bureau)
        try:
            called = await peer.call(
                {"applicant_id": "APP-501", "amount": 250000},
                skill="score",
                metadata={"caller": "one-trip-test"},
            )
            stored = await peer.get_task(called.task_id)
            sdk = await peer.send(
                {"applicant_id": "APP-612", "amount": 1000},
                skill="score",
                metadata={"caller": "one-trip-test"},
            )
            rejected = await peer.call({"applicant_id": "APP-501"}, skill="score")
        finally:
            await peer.aclose()
    assert called == stored
    assert called.state == "completed"
    assert called.data is not None
    assert called.data["score"] == _score("APP-501")
    assert isinstance(called.data["score"], int)
    assert called.metadata["skill"] == "score"
    assert sdk.data is not None
    assert sdk.data["score"] == _score("APP-612")
    assert rejected.state == "rejected"
    assert rejected.error is not None
    assert rejected.error["reason"] == "rejected"
    assert "amount" in rejected.error["message"]
    lean, _get, via_sdk, _rejected = sent
    # The same method, fields and headers as the SDK's own JSON-RPC transport sends.
    for request in (lean, via_sdk):
        assert request.headers["A2A-Version"] == "1.0"
        assert request.headers["X-Client"] == "kept"
        assert request.headers["Content-Type"] == "application/json"
    lean_body, sdk_body = json.loads(lean.content), json.loads(via_sdk.content)
    assert lean_body["method"] == sdk_body["method"] == "SendMessage"
    assert set(lean_body) == set(sdk_body)
    assert set(lean_body["params"]) == set(sdk_body["params"])
    assert set(lean_body["params"]["message"]) == set(sdk_body["params"]["message"])
    assert lean_body["params"]["message"]["parts"][0]["mediaType"] == "application/json"
    assert lean_body["params"]["configuration"] == sdk_body["params"]["configuration"]


async def test_lean_call_translates_errors_like_the_sdk_client(bureau: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, bureau)
        dead = A2APeer(http, f"http://127.0.0.1:{free_port()}")
        try:
            # A text part where the score skill wants JSON: the node rejects the task.
            text = await peer.call("hello", skill="score")
            with pytest.raises(RemoteError) as down:
                await dead.call({"applicant_id": "APP-501", "amount": 1}, skill="score")
            with pytest.raises(RemoteError) as bad_json:
                await peer.call({"when": object()}, skill="score")
        finally:
            await peer.aclose()
    assert text.state in {"rejected", "failed"}
    assert (down.value.reason, down.value.skill) == ("unavailable", "score")
    assert bad_json.value.reason == "rejected"

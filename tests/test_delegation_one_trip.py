"""A delegation is one HTTP round trip: a blocking ``SendMessage`` whose JSON answer
(``A2APeer.send``, read without the SDK's protobuf types) is the finished task exactly as
``GetTask`` returns it, so ``remote()`` never asks for it afterwards; it is the request the
a2a-sdk's own client sends. ``A2APeer.stream`` gives the events of the same task."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers import new_data_part
from a2a.types import (
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from google.protobuf.struct_pb2 import Struct

from mesh._a2a.client import A2APeer
from mesh._errors import RemoteError
from mesh._remote import remote
from mesh._tools import ToolContext
from mesh._tracing import TraceParent
from tests.support import BUREAU_SCORES, clean_env, free_port, running

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


async def test_streamed_events_say_what_get_task_says(bureau: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, bureau)
        try:
            updates = [
                u
                async for u in peer.stream(
                    {"applicant_id": "APP-501", "amount": 250000},
                    skill="score",
                    metadata={"caller": "one-trip-test"},
                )
            ]
            stored = await peer.get_task(updates[0].task_id)
        finally:
            await peer.aclose()
    assert updates[0].kind == "task"
    assert {u.task_id for u in updates} == {stored.task_id}
    assert [u.data for u in updates if u.kind == "artifact"] == [stored.data]
    assert [u.state for u in updates if u.kind == "status"][-1] == stored.state == "completed"
    assert stored.data is not None
    assert stored.data["score"] == BUREAU_SCORES["APP-501"]
    assert stored.metadata["skill"] == "score"


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
    assert result["score"] == BUREAU_SCORES["APP-612"]
    assert methods == ["SendMessage"]


async def test_send_equals_get_task_and_is_what_the_sdk_client_sends(bureau: str) -> None:
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
        sdk = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(
            await peer.card()
        )
        try:
            called = await peer.send(
                {"applicant_id": "APP-501", "amount": 250000},
                skill="score",
                metadata={"caller": "one-trip-test"},
            )
            stored = await peer.get_task(called.task_id)
            metadata = Struct()
            metadata.update({"caller": "one-trip-test", "skill": "score"})
            request = SendMessageRequest(
                message=Message(
                    role=Role.ROLE_USER,
                    message_id=uuid.uuid4().hex,
                    parts=[
                        new_data_part(
                            {"applicant_id": "APP-612", "amount": 1000},
                            media_type="application/json",
                        )
                    ],
                    metadata=metadata,
                ),
                configuration=SendMessageConfiguration(history_length=0),
            )
            answers = [a async for a in sdk.send_message(request)]
            rejected = await peer.send({"applicant_id": "APP-501"}, skill="score")
        finally:
            await sdk.close()
            await peer.aclose()
    assert called == stored
    assert called.state == "completed"
    assert called.data is not None
    assert called.data["score"] == BUREAU_SCORES["APP-501"]
    assert isinstance(called.data["score"], int)
    assert called.metadata["skill"] == "score"
    assert answers[-1].task.status.state == TaskState.TASK_STATE_COMPLETED
    assert rejected.state == "rejected"
    assert rejected.error is not None
    assert rejected.error["reason"] == "rejected"
    assert "amount" in rejected.error["message"]
    lean, _get, via_sdk, _rejected = sent
    # The same method, fields and headers as the SDK's own JSON-RPC transport sends.
    for one in (lean, via_sdk):
        assert one.headers["A2A-Version"] == "1.0"
        assert one.headers["X-Client"] == "kept"
        assert one.headers["Content-Type"] == "application/json"
    lean_body, sdk_body = json.loads(lean.content), json.loads(via_sdk.content)
    assert lean_body["method"] == sdk_body["method"] == "SendMessage"
    assert set(lean_body) == set(sdk_body)
    assert set(lean_body["params"]) == set(sdk_body["params"])
    assert set(lean_body["params"]["message"]) == set(sdk_body["params"]["message"])
    assert lean_body["params"]["message"]["parts"][0]["mediaType"] == "application/json"
    assert lean_body["params"]["configuration"] == sdk_body["params"]["configuration"]


async def test_send_translates_errors_like_the_sdk_client(bureau: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, bureau)
        dead = A2APeer(http, f"http://127.0.0.1:{free_port()}")
        try:
            # A text part where the score skill wants JSON: the node rejects the task.
            text = await peer.send("hello", skill="score")
            with pytest.raises(RemoteError) as down:
                await dead.send({"applicant_id": "APP-501", "amount": 1}, skill="score")
            with pytest.raises(RemoteError) as bad_json:
                await peer.send({"when": object()}, skill="score")
        finally:
            await peer.aclose()
    assert text.state in {"rejected", "failed"}
    assert (down.value.reason, down.value.skill) == ("unavailable", "score")
    assert bad_json.value.reason == "rejected"

"""Live progress across hops: three real ``mesh serve`` nodes of tests.stream_agents (top and
middle coordinators on the scripted model, a bottom specialist whose skill reports progress
through ``ctx.progress``), driven by the real a2a-sdk client.

Streamed at the top, every update of the bottom reaches the top in order, as WORKING status
updates of the top's task tagged ``urn:mesh:tasks:v1`` ``relay`` with the path it came
through; the child's artifacts stay the child's. Not streamed, nothing changes: one blocking
SendMessage per hop (counted at the nodes). A child that stops to ask ends its stream, and its
question waits at the top as on the blocking path. ``mesh call --stream`` and ``mesh chat`` show the
relayed lines indented per hop."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_text_part
from a2a.types import (
    GetTaskRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT, clean_env, free_port, running

pytestmark = pytest.mark.integration

EXT = "urn:mesh:tasks:v1"


@dataclass
class Chain:
    top: str
    middle: str
    bottom: str


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    tmp = tmp_path_factory.mktemp("stream")
    urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("bottom", "middle", "top")}
    env = clean_env(STREAM_TEST_BOTTOM=urls["bottom"], STREAM_TEST_MIDDLE=urls["middle"])
    with contextlib.ExitStack() as stack:
        for name in ("bottom", "middle", "top"):
            port = urls[name].rsplit(":", 1)[1]
            argv = ["mesh", "serve", f"tests.stream_agents:{name}", "--port", port]
            argv += ["--data-dir", str(tmp / name), "--no-register", "--grace", "1"]
            stack.enter_context(
                running(argv, name=name, tmp=tmp, env=env, health=f"{urls[name]}/health")
            )
        yield Chain(**urls)


async def client_for(http: httpx.AsyncClient, url: str, *, streaming: bool) -> Client:
    card = await A2ACardResolver(http, url).get_agent_card()
    return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)


def user_text(text: str) -> Message:
    return Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[new_text_part(text)])


async def stream_events(http: httpx.AsyncClient, url: str, text: str) -> list[dict[str, Any]]:
    """Every event of a SendStreamingMessage of ``text``, in their JSON form, in order."""
    client = await client_for(http, url, streaming=True)
    request = SendMessageRequest(message=user_text(text))
    events = [MessageToDict(e) async for e in client.send_message(request)]
    await client.close()
    return events


def relayed(events: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, Any], str]]:
    """(the agents of ``from``, the relay tag, the text) of each relayed status update."""
    found = []
    for event in events:
        status = event.get("statusUpdate", {}).get("status", {})
        said = status.get("message", {})
        relay = said.get("metadata", {}).get(EXT, {}).get("relay")
        if relay is None:
            continue
        assert status["state"] == "TASK_STATE_WORKING", event
        text = "".join(p.get("text", "") for p in said.get("parts", []))
        found.append(([hop["agent"] for hop in relay["from"]], relay, text))
    return found


def requests_by_method(url: str) -> dict[str, float]:
    """The node's JSON-RPC requests so far, by method (its /metrics)."""
    counts: dict[str, float] = {}
    body = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "mesh_requests_total":
                method = sample.labels["method"]
                counts[method] = counts.get(method, 0.0) + sample.value
    return counts


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {m: after[m] - before.get(m, 0.0) for m in after if after[m] != before.get(m, 0.0)}


async def test_bottom_progress_reaches_the_top_in_order(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    events = await stream_events(http, chain.top, "report alpha")

    final = events[-1]["statusUpdate"]["status"]
    assert final["state"] == "TASK_STATE_COMPLETED", events[-1]
    hops = relayed(events)
    from_bottom = [
        (tag, text) for path, tag, text in hops if path == ["stream-middle", "stream-bottom"]
    ]
    status_texts = [text for tag, text in from_bottom if tag["kind"] == "status"]
    assert status_texts == [
        "running skill 'report'",
        "alpha: step 1 of 3",
        "alpha: step 2 of 3",
        "alpha: step 3 of 3",
    ]
    for tag, _ in from_bottom:
        assert all(hop["task"] for hop in tag["from"]), tag
        if tag["kind"] == "status":
            assert tag["state"] == "TASK_STATE_WORKING", tag
            assert tag["partial"] is False, tag
    # The bottom's result came up as a relayed artifact chunk, after its progress ...
    artifacts = [tag for tag, _ in from_bottom if tag["kind"] == "artifact"]
    assert len(artifacts) == 1, from_bottom
    assert artifacts[0]["lastChunk"] is True, from_bottom
    assert from_bottom[-1][0]["kind"] == "artifact"
    # ... and the hops name real tasks: the bottom's completed with that result.
    bottom_task = from_bottom[0][0]["from"][1]["task"]
    bottom = await client_for(http, chain.bottom, streaming=False)
    task = await bottom.get_task(GetTaskRequest(id=bottom_task))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    await bottom.close()

    # The middle's own progress is one hop down: its tool call, before the bottom's updates.
    from_middle = [text for path, tag, text in hops if path == ["stream-middle"]]
    assert "calling stream_bottom_report" in from_middle
    first_middle = next(i for i, h in enumerate(hops) if h[2] == "calling stream_bottom_report")
    first_bottom = next(i for i, h in enumerate(hops) if h[2] == "alpha: step 1 of 3")
    assert first_middle < first_bottom
    # The middle's answer streamed as partial text: relayed as such (coalesced), all of it.
    partial = "".join(
        text for path, tag, text in hops if path == ["stream-middle"] and tag.get("partial")
    )
    assert partial == "middle has the alpha report (3 steps)"

    # The child's artifacts never become the top's: its one artifact is its own answer.
    top_task_id = events[0]["task"]["id"]
    top = await client_for(http, chain.top, streaming=False)
    stored = MessageToDict(await top.get_task(GetTaskRequest(id=top_task_id)))
    await top.close()
    assert len(stored["artifacts"]) == 1, stored["artifacts"]
    answer = stored["artifacts"][0]["parts"][0]["text"]
    assert answer == "top heard: middle has the alpha report (3 steps)"


async def test_not_streamed_is_one_blocking_send_per_hop(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    before = {name: requests_by_method(getattr(chain, name)) for name in ("middle", "bottom")}
    top = await client_for(http, chain.top, streaming=False)
    answers = [
        a
        async for a in top.send_message(
            SendMessageRequest(
                message=user_text("report beta"), configuration=SendMessageConfiguration()
            )
        )
    ]
    await top.close()
    task = answers[0].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "top heard: middle has the beta report (3 steps)"
    for name in ("middle", "bottom"):
        after = requests_by_method(getattr(chain, name))
        assert grew(before[name], after) == {"SendMessage": 1.0}, (name, before, after)


async def test_streamed_hop_costs_a_stream_and_a_get_task(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    before = requests_by_method(chain.bottom)
    await stream_events(http, chain.top, "report gamma")
    assert grew(before, requests_by_method(chain.bottom)) == {
        "SendStreamingMessage": 1.0,
        "GetTask": 1.0,
    }


async def test_a_subscription_opened_mid_turn_streams_the_next_delegation(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    sender = await client_for(http, chain.top, streaming=False)
    config = SendMessageConfiguration(return_immediately=True)
    sent = [
        a
        async for a in sender.send_message(
            SendMessageRequest(message=user_text("slow eta"), configuration=config)
        )
    ]
    await sender.close()
    task_id = sent[0].task.id
    top = await client_for(http, chain.top, streaming=True)
    # The first delegation (the pause) went out before anyone followed: blocking. The second
    # starts after this subscription opened, so it is streamed and relayed.
    events = [MessageToDict(e) async for e in top.subscribe(SubscribeToTaskRequest(id=task_id))]
    await top.close()
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    from_bottom = [t for p, _, t in relayed(events) if p == ["stream-middle", "stream-bottom"]]
    assert from_bottom[1:4] == ["eta: step 1 of 3", "eta: step 2 of 3", "eta: step 3 of 3"]
    assert not [t for t in from_bottom if "pause" in t], from_bottom


async def test_a_child_that_asks_ends_its_stream_with_the_blocking_result(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    events = await stream_events(http, chain.top, "confirm delta")
    # The child's question is relayed up (issue 13 item 3): the top waits, streamed or not.
    last = events[-1]["statusUpdate"]["status"]
    assert last["state"] == "TASK_STATE_INPUT_REQUIRED"
    checking = [t for p, _, t in relayed(events) if p == ["stream-middle", "stream-bottom"]]
    assert "delta: checking" in checking
    streamed_question = [p["text"] for p in last["message"]["parts"] if "text" in p]

    top = await client_for(http, chain.top, streaming=False)
    answers = [
        a async for a in top.send_message(SendMessageRequest(message=user_text("confirm delta")))
    ]
    await top.close()
    blocking = answers[0].task
    assert blocking.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    blocking_question = [p.text for p in blocking.status.message.parts if p.HasField("text")]
    assert streamed_question == blocking_question == ["Write the report on delta?"]


def stream_answer(events: list[dict[str, Any]]) -> str:
    """The text of the artifact the streamed task published."""
    texts = [
        p.get("text", "")
        for e in events
        if "artifactUpdate" in e
        for p in e["artifactUpdate"]["artifact"]["parts"]
    ]
    return "".join(texts)


def mesh_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
    )


def lines_in_order(output: str, expected: list[str]) -> None:
    lines = output.splitlines()
    at = 0
    for want in expected:
        assert want in lines[at:], f"{want!r} not after line {at} in:\n{output}"
        at = lines.index(want, at) + 1


def test_mesh_call_stream_indents_per_hop(chain: Chain) -> None:
    r = mesh_cli("call", chain.top, "--text", "report epsilon", "--stream")
    assert r.returncode == 0, r.stderr
    lines_in_order(
        r.stderr,
        [
            "[working] calling ask_stream_middle",
            "  stream-middle: [working] calling stream_bottom_report",
            "    stream-bottom: [working] epsilon: step 1 of 3",
            "    stream-bottom: [working] epsilon: step 2 of 3",
            "    stream-bottom: [working] epsilon: step 3 of 3",
        ],
    )
    assert "top heard: middle has the epsilon report (3 steps)" in r.stdout
    # No line per chunk of the middle's answer (relayed partial text is not shown): one line,
    # its result, relayed as an artifact.
    said = [line for line in r.stderr.splitlines() if "middle has the epsilon" in line]
    assert said == ["  stream-middle: artifact: middle has the epsilon report (3 steps)"], r.stderr


def test_mesh_chat_indents_per_hop(chain: Chain) -> None:
    r = mesh_cli("chat", chain.top, "-m", "report zeta")
    assert r.returncode == 0, r.stdout + r.stderr
    lines_in_order(
        r.stdout,
        [
            "  … calling ask_stream_middle",
            "    … stream-middle: calling stream_bottom_report",
            "      … stream-bottom: zeta: step 1 of 3",
            "      … stream-bottom: zeta: step 3 of 3",
            "agent> top heard: middle has the zeta report (3 steps)",
        ],
    )

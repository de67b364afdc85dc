"""The output side of A2A 1.0 on real nodes (issue 14 items 3 and 4), driven by the a2a-sdk
client: named artifacts with file and data parts from a typed skill and from an LLM agent's
tool, a typed result's data part with its JSON text, model text streamed as artifact chunks,
a direct ``Message`` reply, -32005 for a part of a type the skill does not take, and the
status message of a REJECTED task. Agents: tests/artifact_agents.py."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from google.protobuf.json_format import MessageToDict

from mesh import A2APeer, File
from tests.artifact_agents import PDF_URL, PNG
from tests.support import ROOT, clean_env, free_port, running

pytestmark = pytest.mark.integration


@dataclass
class Nodes:
    desk: str
    chat: str
    coord: str


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    tmp = tmp_path_factory.mktemp("artifacts")
    urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("desk", "chat", "coord")}
    env = clean_env(ARTIFACT_TEST_DESK=urls["desk"])
    with contextlib.ExitStack() as stack:
        for name, url in urls.items():
            argv = ["mesh", "serve", f"tests.artifact_agents:{name}", "--port", url.rsplit(":")[2]]
            argv += ["--data-dir", str(tmp / name), "--no-register", "--grace", "1"]
            stack.enter_context(running(argv, name=name, tmp=tmp, env=env, health=f"{url}/health"))
        yield Nodes(**urls)


async def client_for(
    http: httpx.AsyncClient, url: str, *, streaming: bool, binding: str = "JSONRPC"
) -> Client:
    card = await A2ACardResolver(http, url).get_agent_card()
    config = ClientConfig(
        streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding]
    )
    return ClientFactory(config).create(card)


def message(*parts: Part, skill: str | None = None) -> Message:
    sent = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=list(parts))
    if skill is not None:
        sent.metadata.update({"skill": skill})
    return sent


async def send(
    http: httpx.AsyncClient,
    url: str,
    sent: Message,
    *,
    streaming: bool = False,
    binding: str = "JSONRPC",
) -> list[dict[str, Any]]:
    """Every answer (blocking: one) of a send, in its JSON form, over ``binding``."""
    client = await client_for(http, url, streaming=streaming, binding=binding)
    try:
        return [
            MessageToDict(a) async for a in client.send_message(SendMessageRequest(message=sent))
        ]
    finally:
        await client.close()


CHART = {"title": "q3", "points": [1.5, 2.5, 4.0]}
#: Both bindings a node serves (JSON-RPC, HTTP+JSON): the same handler checks both.
BINDINGS = ["JSONRPC", "HTTP+JSON"]


async def test_a_typed_skill_attaches_files_and_data_next_to_its_result(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    (answer,) = await send(http, nodes.desk, message(new_data_part(CHART), skill="chart"))
    task = answer["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    by_name = {a["name"]: a for a in task["artifacts"]}
    assert list(by_name) == ["chart.png", "print", "range", "chart"], list(by_name)
    # The result: its data part and the same JSON as text (a text-only client reads that).
    data, text = by_name["chart"]["parts"]
    assert data["mediaType"] == "application/json"
    assert data["data"] == {"title": "q3", "count": 3.0, "total": 8.0}
    assert text["mediaType"] == "text/plain"
    assert json.loads(text["text"]) == {"title": "q3", "count": 3, "total": 8.0}
    # A file by value (bytes, base64 on the wire), a file by URL, data with a text part.
    (png,) = by_name["chart.png"]["parts"]
    assert (png["mediaType"], png["filename"]) == ("image/png", "chart.png")
    assert base64.b64decode(png["raw"]) == PNG
    (pdf,) = by_name["print"]["parts"]
    assert (pdf["url"], pdf["mediaType"], pdf["filename"]) == (
        PDF_URL,
        "application/pdf",
        "chart.pdf",
    )
    assert [list(p) for p in by_name["range"]["parts"]] == [
        ["data", "mediaType"],
        ["text", "mediaType"],
    ]

    # A mesh caller reads the result as before, and the attachments as mesh.File / data.
    peer = A2APeer(http, nodes.desk)
    result = await peer.send(CHART, skill="chart")
    await peer.aclose()
    assert result.ok
    assert result.data == {"title": "q3", "count": 3, "total": 8.0}
    assert json.loads(result.text) == result.data
    files = [f for a in result.artifacts for f in a.files]
    assert files == [
        File(PNG, media_type="image/png", name="chart.png"),
        File(url=PDF_URL, media_type="application/pdf", name="chart.pdf"),
    ]
    (ranged,) = [a for a in result.artifacts if a.name == "range"]
    assert ranged.data == {"max": 4.0, "min": 1.5}
    assert ranged.text == "min and max"


async def test_a_streamed_typed_send_gets_every_artifact(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    events = await send(
        http, nodes.desk, message(new_data_part(CHART), skill="chart"), streaming=True
    )
    updates = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert [u["artifact"]["name"] for u in updates] == ["chart.png", "print", "range", "chart"]
    assert all(u.get("lastChunk") for u in updates)
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_an_llm_agents_tool_attaches_a_file_and_the_answer_carries_data(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    (answer,) = await send(http, nodes.chat, message(new_text_part("export eur")))
    task = answer["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    by_name = {a["name"]: a for a in task["artifacts"]}
    assert set(by_name) == {"chat", "rates.csv", "rates"}
    assert by_name["chat"]["parts"] == [
        {"text": "Exported 2 rates against EUR.", "mediaType": "text/plain"}
    ]
    (csv,) = by_name["rates.csv"]["parts"]
    assert csv["mediaType"] == "text/csv"
    assert base64.b64decode(csv["raw"]).decode().splitlines() == ["EUR,USD,1.08", "EUR,GBP,0.85"]
    assert by_name["rates"]["parts"][0]["data"] == {"USD": 1.08, "GBP": 0.85}

    peer = A2APeer(http, nodes.chat)
    result = await peer.send("export gbp")
    await peer.aclose()
    # The answer's text is the answer's alone: the attachments are read apart.
    assert result.text == "Exported 2 rates against GBP."
    assert [a.name for a in result.artifacts if a.name != "chat"] == ["rates.csv", "rates"]


async def test_model_text_streams_as_chunks_of_one_artifact(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    events = await send(http, nodes.chat, message(new_text_part("export chf")), streaming=True)
    statuses = [e["statusUpdate"]["status"] for e in events if "statusUpdate" in e]
    # Progress stays a status (the tool call); the model's text is no WORKING message any more.
    said = [m.get("metadata", {}) for s in statuses if (m := s.get("message")) is not None]
    assert not [m for m in said if m.get("partial")], said
    answer = [
        e["artifactUpdate"]
        for e in events
        if "artifactUpdate" in e and e["artifactUpdate"]["artifact"]["name"] == "chat"
    ]
    *chunks, last = answer
    assert len(chunks) >= 2, answer
    assert [bool(c.get("append")) for c in chunks] == [False] + [True] * (len(chunks) - 1)
    assert not any(c.get("lastChunk") for c in chunks)
    streamed = "".join(p["text"] for c in chunks for p in c["artifact"]["parts"])
    assert streamed == "Exported 2 rates against CHF."
    # The last chunk replaces the artifact whole: what was streamed, as one part.
    assert last.get("lastChunk") is True
    assert not last.get("append")
    assert last["artifact"]["artifactId"] == chunks[0]["artifact"]["artifactId"]
    assert last["artifact"]["parts"] == [{"text": streamed, "mediaType": "text/plain"}]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def mesh_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
    )


def test_mesh_call_stream_prints_the_streamed_text_once(nodes: Nodes) -> None:
    r = mesh_cli("call", nodes.chat, "--text", "export usd", "--stream")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Exported 2 rates against USD.") == 1, r.stdout
    assert "[working] calling export_rates" in r.stderr


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_message_skill_replies_with_a_message_and_keeps_no_task(
    nodes: Nodes, http: httpx.AsyncClient, binding: str
) -> None:
    sent = message(new_data_part({"a": 2, "b": 3}), skill="add")
    (blocking,) = await send(http, nodes.desk, sent, binding=binding)
    assert set(blocking) == {"message"}, blocking
    reply = blocking["message"]
    assert reply["role"] == "ROLE_AGENT"
    assert reply["parts"][0]["data"] == {"sum": 5.0}
    assert json.loads(reply["parts"][1]["text"]) == {"sum": 5}
    streamed = await send(
        http,
        nodes.desk,
        message(new_data_part({"a": 4, "b": 5}), skill="add"),
        streaming=True,
        binding=binding,
    )
    assert [list(e) for e in streamed] == [["message"]], streamed
    assert streamed[0]["message"]["parts"][0]["data"] == {"sum": 9.0}
    client = await client_for(http, nodes.desk, streaming=False)
    listed = await client.list_tasks(ListTasksRequest(context_id=reply["contextId"]))
    await client.close()
    assert list(listed.tasks) == []

    # Invalid input has no task to be rejected in: the JSON-RPC error names the field.
    with pytest.raises(InvalidParamsError, match="field 'b'"):
        await send(http, nodes.desk, message(new_data_part({"a": 1}), skill="add"), binding=binding)
    # Nor has a rejection by the skill, or its failure (no task is left behind either).
    negative = message(new_data_part({"a": -1, "b": 1}), skill="add")
    with pytest.raises(InvalidParamsError, match="must not be negative"):
        await send(http, nodes.desk, negative, binding=binding)
    broken = message(new_data_part({"a": 13, "b": 1}), skill="add")
    broken.context_id = uuid.uuid4().hex
    with pytest.raises(InternalError, match="skill 'add' failed with an internal error"):
        await send(http, nodes.desk, broken, binding=binding)
    client = await client_for(http, nodes.desk, streaming=False)
    listed = await client.list_tasks(ListTasksRequest(context_id=broken.context_id))
    await client.close()
    assert list(listed.tasks) == []

    peer = A2APeer(http, nodes.desk)
    result = await peer.send({"a": 20, "b": 22}, skill="add")
    await peer.aclose()
    assert result.ok
    assert result.data == {"sum": 42}
    assert result.task_id == ""
    for stream in ([], ["--stream"]):
        r = mesh_cli("call", nodes.desk, "--skill", "add", "--json", '{"a": 1, "b": 2}', *stream)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"sum": 3}


def png_part(name: str, data: bytes = PNG, media_type: str = "image/png") -> Part:
    return Part(raw=data, media_type=media_type, filename=name)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_part_of_a_type_the_skill_does_not_take_is_32005(
    nodes: Nodes, http: httpx.AsyncClient, binding: str
) -> None:
    label = new_data_part({"label": "scan"})
    (ok,) = await send(http, nodes.desk, message(label, png_part("a.png"), skill="measure"))
    measured = ok["task"]["artifacts"][0]["parts"][0]["data"]
    assert measured == {"label": "scan", "files": ["a.png"], "sizes": [float(len(PNG))]}

    jpeg = png_part("b.jpg", b"\xff\xd8\xff", "image/jpeg")
    for streaming in (False, True):
        with pytest.raises(ContentTypeNotSupportedError, match="image/jpeg"):
            await send(
                http,
                nodes.desk,
                message(label, jpeg, skill="measure"),
                streaming=streaming,
                binding=binding,
            )
    # A typed skill that declares no files takes none; a chat agent takes no data part.
    with pytest.raises(ContentTypeNotSupportedError, match="skill 'chart'"):
        await send(
            http, nodes.desk, message(new_data_part(CHART), png_part("c.png"), skill="chart")
        )
    with pytest.raises(ContentTypeNotSupportedError, match="application/json"):
        await send(http, nodes.chat, message(new_data_part({"currency": "eur"})))

    card = (await http.get(nodes.desk + "/.well-known/agent-card.json")).json()
    modes = {s["id"]: s["inputModes"] for s in card["skills"]}
    assert modes["measure"] == ["application/json", "text/plain", "image/png"]
    assert modes["chart"] == ["application/json", "text/plain"]


async def test_rejected_and_failed_tasks_carry_an_agent_status_message(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    (answer,) = await send(http, nodes.desk, message(new_data_part({"title": "x"}), skill="chart"))
    status = answer["task"]["status"]
    assert status["state"] == "TASK_STATE_REJECTED"
    said = status["message"]
    assert said["role"] == "ROLE_AGENT"
    assert "points" in said["parts"][0]["text"]
    (failed,) = await send(
        http, nodes.desk, message(new_data_part({"title": "x", "points": []}), skill="chart")
    )
    status = failed["task"]["status"]
    assert status["state"] == "TASK_STATE_FAILED"
    assert status["message"]["role"] == "ROLE_AGENT"
    assert "internal error" in status["message"]["parts"][0]["text"]
    # No attachment of a failed run is published.
    assert "artifacts" not in failed["task"]


def test_mesh_call_and_mesh_chat_list_the_attachments(nodes: Nodes) -> None:
    r = mesh_cli("call", nodes.desk, "--skill", "chart", "--json", json.dumps(CHART))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"title": "q3", "count": 3, "total": 8.0}
    attached = [line for line in r.stderr.splitlines() if line.startswith("attached: ")]
    assert attached == [
        f"attached: chart.png (image/png, {len(PNG)} bytes)",
        f"attached: print (application/pdf, {PDF_URL})",
        'attached: range (data {"max": 4.0, "min": 1.5}; text "min and max")',
    ]
    r = mesh_cli("chat", nodes.chat, "-m", "export eur")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "agent> Exported 2 rates against EUR." in lines, r.stdout
    assert "  attached: rates.csv (text/csv, 25 bytes)" in lines, r.stdout
    assert '  attached: rates (data {"GBP": 0.85, "USD": 1.08})' in lines, r.stdout


async def test_the_files_are_there_again_when_an_answer_resumes_the_skill(
    nodes: Nodes, http: httpx.AsyncClient
) -> None:
    sent = message(new_data_part({"label": "paid"}), png_part("scan.png"), skill="stamp")
    (waiting,) = await send(http, nodes.desk, sent)
    task = waiting["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task["status"]
    assert task["status"]["message"]["parts"][0]["text"] == "Stamp 1 file(s) as paid?"
    answer = message(new_text_part("yes"))
    answer.task_id, answer.context_id = task["id"], task["contextId"]
    (done,) = await send(http, nodes.desk, answer)
    assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED", done["task"]["status"]
    stamped = done["task"]["artifacts"][0]["parts"][0]["data"]
    assert stamped == {"label": "paid", "files": ["scan.png"], "sizes": [float(len(PNG))]}


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_coordinator_delegates_to_a_skill_that_replies_with_a_message(
    nodes: Nodes, http: httpx.AsyncClient, streaming: bool
) -> None:
    # Streamed at the top, the delegation streams too: the child's one event is its message.
    events = await send(
        http, nodes.coord, message(new_text_part("add 19 and 23")), streaming=streaming
    )
    final = events[-1]["task"] if "task" in events[-1] else events[-1]["statusUpdate"]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED", final["status"]
    peer = A2APeer(http, nodes.coord)
    task = await peer.get_task(final.get("id") or final["taskId"])
    await peer.aclose()
    assert task.text == "the desk says 42"

"""A direct-reply skill (``@skill(reply="message")``) that raises: the answer is -32603 saying
what failed (REST: 500 INTERNAL), and the node's log carries the failure once, ours: one
ERROR record with the traceback, as a task skill's failure (the SDK's producer, consumer and
route logged the same exception twice more, with tracebacks, and a line, on a streamed send or
with the fast path off, and saved a FAILED task for a reply that keeps none).

Real nodes (``mesh serve`` of this module's agent, fast path on and off), plain httpx, both
bindings, blocking and streamed; the log read from the node's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from mesh import Agent, SkillInputError, skill
from tests.support import Proc, clean_env, eventually, free_port, running


class Pair(BaseModel):
    a: int
    b: int


class Sum(BaseModel):
    sum: int


@skill(reply="message")
async def direct_add(req: Pair) -> Sum:
    """Add two numbers at once (13 breaks it, negatives are refused, 99 takes its time)."""
    if req.a < 0:
        raise SkillInputError("field 'a' must not be negative")
    if req.a == 13:
        raise RuntimeError("unlucky direct")
    if req.a == 99:
        await asyncio.sleep(30)
    return Sum(sum=req.a + req.b)


@skill
def task_add(req: Pair) -> Sum:
    """Add two numbers in a task (13 breaks it)."""
    if req.a == 13:
        raise RuntimeError("unlucky task")
    return Sum(sum=req.a + req.b)


agent = Agent(name="direct-fail", description="Adds.", skills=[direct_add, task_add])

H = {"A2A-Version": "1.0"}
REST = "/a2a/rest"
FAILED_TEXT = "skill 'direct_add' failed with an internal error (details in the node log)"
ERROR_INFO = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "INTERNAL_ERROR",
    "domain": "a2a-protocol.org",
    "metadata": {},
}
# The answers as d67a51c gave them, byte for byte (the node's JSON, not re-encoded).
RPC_FAILED = (
    '{"error":{"code":-32603,"message":"' + FAILED_TEXT + '","data":[{"@type":"type.googleapis'
    '.com/google.rpc.ErrorInfo","reason":"INTERNAL_ERROR","domain":"a2a-protocol.org",'
    '"metadata":{}}]},"id":7,"jsonrpc":"2.0"}'
)
REST_FAILED = (
    '{"error":{"code":500,"status":"INTERNAL","message":"' + FAILED_TEXT + '","details":[{"@ty'
    'pe":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INTERNAL_ERROR","domain":"a2a-p'
    'rotocol.org","metadata":{}}]}}'
)
INVALID_TEXT = (
    "invalid input for skill 'direct_add': field 'a': Input should be a valid integer, unable "
    'to parse string as an integer (expected integer), got \\"x\\"'
)
RPC_INVALID = (
    '{"error":{"code":-32602,"message":"' + INVALID_TEXT + '","data":[{"@type":"type.googleap'
    'is.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS","domain":"a2a-protocol.org","meta'
    'data":{}}]},"id":7,"jsonrpc":"2.0"}'
)
REST_INVALID = (
    '{"error":{"code":400,"status":"INVALID_ARGUMENT","message":"' + INVALID_TEXT + '","detail'
    's":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS","domai'
    'n":"a2a-protocol.org","metadata":{}}]}}'
)
#: A record's first line (the node's log format: time, level, logger, message).
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ([A-Z]+) (\S+): (.*)$", re.M)


@dataclass
class Node:
    url: str
    proc: Proc


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    """Two nodes of ``agent``: the fast path on (a blocking send takes mesh's fast route) and
    off (everything through the SDK's handler and routes)."""
    tmp = tmp_path_factory.mktemp("direct-fail")
    with contextlib.ExitStack() as stack:
        out = {}
        for name, fast in (("fast", "1"), ("sdk", "0")):
            url = f"http://127.0.0.1:{free_port()}"
            argv = ["mesh", "serve", "tests.test_direct_reply_failure:agent"]
            argv += ["--port", url.rsplit(":")[2], "--data-dir", str(tmp / name)]
            argv += ["--no-register", "--grace", "1"]
            env = clean_env(MESH_FASTPATH=fast)
            proc = stack.enter_context(
                running(argv, name=name, tmp=tmp, env=env, health=f"{url}/health")
            )
            out[name] = Node(url, proc)
        yield out


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30, headers=H) as client:
        yield client


def _message(skill_id: str, a: Any, context_id: str = "", **meta: Any) -> dict[str, Any]:
    return {
        "messageId": uuid.uuid4().hex,
        "contextId": context_id or uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"data": {"a": a, "b": 1}}],
        "metadata": {"skill": skill_id, **meta},
    }


async def _send(
    http: httpx.AsyncClient, url: str, binding: str, streamed: bool, message: dict[str, Any]
) -> httpx.Response:
    if binding == "JSONRPC":
        method = "SendStreamingMessage" if streamed else "SendMessage"
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": message}}
        return await http.post(url + "/", json=body)
    return await http.post(
        url + REST + ("/message:stream" if streamed else "/message:send"), json={"message": message}
    )


async def _log_of(node: Node, since: int, skill_id: str, outcome: str) -> str:
    """The node's log from offset ``since`` up to and with the run's own line (``message`` or
    ``task`` ... ``outcome=``), logged last (once the answer is sent)."""
    line = re.compile(
        rf"INFO mesh\.task: \w+ agent=direct-fail skill={skill_id}.*outcome={outcome}"
    )

    def caught_up() -> str | None:
        text = node.proc.output()[since:]
        return text if line.search(text) else None

    return str(await eventually(caught_up, what=f"{skill_id}'s line"))


def _records(log: str) -> list[tuple[str, str, str]]:
    return RECORD.findall(log)


CASES = [
    (node, binding, streamed)
    for node in ("fast", "sdk")
    for binding in ("JSONRPC", "HTTP+JSON")
    for streamed in (False, True)
]


@pytest.mark.parametrize(("node", "binding", "streamed"), CASES)
async def test_a_failing_direct_reply_is_logged_once(
    nodes: dict[str, Node], http: httpx.AsyncClient, node: str, binding: str, streamed: bool
) -> None:
    served = nodes[node]
    since = len(served.proc.output())
    context_id = uuid.uuid4().hex
    message = _message("direct_add", 13, context_id)
    answer = await _send(http, served.url, binding, streamed, message)
    if binding == "JSONRPC":
        assert (answer.status_code, answer.text) == (200, RPC_FAILED)
    else:
        assert (answer.status_code, answer.text) == (500, REST_FAILED)
    log = await _log_of(served, since, "direct_add", "failed")
    # Exactly one traceback, ours, of the skill's own exception.
    assert log.count("Traceback (most recent call last)") == 1, log
    assert log.count("RuntimeError: unlucky direct") == 1, log
    assert "a2a.utils.errors.InternalError" not in log, log
    records = _records(log)
    assert [(level, name) for level, name, _ in records] == [
        ("ERROR", "mesh.task"),
        ("INFO", "mesh.task"),
    ], log
    assert records[0][2] == "skill 'direct_add' raised"
    assert records[1][2].startswith("message agent=direct-fail skill=direct_add outcome=failed ")
    # The tasks stored as at d67a51c: none on the fast route; where the SDK's task machinery
    # ran the reply (streamed, or the fast path off), the FAILED task it saved of the message.
    params = {"contextId": context_id}
    listed = await http.post(
        served.url + "/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": params}
    )
    tasks = listed.json()["result"].get("tasks", [])
    if node == "fast" and not streamed:
        assert tasks == [], listed.text
    else:
        (task,) = tasks
        assert task["status"]["state"] == "TASK_STATE_FAILED"
        assert [m["messageId"] for m in task["history"]] == [message["messageId"]]
        assert "message" not in task["status"]
        assert "artifacts" not in task


@pytest.mark.parametrize("node", ["fast", "sdk"])
async def test_a_failing_task_skill_is_logged_at_the_same_level(
    nodes: dict[str, Node], http: httpx.AsyncClient, node: str
) -> None:
    """What a direct reply's failure is compared with: a task skill's, logged once by us, at
    ERROR with its traceback (its task ends FAILED)."""
    served = nodes[node]
    since = len(served.proc.output())
    answer = await _send(http, served.url, "JSONRPC", False, _message("task_add", 13))
    task = answer.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    log = await _log_of(served, since, "task_add", "failed")
    assert log.count("Traceback (most recent call last)") == 1, log
    records = _records(log)
    assert [(level, name) for level, name, _ in records] == [
        ("ERROR", "mesh.task"),
        ("INFO", "mesh.task"),
    ], log
    assert records[0][2] == "skill 'task_add' raised"


@pytest.mark.parametrize(("node", "binding", "streamed"), CASES)
async def test_invalid_input_has_no_traceback(
    nodes: dict[str, Node], http: httpx.AsyncClient, node: str, binding: str, streamed: bool
) -> None:
    served = nodes[node]
    since = len(served.proc.output())
    answer = await _send(http, served.url, binding, streamed, _message("direct_add", "x"))
    if binding == "JSONRPC":
        assert (answer.status_code, answer.text) == (200, RPC_INVALID)
    else:
        assert (answer.status_code, answer.text) == (400, REST_INVALID)
    # A send after it: its line marks that the log has caught up with this one.
    ok = await _send(http, served.url, "JSONRPC", False, _message("direct_add", 1))
    assert ok.json()["result"]["message"]["parts"][0]["data"] == {"sum": 2}
    log = await _log_of(served, since, "direct_add", "completed")
    assert "Traceback" not in log, log
    assert not [r for r in _records(log) if r[0] == "ERROR"], log


@pytest.mark.parametrize(("node", "binding", "streamed"), CASES)
async def test_a_direct_reply_past_its_deadline_has_no_traceback(
    nodes: dict[str, Node], http: httpx.AsyncClient, node: str, binding: str, streamed: bool
) -> None:
    """A direct reply cut by its deadline: -32603 (500) saying so; no one logs a traceback."""
    served = nodes[node]
    since = len(served.proc.output())
    message = _message("direct_add", 99, deadline=time.time() + 0.3)
    answer = await _send(http, served.url, binding, streamed, message)
    error = answer.json()["error"]
    assert error["message"] == "skill 'direct_add': deadline exceeded"
    assert error["code"] == (-32603 if binding == "JSONRPC" else 500)
    log = await _log_of(served, since, "direct_add", "failed")
    assert "Traceback" not in log, log


async def test_other_sdk_errors_are_still_logged(
    nodes: dict[str, Node], http: httpx.AsyncClient
) -> None:
    """The filter drops only a failure mesh logged: the SDK's route still logs other errors."""
    served = nodes["sdk"]
    since = len(served.proc.output())
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "SubscribeToTask",
        "params": {"id": "no-such-task"},
    }
    answer = await http.post(served.url + "/", json=body)
    assert answer.json()["error"]["code"] == -32001
    await eventually(
        lambda: (
            "ERROR a2a.server.routes.jsonrpc_dispatcher: Request Error (ID: 9)"
            in served.proc.output()[since:]
            or "WARNING a2a.server.routes.jsonrpc_dispatcher: Request Error (ID: 9)"
            in served.proc.output()[since:]
        ),
        what="the SDK's line",
    )

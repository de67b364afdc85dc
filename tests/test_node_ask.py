"""Typed skills that ask (``ctx.ask``): real ``mesh serve`` processes of tests.ask_agents, driven
by the real a2a-sdk client. A task stops INPUT_REQUIRED (AUTH_REQUIRED) with its question; a
message naming it resumes it (replay); an invalid answer keeps it waiting; a working or
terminal task refuses a message (-32004); cancel and deadlines end a waiting task, also across
a restart; a kill -9 while waiting loses nothing."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict

from tests.support import Proc, clean_env, eventually, free_port, running

pytestmark = pytest.mark.integration

EXT = "urn:mesh:tasks:v1"
WAITING = TaskState.TASK_STATE_INPUT_REQUIRED


class Asker:
    """One ``mesh serve`` node of an agent that asks (tests.ask_agents by default;
    test_node_llm_ask serves tests.llm_ask_agents): its port, data dir, hold file and call log;
    it can be restarted."""

    def __init__(
        self, tmp: Path, name: str = "asker", target: str = "tests.ask_agents:agent"
    ) -> None:
        self.tmp = tmp
        self.name = name
        self.target = target
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp / f"{name}-data"
        self.calls_file = tmp / f"{name}-calls.txt"
        self.hold_file = tmp / f"{name}.hold"
        self.runs = 0

    @contextlib.contextmanager
    def serve(self, **env: str) -> Iterator[Proc]:
        env.setdefault("NODE_TEST_HOLD", str(self.hold_file))
        self.runs += 1
        argv = [
            "mesh", "serve", self.target, "--port", str(self.port),
            "--data-dir", str(self.data), "--no-register",
        ]  # fmt: skip
        child_env = clean_env(NODE_TEST_CALLS=str(self.calls_file), **env)
        with running(
            argv,
            name=f"{self.name}-{self.runs}",
            tmp=self.tmp,
            env=child_env,
            health=f"{self.url}/health",
        ) as proc:
            yield proc

    def calls(self, prefix: str = "") -> list[str]:
        if not self.calls_file.exists():
            return []
        return [x for x in self.calls_file.read_text().splitlines() if x.startswith(prefix)]

    def waits(self, columns: str = "task_id, state") -> list[tuple[str, ...]]:
        """``columns`` of the resume points on disk, as another process reads them."""
        conn = sqlite3.connect(self.data / "node.db", timeout=5)
        try:
            return list(conn.execute(f"select {columns} from mesh_waits").fetchall())
        finally:
            conn.close()

    async def client(self, http: httpx.AsyncClient, *, streaming: bool = False) -> Client:
        card = await A2ACardResolver(http, self.url).get_agent_card()
        return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asker]:
    asker = Asker(tmp_path_factory.mktemp("ask"))
    with asker.serve():
        yield asker


def message(
    *,
    data: dict[str, Any] | None = None,
    text: str | None = None,
    skill: str | None = None,
    task: Task | None = None,
    metadata: dict[str, Any] | None = None,
) -> Message:
    parts = []
    if data is not None:
        parts.append(new_data_part(data))
    if text is not None:
        parts.append(new_text_part(text))
    msg = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts)
    if task is not None:
        msg.task_id, msg.context_id = task.id, task.context_id
    meta = dict(metadata or {})
    if skill is not None:
        meta["skill"] = skill
    if meta:
        msg.metadata.update(meta)
    return msg


async def send(client: Client, msg: Message, *, wait: bool = True) -> Task:
    """A blocking (or return-immediately) SendMessage; the task it answers."""
    config = SendMessageConfiguration(return_immediately=not wait)
    answers = [
        r async for r in client.send_message(SendMessageRequest(message=msg, configuration=config))
    ]
    assert len(answers) == 1, answers
    assert answers[0].HasField("task"), answers
    return answers[0].task


async def stream(client: Client, msg: Message) -> list[StreamResponse]:
    return [r async for r in client.send_message(SendMessageRequest(message=msg))]


async def get(client: Client, task_id: str) -> Task:
    return await client.get_task(GetTaskRequest(id=task_id))


def status_texts(task: Task) -> list[str]:
    return [p.text for p in task.status.message.parts if p.HasField("text")]


def ext_of(meta: Any) -> dict[str, Any]:
    return dict(MessageToDict(meta).get(EXT, {})) if meta else {}


def artifact_data(task: Task) -> dict[str, Any]:
    return dict(MessageToDict(task.artifacts[-1].parts[0].data))


def error_of(task: Task) -> dict[str, Any]:
    return dict(MessageToDict(task.metadata).get("error", {}))


def review(applicant: str, **meta: Any) -> Message:
    return message(
        data={"applicant_id": applicant, "amount": 600000}, skill="review", metadata=meta
    )


# -- asking and resuming ------------------------------------------------------------------------


@pytest.mark.parametrize("fastpath", ["1", "0"])
async def test_a_blocking_ask_waits_with_its_question_and_each_answer_resumes_it(
    tmp_path: Path, http: httpx.AsyncClient, fastpath: str
) -> None:
    asker = Asker(tmp_path)
    with asker.serve(MESH_FASTPATH=fastpath):
        client = await asker.client(http)
        # A skill that never asks still completes (on the fast path when it is on).
        echoed = await send(client, message(data={"key": "k"}, skill="echo"))
        assert echoed.status.state == TaskState.TASK_STATE_COMPLETED

        task = await send(client, review("APP-1"))
        assert task.status.state == WAITING
        assert status_texts(task) == ["Approve APP-1 for 600,000?"]
        schema_part = task.status.message.parts[1]
        assert schema_part.media_type == "application/schema+json"
        schema = MessageToDict(schema_part.data)
        assert schema["properties"]["decision"]["enum"] == ["approve", "decline"]
        assert schema["propertyOrdering"] == ["decision", "note"]
        assert ext_of(schema_part.metadata) == {"question": "q-0"}
        (entry,) = ext_of(task.status.message.metadata)["questions"]
        assert entry == {
            "id": "q-0",
            "kind": "input",
            "text": "Approve APP-1 for 600,000?",
            "schema": True,
            "path": [],
        }
        assert ext_of(task.metadata)["questions"] == [entry]  # ListTasks readers see it too

        # The answer (the question named) resumes it: the skill runs again and asks step 1.
        answer = message(
            data={"decision": "approve", "note": "collateral checked"},
            task=task,
            metadata={EXT: {"answers": "q-0"}},
        )
        again = await send(client, answer)
        assert again.id == task.id
        assert again.status.state == WAITING
        assert status_texts(again) == ["Who approves?"]
        (entry,) = ext_of(again.status.message.metadata)["questions"]
        assert (entry["id"], entry["schema"]) == ("q-1", False)

        # A text question takes text; no contextId is needed (the task's is used).
        done = await send(client, message(text="Ada", task=task))
        done_task = await get(client, task.id)
        assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
        assert artifact_data(done_task) == {
            "applicant_id": "APP-1",
            "decision": "approve",
            "note": "collateral checked",
            "reviewer": "Ada",
        }
        assert ext_of(done_task.metadata)["questions"] == []
        # Replay: three runs, one decision; the resume point is gone.
        assert len(asker.calls("review run APP-1")) == 3
        assert asker.calls("review decided") == ["review decided APP-1 approve"]
        assert await eventually(lambda: asker.waits() == [], what="the resume point to go")


async def test_a_streamed_ask_ends_its_stream_waiting_and_a_streamed_answer_completes_it(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http, streaming=True)
    events = await stream(client, review("APP-2"))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"
    last = events[-1].status_update
    assert last.status.state == WAITING
    assert [p.text for p in last.status.message.parts if p.HasField("text")] == [
        "Approve APP-2 for 600,000?"
    ]
    task_id, context_id = events[0].task.id, events[0].task.context_id
    answer = message(data={"decision": "decline"})
    answer.task_id, answer.context_id = task_id, context_id
    resumed = await stream(client, answer)
    states = [e.status_update.status.state for e in resumed if e.HasField("status_update")]
    assert states[0] == TaskState.TASK_STATE_WORKING
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    (artifact,) = [e.artifact_update for e in resumed if e.HasField("artifact_update")]
    assert MessageToDict(artifact.artifact.parts[0].data)["decision"] == "decline"


async def test_an_invalid_answer_keeps_the_task_waiting_and_names_the_field(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    task = await send(client, review("APP-3"))
    runs = len(node.calls("review run APP-3"))
    bad = await send(client, message(data={"decision": "maybe"}, task=task))
    assert bad.status.state == WAITING
    texts = status_texts(bad)
    assert texts[0].startswith("invalid answer to q-0: field 'decision': ")
    assert texts[1] == "Approve APP-3 for 600,000?"
    (entry,) = ext_of(bad.status.message.metadata)["questions"]
    assert entry["invalid"][0]["field"] == "decision"
    # Text where the question wants a data part: also invalid, saying so.
    text_only = await send(client, message(text="yes", task=task))
    assert "takes exactly one data part" in status_texts(text_only)[0]
    # Nothing ran, and the task is waiting on disk too.
    assert len(node.calls("review run APP-3")) == runs
    assert (await get(client, task.id)).status.state == WAITING
    # A schema bound (Field(ge=1, le=5)) is checked before the skill runs again.
    picked = await send(client, message(data={}, skill="pick"))
    over = await send(client, message(data={"n": 9}, task=picked))
    assert "field 'n'" in status_texts(over)[0]
    fine = await send(client, message(data={"n": 3}, task=picked))
    assert fine.status.state == TaskState.TASK_STATE_COMPLETED
    assert artifact_data(await get(client, picked.id)) == {"n": 3}
    # A question id that is not open is refused, naming the open one.
    with pytest.raises(InvalidParamsError, match="q-0") as refused:
        await send(
            client,
            message(data={"decision": "approve"}, task=task, metadata={EXT: {"answers": "q-7"}}),
        )
    assert "not open" in str(refused.value)


async def test_a_message_to_a_working_or_a_terminal_task_gets_32004(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    working = await send(client, message(data={"seconds": 30}, skill="slow"), wait=False)
    with pytest.raises(UnsupportedOperationError, match="it takes a message only while it waits"):
        await send(client, message(text="interject", task=working))
    canceled = await client.cancel_task(CancelTaskRequest(id=working.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED

    done = await send(client, message(data={"key": "k"}, skill="echo"))
    with pytest.raises(UnsupportedOperationError, match="terminal state"):
        await send(client, message(text="more", task=done))


async def test_auth_asks_wait_auth_required_and_the_answer_is_not_kept_in_history(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    task = await send(client, message(data={"account": "acc-9"}, skill="link"))
    assert task.status.state == TaskState.TASK_STATE_AUTH_REQUIRED
    assert "consent?account=acc-9" in status_texts(task)[0]
    done = await send(client, message(text="493817", task=task))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    stored = await get(client, task.id)
    assert artifact_data(stored) == {"account": "acc-9", "code_length": 6}
    history = json.dumps(MessageToDict(stored))
    assert "493817" not in history
    assert "[redacted]" in history


async def test_a_skill_that_asks_something_else_on_replay_fails_naming_both_asks(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    task = await send(client, message(data={}, skill="fickle"))
    assert task.status.state == WAITING
    ended = await send(client, message(text="go", task=task))
    assert ended.status.state == TaskState.TASK_STATE_FAILED
    text = status_texts(ended)[0]
    assert "skill 'fickle' asked 'What now? (asked at" in text
    assert "at step 0 where it asked" in text
    assert "must not depend on time or outside data" in text


async def test_the_card_says_which_skills_may_ask(node: Asker, http: httpx.AsyncClient) -> None:
    card = (await http.get(node.url + "/.well-known/agent-card.json")).json()
    extensions = {e["uri"]: e for e in card["capabilities"]["extensions"]}
    assert EXT in extensions
    skills = extensions["urn:mesh:skill-schemas:v1"]["params"]["skills"]
    assert skills["review"]["asks"] is True
    assert "asks" not in skills["echo"]


# -- cancel and deadlines -----------------------------------------------------------------------


async def test_cancel_ends_a_waiting_task_also_after_a_restart(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    asker = Asker(tmp_path)
    with asker.serve():
        client = await asker.client(http)
        here = await send(client, review("APP-4"))
        canceled = await client.cancel_task(CancelTaskRequest(id=here.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        assert status_texts(canceled) == ["canceled by request"]
        with pytest.raises(UnsupportedOperationError, match="terminal state"):
            await send(client, message(data={"decision": "approve"}, task=here))
        later = await send(client, review("APP-5"))
    with asker.serve():
        client = await asker.client(http)
        assert (await get(client, later.id)).status.state == WAITING
        canceled = await client.cancel_task(CancelTaskRequest(id=later.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        # Not the question any more: the SDK alone would leave it as the status message.
        assert status_texts(canceled) == ["canceled by request"]
        stored = await get(client, later.id)
        assert status_texts(stored) == ["canceled by request"]
        assert error_of(stored)["reason"] == "canceled"
        assert await eventually(lambda: asker.waits() == [], what="the resume points to go")


async def test_a_deadline_passing_while_waiting_fails_the_task_also_across_a_restart(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    asker = Asker(tmp_path)
    with asker.serve() as proc:
        client = await asker.client(http)
        now = time.time()
        soon = await send(client, review("APP-6", deadline=now + 1.5))
        assert soon.status.state == WAITING
        ended = await eventually(
            lambda: _state_is(client, soon.id, TaskState.TASK_STATE_FAILED),
            within=10,
            what="the waiting task to fail at its deadline",
        )
        assert error_of(ended)["reason"] == "deadline"
        assert "while the task waited for input" in status_texts(ended)[0]
        # Two more: one whose deadline passes while the node is down, one after it restarts.
        now = time.time()
        gone = await send(client, review("APP-7", deadline=now + 2))
        after = await send(client, review("APP-8", deadline=now + 6))
        proc.kill()
    await eventually(lambda: time.time() > now + 2.2, within=5, what="APP-7's deadline")
    with asker.serve():
        client = await asker.client(http)
        down = await get(client, gone.id)
        assert down.status.state == TaskState.TASK_STATE_FAILED
        assert error_of(down)["reason"] == "deadline"
        assert (await get(client, after.id)).status.state == WAITING
        late = await eventually(
            lambda: _state_is(client, after.id, TaskState.TASK_STATE_FAILED),
            within=15,
            what="the task to fail at its deadline after the restart",
        )
        assert error_of(late)["reason"] == "deadline"
        assert await eventually(lambda: asker.waits() == [], what="the resume points to go")


async def _state_is(client: Client, task_id: str, state: TaskState) -> Task | None:
    task = await get(client, task_id)
    return task if task.status.state == state else None


# -- crashes ------------------------------------------------------------------------------------


async def test_a_task_waiting_at_a_kill_9_waits_after_the_restart_and_its_answer_completes_it(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    asker = Asker(tmp_path)
    with asker.serve() as proc:
        client = await asker.client(http)
        task = await send(client, review("APP-9"))
        assert task.status.state == WAITING
        proc.kill()
    with asker.serve():
        client = await asker.client(http)
        stored = await get(client, task.id)
        assert stored.status.state == WAITING
        assert status_texts(stored) == ["Approve APP-9 for 600,000?"]
        declined = await send(
            client, message(data={"decision": "decline", "note": "no"}, task=task)
        )
        assert declined.status.state == TaskState.TASK_STATE_COMPLETED
        data = artifact_data(await get(client, task.id))
        assert (data["decision"], data["note"]) == ("decline", "no")
    assert len(asker.calls("review run APP-9")) == 2


async def test_a_task_killed_while_it_resumes_runs_again_with_its_answer_after_the_restart(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    asker = Asker(tmp_path)
    asker.hold_file.touch()
    with asker.serve() as proc:
        client = await asker.client(http)
        task = await send(client, message(data={}, skill="careful"))
        assert task.status.state == WAITING
        resumed = await send(client, message(text="yes", task=task), wait=False)
        assert resumed.id == task.id
        await eventually(lambda: asker.calls("careful holding yes"), what="the resumed run")
        proc.kill()
    assert asker.waits() == [(task.id, "resuming")]  # the answer is recorded on disk
    asker.hold_file.unlink()
    with asker.serve():
        client = await asker.client(http)
        done = await eventually(
            lambda: _state_is(client, task.id, TaskState.TASK_STATE_COMPLETED),
            what="the node to run the task again by itself",
        )
        assert artifact_data(done) == {"answer": "yes"}
        history = [MessageToDict(m.metadata).get(EXT, {}) for m in done.history if m.metadata]
        assert {"resume": "restart"} in history
    assert asker.calls("careful done") == ["careful done yes"]


@pytest.mark.parametrize(
    ("target", "who"),
    [
        ("tests.ask_agents:agent", "skill 'review'"),
        ("tests.llm_ask_agents:agent", "a tool of skill 'chat'"),
    ],
)
async def test_an_ask_on_a_node_that_keeps_no_tasks_fails_saying_how_to_serve_it(
    tmp_path: Path, http: httpx.AsyncClient, target: str, who: str
) -> None:
    asker = Asker(tmp_path, target=target)
    with asker.serve(MESH_STORE="memory"):
        client = await asker.client(http)
        asked = (
            review("APP-1") if target.startswith("tests.ask_") else message(text="pay APP-1 80,000")
        )
        task = await send(client, asked)
    assert task.status.state == TaskState.TASK_STATE_FAILED, task
    text = (
        f"{who} asked for input, but this node keeps no tasks (store=memory): serve it with "
        "the SQLite store"
    )
    assert status_texts(task) == [text]
    assert error_of(task) == {"reason": "failed", "message": text}

"""A specialist asks across the hop (issue 13 item 3): real ``mesh serve`` processes of
tests.delegation_wait_agents (top LLM coordinator -> middle LLM coordinator -> bottom typed skill
that asks), driven by the real a2a-sdk client.

The bottom's question waits at the top, attributed (asker = bottom, path = [middle, bottom]);
the answer sent to the top is checked there (an invalid one names the field and goes nowhere)
and forwarded down, also after every node was kill -9'd and restarted while waiting; two
children waiting at once are answered one by one; a cancel at the top, or its deadline passing
while it waits, reaches the bottom; a bottom answered directly gives the top its end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import CancelTaskRequest, Task, TaskState
from google.protobuf.json_format import MessageToDict

from tests.support import Proc, clean_env, eventually, free_port, running
from tests.test_node_ask import ext_of, get, message, send, status_texts

pytestmark = pytest.mark.integration

WAITING = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED
APPROVE = {"decision": "approve", "note": "collateral checked"}


class Node:
    """One node of the chain: its port and data dir; restartable."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp = tmp
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp / f"{name}-data"
        self.runs = 0
        self.proc: Proc | None = None

    def argv(self) -> list[str]:
        return [
            "mesh", "serve", f"tests.delegation_wait_agents:{self.name}", "--port",
            str(self.port), "--data-dir", str(self.data), "--no-register",
        ]  # fmt: skip

    def waits(self) -> list[tuple[str, str]]:
        """(task id, state) of the resume points on disk."""
        conn = sqlite3.connect(self.data / "node.db", timeout=5)
        try:
            return list(conn.execute("select task_id, state from mesh_waits").fetchall())
        finally:
            conn.close()

    async def client(self, http: httpx.AsyncClient) -> Client:
        card = await A2ACardResolver(http, self.url).get_agent_card()
        return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


class Chain:
    """top -> middle -> bottom, each its own process."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.top, self.middle, self.bottom = (Node(tmp, n) for n in ("top", "middle", "bottom"))
        self.calls_file = tmp / "bottom-calls.txt"
        self.plain_url = ""
        self._stack = contextlib.ExitStack()

    def start(self, node: Node) -> None:
        node.runs += 1
        env = clean_env(
            MESH_TEST_MIDDLE_URL=self.middle.url,
            MESH_TEST_BOTTOM_URL=self.bottom.url,
            NODE_TEST_CALLS=str(self.calls_file),
            **({"MESH_TEST_PLAIN_URL": self.plain_url} if self.plain_url else {}),
        )
        node.proc = self._stack.enter_context(
            running(
                node.argv(),
                name=f"{node.name}-{node.runs}",
                tmp=self.tmp,
                env=env,
                health=f"{node.url}/health",
            )
        )

    def start_plain(self) -> None:
        """A plain a2a-sdk agent that asks (tests.asking_node), as the top's child."""
        port = free_port()
        self.plain_url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "tests.asking_node", "--name", "plain", "--port", str(port)]
        self._stack.enter_context(
            running(argv, name="plain", tmp=self.tmp, health=f"{self.plain_url}/health")
        )

    @contextlib.contextmanager
    def serve(self) -> Iterator[Chain]:
        with self._stack:
            for node in (self.bottom, self.middle, self.top):
                self.start(node)
            yield self

    def kill_all(self) -> None:
        for node in (self.top, self.middle, self.bottom):
            assert node.proc is not None
            node.proc.kill()

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    with Chain(tmp_path_factory.mktemp("chain")).serve() as served:
        yield served


def questions(task: Task) -> list[dict[str, Any]]:
    return list(ext_of(task.status.message.metadata)["questions"])


def answer(task: Task, question_id: str, *, data: Any = None, text: str | None = None) -> Any:
    return message(
        data=data, text=text, task=task, metadata={"urn:mesh:tasks:v1": {"answers": question_id}}
    )


async def assess(client: Client, applicant: str, **meta: Any) -> Task:
    return await send(client, message(text=f"assess {applicant} 600,000", metadata=meta or None))


async def test_three_hops_restarted_while_waiting_the_answer_at_the_top_is_used_at_the_bottom(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    chain = Chain(tmp_path)
    with chain.serve():
        top = await chain.top.client(http)
        task = await assess(top, "APP-1")
        assert task.status.state == WAITING, status_texts(task)
        assert status_texts(task) == ["Approve APP-1 for 600,000?"]
        (q,) = questions(task)
        assert q["asker"]["agent"] == "bottom"
        assert [hop["agent"] for hop in q["path"]] == ["middle", "bottom"]
        assert q["path"][1]["question"] == "q-0"  # the bottom's own id
        assert q["asker"]["task"] == q["path"][1]["task"]
        assert q["id"].startswith("q-")
        assert q["id"] != q["path"][0]["question"]  # each hop's own id
        # The schema is relayed: the top shows what the bottom takes.
        schema_parts = [p for p in task.status.message.parts if p.HasField("data")]
        assert len(schema_parts) == 1
        # Each hop tells whom it works for.
        middle_task = await get(await chain.middle.client(http), q["path"][0]["task"])
        assert middle_task.status.state == WAITING
        assert middle_task.metadata["callerTask"] == task.id
        # The card says assess asks: the top gave it remote()'s wait_deadline_s (7 days), not
        # its 30 s deadline_s.
        sent = MessageToDict(middle_task.history[0].metadata)
        assert sent["deadline"] > time.time() + 6 * 24 * 3600
        bottom_task = await get(await chain.bottom.client(http), q["asker"]["task"])
        assert bottom_task.metadata["callerTask"] == middle_task.id

        chain.kill_all()
        for node in (chain.bottom, chain.middle, chain.top):
            assert [state for _, state in node.waits()] == ["waiting"], node.name
            chain.start(node)

        top = await chain.top.client(http)
        done = await send(top, answer(task, q["id"], data=APPROVE))
        assert done.status.state == COMPLETED, status_texts(done)
        assert "APP-1: approve (collateral checked)" in done.artifacts[-1].parts[0].text
        assert chain.calls() == ["review APP-1 approve collateral checked"]
        for node in (chain.top, chain.middle, chain.bottom):
            await eventually(lambda node=node: node.waits() == [], within=10)


async def test_a_top_stopped_during_a_forward_sends_it_again_and_the_bottom_runs_once(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    chain = Chain(tmp_path)
    with chain.serve():
        top = await chain.top.client(http)
        task = await assess(top, "APP-7")
        (q,) = questions(task)
        sending = asyncio.create_task(
            send(top, answer(task, q["id"], data={"decision": "approve", "note": "slow"}))
        )
        await eventually(lambda: "review started APP-7" in chain.calls(), within=10)
        assert chain.top.proc is not None
        chain.top.proc.kill()
        with contextlib.suppress(Exception):
            await sending
        assert [state for _, state in chain.top.waits()] == ["resuming"]
        chain.start(chain.top)  # rule 4: it runs again and forwards the same message

        top = await chain.top.client(http)

        async def completed() -> Task | None:
            now = await get(top, task.id)
            return now if now.status.state == COMPLETED else None

        done = await eventually(completed, within=20)
        assert "APP-7: approve (slow)" in done.artifacts[-1].parts[0].text
        assert chain.calls() == ["review started APP-7", "review APP-7 approve slow"]


async def test_an_answer_that_cannot_reach_the_bottom_keeps_the_question_open_until_sent_again(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    chain = Chain(tmp_path)
    with chain.serve():
        top = await chain.top.client(http)
        task = await assess(top, "APP-9")
        (q,) = questions(task)
        assert chain.bottom.proc is not None
        chain.bottom.proc.kill()

        held = await send(top, answer(task, q["id"], data=APPROVE))
        assert held.status.state == WAITING
        (entry,) = questions(held)
        assert entry["id"] == q["id"]
        text = status_texts(held)[0]
        assert text.startswith(f"invalid answer to {q['id']}: field '(answer)': not forwarded")
        assert "send the answer again later" in text
        assert chain.calls() == []

        chain.start(chain.bottom)
        done = await send(top, answer(task, q["id"], data=APPROVE))
        assert done.status.state == COMPLETED, status_texts(done)
        assert "APP-9: approve (collateral checked)" in done.artifacts[-1].parts[0].text
        assert chain.calls() == ["review APP-9 approve collateral checked"]


async def test_an_invalid_answer_at_the_top_names_the_field_and_nothing_is_forwarded(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await assess(top, "APP-2")
    (q,) = questions(task)
    bottom = await chain.bottom.client(http)
    before = await get(bottom, q["asker"]["task"])

    bad = await send(top, answer(task, q["id"], data={"decision": "maybe"}))
    assert bad.status.state == WAITING
    assert status_texts(bad)[0].startswith(f"invalid answer to {q['id']}: field 'decision': ")
    (entry,) = questions(bad)
    assert entry["invalid"][0]["field"] == "decision"
    after = await get(bottom, q["asker"]["task"])
    assert len(after.history) == len(before.history)
    assert questions(after)[0].get("invalid") is None

    done = await send(top, answer(task, q["id"], data={"decision": "decline"}))
    assert done.status.state == COMPLETED
    assert "APP-2: decline ()" in done.artifacts[-1].parts[0].text


async def test_an_answer_the_bottom_refuses_is_relayed_back_up_as_invalid(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await assess(top, "APP-12")
    (q,) = questions(task)
    # Valid for the schema the top checks; the bottom's model refuses it.
    refused = await send(top, answer(task, q["id"], data={"decision": "approve", "note": "n/a"}))
    assert refused.status.state == WAITING
    (entry,) = questions(refused)
    assert entry["id"] == q["id"]  # the same question, asked again
    assert entry["invalid"][0]["field"] == "note"
    assert "say why, or leave the note out" in status_texts(refused)[0]
    done = await send(top, answer(task, q["id"], data={"decision": "approve", "note": "ok"}))
    assert done.status.state == COMPLETED, status_texts(done)
    assert "APP-12: approve (ok)" in done.artifacts[-1].parts[0].text


async def test_two_children_waiting_at_once_each_answer_resolves_one(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await send(top, message(text="both APP-3"))
    assert task.status.state == WAITING
    asked = {q["text"]: q for q in questions(task)}
    assert set(asked) == {"Approve APP-3 for 70,000?", "Identity code of APP-3?"}
    code = asked["Identity code of APP-3?"]
    approval = asked["Approve APP-3 for 70,000?"]

    first = await send(top, answer(task, code["id"], text="ID-448"))
    assert first.status.state == WAITING
    assert [q["id"] for q in questions(first)] == [approval["id"]]
    done = await send(top, answer(task, approval["id"], data={"decision": "approve"}))
    assert done.status.state == COMPLETED, status_texts(done)
    assert done.artifacts[-1].parts[0].text == "approve / ID-448"


async def test_two_questions_relayed_through_one_call_are_answered_in_any_order(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await send(top, message(text="deep APP-13"))
    assert task.status.state == WAITING
    asked = {q["text"]: q for q in questions(task)}
    assert set(asked) == {"Approve APP-13 for 70,000?", "Identity code of APP-13?"}
    for q in asked.values():  # both came through the middle's one task
        assert [hop["agent"] for hop in q["path"]] == ["middle", "bottom"]
    approval, code = asked["Approve APP-13 for 70,000?"], asked["Identity code of APP-13?"]

    # The second one listed first.
    first = await send(top, answer(task, code["id"], text="ID-7"))
    assert first.status.state == WAITING, status_texts(first)
    assert [q["id"] for q in questions(first)] == [approval["id"]]
    done = await send(top, answer(task, approval["id"], data={"decision": "decline"}))
    assert done.status.state == COMPLETED, status_texts(done)
    assert done.artifacts[-1].parts[0].text == "middle says: decline / ID-7"


async def test_an_auth_question_below_makes_the_top_auth_required_and_its_answer_is_not_kept(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await send(top, message(text="consent APP-11"))
    assert task.status.state == TaskState.TASK_STATE_AUTH_REQUIRED
    (q,) = questions(task)
    assert (q["kind"], q["asker"]["agent"]) == ("auth", "bottom")
    done = await send(top, answer(task, q["id"], text="493817"))
    assert done.status.state == COMPLETED, status_texts(done)
    assert done.artifacts[-1].parts[0].text == "consent granted: true"
    stored = await get(top, task.id)
    assert "493817" not in json.dumps(MessageToDict(stored))
    bottom_task = await get(await chain.bottom.client(http), q["asker"]["task"])
    assert "493817" not in json.dumps(MessageToDict(bottom_task))


async def test_a_cancel_at_the_top_cancels_the_bottom(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await assess(top, "APP-4")
    (q,) = questions(task)
    canceled = await top.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    middle = await get(await chain.middle.client(http), q["path"][0]["task"])
    assert middle.status.state == TaskState.TASK_STATE_CANCELED
    bottom = await get(await chain.bottom.client(http), q["asker"]["task"])
    assert bottom.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_deadline_passing_while_waiting_at_the_top_ends_the_chain(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await assess(top, "APP-5", deadline=time.time() + 4)
    assert task.status.state == WAITING
    (q,) = questions(task)
    middle_client = await chain.middle.client(http)
    bottom_client = await chain.bottom.client(http)
    # The children carry the top's deadline, not their own 7-day wait.
    middle = await get(middle_client, q["path"][0]["task"])
    assert middle.status.state == WAITING

    ended = {TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}

    async def chain_ended() -> bool:
        states = [
            (await get(top, task.id)).status.state,
            (await get(middle_client, q["path"][0]["task"])).status.state,
            (await get(bottom_client, q["asker"]["task"])).status.state,
        ]
        return all(s in ended for s in states)

    await eventually(chain_ended, within=20)
    assert (await get(top, task.id)).status.state == TaskState.TASK_STATE_FAILED


async def test_a_bottom_answered_directly_gives_the_top_its_end(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    top = await chain.top.client(http)
    task = await assess(top, "APP-6")
    (q,) = questions(task)
    bottom = await chain.bottom.client(http)
    bottom_task = await get(bottom, q["asker"]["task"])
    direct = await send(bottom, answer(bottom_task, "q-0", data={"decision": "decline"}))
    assert direct.status.state == COMPLETED

    # The top, answered later, forwards; the bottom's end (its direct answer) is what it uses.
    done = await send(top, answer(task, q["id"], data=APPROVE))
    assert done.status.state == COMPLETED, status_texts(done)
    assert "APP-6: decline ()" in done.artifacts[-1].parts[0].text


async def test_a_function_skill_whose_remote_call_asks_fails_saying_what_to_use(
    chain: Chain, http: httpx.AsyncClient
) -> None:
    middle = await chain.middle.client(http)
    task = await send(
        middle, message(data={"applicant_id": "APP-8", "amount": 600000}, skill="relay")
    )
    assert task.status.state == TaskState.TASK_STATE_FAILED
    (text,) = status_texts(task)
    assert "skill 'relay' called bottom's skill 'review', whose task " in text
    assert "a function skill cannot relay a question" in text
    assert "LLM agent's remote() tool (tools=[remote('bottom')])" in text
    assert "ask your caller first (@skill(asks=True), answer = await ctx.ask(...))" in text
    child = re.search(r"whose task (\S+) waits", text)
    assert child is not None
    bottom = await get(await chain.bottom.client(http), child.group(1))
    assert bottom.status.state == TaskState.TASK_STATE_CANCELED  # not left waiting in vain


async def test_any_a2a_child_is_relayed_answered_and_canceled_when_the_top_expires_stopped(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    chain = Chain(tmp_path)
    with chain._stack:
        chain.start_plain()
        chain.start(chain.top)
        top = await chain.top.client(http)
        # A question without mesh's entries (no id) is relayed and answered all the same.
        task = await send(top, message(text="free R-1"))
        assert task.status.state == WAITING
        (q,) = questions(task)
        assert q["text"] == "What is the reference number?"
        assert q["asker"]["agent"] == "plain"
        assert q["path"] == [{"agent": "plain", "task": q["asker"]["task"], "question": ""}]
        done = await send(top, answer(task, q["id"], text="R-17"))
        assert done.status.state == COMPLETED, status_texts(done)

        # Waiting at a kill -9, its deadline passing while stopped: at the restart the top ends
        # FAILED (deadline) and cancels its child (which keeps no deadline of its own).
        deadline = time.time() + 3
        task = await send(top, message(text="free R-2", metadata={"deadline": deadline}))
        (q,) = questions(task)
        assert chain.top.proc is not None
        chain.top.proc.kill()
        await eventually(lambda: time.time() > deadline + 0.2, within=10)
        chain.start(chain.top)
        top = await chain.top.client(http)
        assert (await get(top, task.id)).status.state == TaskState.TASK_STATE_FAILED
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as plain_http:
            card = await A2ACardResolver(plain_http, chain.plain_url).get_agent_card()
            plain = ClientFactory(ClientConfig(streaming=False, httpx_client=plain_http)).create(
                card
            )

            async def child_canceled() -> bool:
                child = await get(plain, q["asker"]["task"])
                return child.status.state == TaskState.TASK_STATE_CANCELED

            await eventually(child_canceled, within=10)

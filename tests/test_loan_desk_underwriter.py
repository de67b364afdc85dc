"""The loan desk's human step (issue 13 item 8): an application above the underwriting threshold
waits at the loan officer with the underwriter's question; the answer sent to the officer goes
down to the underwriter and its decision comes back up into the recommendation, also after the
underwriter and the officer were kill -9'd and restarted while it waited. Real processes
(registry, bureau, verifier, underwriter, officer), the real a2a-sdk client."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import Task, TaskState

from tests.support import Proc, clean_env, eventually, free_port, running
from tests.test_node_ask import ext_of, message, send, status_texts

pytestmark = pytest.mark.integration

WAITING = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED
# APP-738 at 600,000: the policy refers it (debt-to-income 51%), above the 500,000 threshold.
BIG = "Should we approve APP-738 for 600,000 over 60 months?"
QUESTION = (
    "Approve APP-738 for 600,000 over 60 months? "
    "Policy: refer, debt-to-income would be 51% (comfort limit 45%)."
)


class Node:
    """One node of the desk at a fixed port and data dir, so it can be restarted."""

    def __init__(self, desk: Desk, name: str, module: str) -> None:
        self.desk = desk
        self.name = name
        self.module = module
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = desk.tmp / name
        self.runs = 0
        self.proc: Proc | None = None

    def start(self) -> None:
        self.runs += 1
        argv = [
            "mesh", "serve", self.module, "--port", str(self.port), "--data-dir",
            str(self.data), "--registry", self.desk.registry, "--grace", "2",
        ]  # fmt: skip
        self.proc = self.desk.stack.enter_context(
            running(
                argv,
                name=f"{self.name}-{self.runs}",
                tmp=self.desk.tmp,
                env=self.desk.env,
                health=f"{self.url}/health",
            )
        )

    def waits(self) -> list[str]:
        """The states of the resume points on disk."""
        conn = sqlite3.connect(self.data / "node.db", timeout=5)
        try:
            return [state for (state,) in conn.execute("select state from mesh_waits")]
        finally:
            conn.close()

    async def client(self, http: httpx.AsyncClient) -> Client:
        card = await A2ACardResolver(http, self.url).get_agent_card()
        return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


class Desk:
    """The registry and every node of the loan desk, the underwriter included."""

    def __init__(self, tmp: Path, stack: contextlib.ExitStack) -> None:
        self.tmp = tmp
        self.stack = stack
        port = free_port()
        self.registry = f"http://127.0.0.1:{port}"
        self.env = clean_env(MESH_REGISTRY=self.registry, LOAN_DESK_DEADLINE_S="15")
        stack.enter_context(
            running(
                [
                    "mesh", "registry", "--port", str(port), "--data-dir", str(tmp / "reg"),
                    "--probe-interval", "0.5", "--probe-timeout", "0.4",
                ],
                name="registry", tmp=tmp, health=f"{self.registry}/health", env=self.env,
            )
        )  # fmt: skip
        self.bureau = Node(self, "credit-bureau", "agents.credit_bureau:agent")
        self.verifier = Node(self, "income-verifier", "agents.income_verifier:agent")
        self.underwriter = Node(self, "underwriter", "agents.underwriter:agent")
        self.officer = Node(self, "loan-officer", "agents.loan_officer:agent")
        for node in (self.bureau, self.verifier, self.underwriter, self.officer):
            node.start()


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    with contextlib.ExitStack() as stack:
        yield Desk(tmp_path_factory.mktemp("underwriting"), stack)


def the_question(task: Task) -> dict[str, Any]:
    (question,) = ext_of(task.status.message.metadata)["questions"]
    return dict(question)


def answer(task: Task, question_id: str, data: dict[str, Any]) -> Any:
    return message(data=data, task=task, metadata={"urn:mesh:tasks:v1": {"answers": question_id}})


def answer_text(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts if p.HasField("text"))


def delegations_to_the_underwriter(desk: Desk) -> int:
    """The officer's recent calls to the underwriter (its /introspect keeps the last 20)."""
    doc = httpx.get(f"{desk.officer.url}/introspect", timeout=5, trust_env=False).json()
    (peer,) = [p for p in doc["peers"] if p["name"] == "underwriter"]
    return len(peer["recent"])


async def waiting_for_the_underwriter(desk: Desk, http: httpx.AsyncClient) -> Task:
    task = await send(await desk.officer.client(http), message(text=BIG))
    assert task.status.state == WAITING, status_texts(task)
    assert status_texts(task) == [QUESTION]
    q = the_question(task)
    assert q["asker"]["agent"] == "underwriter"
    assert [hop["agent"] for hop in q["path"]] == ["underwriter"]
    return task


async def test_a_big_application_waits_for_the_underwriter_and_approve_completes_it(
    desk: Desk, http: httpx.AsyncClient
) -> None:
    task = await waiting_for_the_underwriter(desk, http)
    approval = {"decision": "approve", "note": "collateral checked"}
    done = await send(
        await desk.officer.client(http), answer(task, the_question(task)["id"], approval)
    )
    assert done.status.state == COMPLETED, status_texts(done)
    text = answer_text(done)
    assert "Meera Iyer (APP-738), loan of 600000 over 60 months: APPROVE." in text, text
    assert "\n- Underwriter: APPROVE (collateral checked).\nWhy: " in text, text
    assert text.endswith("Why: debt-to-income would be 51% (comfort limit 45%)."), text


async def test_decline_at_the_officer_is_the_underwriters_decision(
    desk: Desk, http: httpx.AsyncClient
) -> None:
    task = await waiting_for_the_underwriter(desk, http)
    decline = {"decision": "decline", "note": "exposure too high"}
    done = await send(
        await desk.officer.client(http), answer(task, the_question(task)["id"], decline)
    )
    assert done.status.state == COMPLETED, status_texts(done)
    text = answer_text(done)
    assert "loan of 600000 over 60 months: DECLINE." in text, text
    assert "\n- Underwriter: DECLINE (exposure too high).\nWhy: " in text, text


async def test_restarts_of_the_underwriter_and_the_officer_while_pending_lose_nothing(
    desk: Desk, http: httpx.AsyncClient
) -> None:
    task = await waiting_for_the_underwriter(desk, http)
    q = the_question(task)
    for node in (desk.underwriter, desk.officer):
        assert node.proc is not None
        node.proc.kill()
        assert "waiting" in node.waits(), node.name
        node.start()
    approval = {"decision": "approve", "note": "after the restart"}
    done = await send(await desk.officer.client(http), answer(task, q["id"], approval))
    assert done.status.state == COMPLETED, status_texts(done)
    assert "\n- Underwriter: APPROVE (after the restart).\n" in answer_text(done), done
    for node in (desk.officer, desk.underwriter):
        await eventually(lambda node=node: "waiting" not in node.waits(), within=10)


@pytest.mark.parametrize(
    "question",
    [
        "Should we approve APP-738 for 500,000 over 60 months?",  # at the threshold
        "Should we approve APP-612 for 600,000 over 60 months?",  # above it, but declined
    ],
)
async def test_a_small_or_declined_application_never_asks(
    desk: Desk, http: httpx.AsyncClient, question: str
) -> None:
    before = delegations_to_the_underwriter(desk)
    done = await send(await desk.officer.client(http), message(text=question))
    assert done.status.state == COMPLETED, status_texts(done)
    assert "Underwriter" not in answer_text(done)
    assert delegations_to_the_underwriter(desk) == before  # no hop at all

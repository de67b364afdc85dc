"""A mesh coordinator using a Google ADK agent served with ``to_a2a`` (issue 14 item 6): the ADK
agent (tests/adk_served.py, on the fake model of tests/adk_fakes.py) runs under uvicorn in a
subprocess; the coordinator (tests/adk_agents.py) reaches it through ``remote(url)``, blocking and
streamed, and the ADK agent keeps the conversation across the coordinator's turns.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from mesh import A2APeer
from mesh._a2a.client import TaskUpdate
from tests.adk_agents import ADK_TOOL
from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adk_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the ADK agent (uvicorn serving to_a2a's app)."""
    tmp = tmp_path_factory.mktemp("adk-served")
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "tests.adk_served:app"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    # The notice is for whoever reads the log: ADK's own switch for it.
    env = clean_env(ADK_PORT=str(port), ADK_SUPPRESS_A2A_EXPERIMENTAL_FEATURE_WARNINGS="true")
    url = f"http://127.0.0.1:{port}"
    with running(argv, name="adk", tmp=tmp, health=f"{url}/.well-known/agent-card.json", env=env):
        yield url


@pytest.fixture(scope="module")
def coordinator(adk_agent: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("adk-coordinator")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "tests.adk_agents:coordinator", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data"), "--no-register"]
    env = clean_env(ADK_AGENT_URL=adk_agent)
    with running(argv, name="coordinator", tmp=tmp, health=f"{url}/health", env=env):
        yield url


@pytest.fixture
async def peer(coordinator: str) -> AsyncIterator[A2APeer]:
    async with httpx.AsyncClient(timeout=30) as http:
        peer = A2APeer(http, coordinator)
        yield peer
        await peer.aclose()


def test_the_adk_card_is_one_text_skill(adk_agent: str) -> None:
    """What the coordinator's script relies on: one skill named after the agent, text in and
    out, so ``remote(url)`` makes it the text tool ``adk_helper_adk_helper``."""
    card = httpx.get(f"{adk_agent}/.well-known/agent-card.json", timeout=10).json()
    assert card["name"] == "adk_helper"
    assert [s["id"] for s in card["skills"]] == ["adk_helper"]
    assert card["defaultInputModes"] == card["defaultOutputModes"] == ["text/plain"]
    assert ADK_TOOL == "adk_helper_adk_helper"


async def test_blocking_calls_keep_the_adk_conversation(peer: A2APeer) -> None:
    first = await peer.send("ask the helper: one")
    assert first.state == "completed", first.error
    assert first.text == "helper answered: heard: one | earlier: -"

    second = await peer.send("ask the helper: two", context_id=first.context_id)
    assert second.state == "completed", second.error
    assert second.text == "helper answered: heard: two | earlier: one"

    # Another conversation of the coordinator is another conversation of the ADK agent.
    other = await peer.send("ask the helper: three")
    assert other.text == "helper answered: heard: three | earlier: -"


async def test_a_streamed_call_relays_the_adk_agents_text(peer: A2APeer) -> None:
    first = await peer.send("ask the helper: one")
    assert first.state == "completed", first.error

    updates: list[TaskUpdate] = [
        u async for u in peer.stream("ask the helper: two", context_id=first.context_id)
    ]

    assert updates[-1].state == "completed", updates
    answer = "helper answered: heard: two | earlier: one"
    before_the_end = [u.text for u in updates[:-1] if u.text]
    # The ADK agent's own text arrives while the coordinator still works, then the answer.
    assert any(t.startswith("heard: two") for t in before_the_end), before_the_end
    final = await peer.get_task(updates[-1].task_id)
    assert final.text == answer, final
    assert "".join(u.text for u in updates if u.partial) in {"", answer}

"""Google ADK as a client of mesh nodes (issue 14): an ADK ``RemoteA2aAgent``, used directly and
as an ``AgentTool`` of an ADK ``LlmAgent``, calls a mesh typed skill and a mesh LLM agent, with
the mesh token and without; the card a mesh node serves reads with a2a-sdk's parser and ADK's.

The mesh nodes are real processes (``mesh serve tests.adk_agents:...``); ADK runs here, in its
``InMemoryRunner``, on a fake model (tests/adk_fakes.py): no network, no key. What ADK sends is
text only (no data part, no skill named), so a typed skill must take a JSON object in text and
answer with text a text-only client can read (items 2 and 4 of the issue).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types import AgentCard
from fastapi.openapi.models import HTTPBearer
from google.adk.agents import BaseAgent, LlmAgent
from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
from google.adk.auth.auth_credential import (
    AuthCredential,
    AuthCredentialTypes,
    HttpAuth,
    HttpCredentials,
)
from google.adk.events import Event
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types
from google.protobuf.json_format import ParseDict

from tests.adk_fakes import ToolCaller
from tests.support import ROOT, clean_env, free_port, running

pytestmark = pytest.mark.integration

TOKEN = "adk-interop-token-3e7a"
CONVERT = {"amount": 10, "currency": "USD"}
CONVERTED = {"amount": 10.0, "currency": "USD", "eur": 5.0}
# Each ADK run is bounded: a refused or broken call must surface, never hang.
RUN_TIMEOUT_S = 60.0


def _serve(tmp: Path, agent: str, token: str | None) -> Iterator[int]:
    port = free_port()
    argv = ["mesh", "serve", f"tests.adk_agents:{agent}", "--port", str(port)]
    argv += ["--data-dir", str(tmp / agent), "--no-register"]
    env = clean_env(**({"MESH_TOKEN": token} if token else {}))
    with running(argv, name=agent, tmp=tmp, health=f"http://127.0.0.1:{port}/health", env=env):
        yield port


@pytest.fixture(scope="module")
def quotes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of a node with one typed skill (convert), requiring the mesh token."""
    yield from _serve(tmp_path_factory.mktemp("adk-quotes"), "quotes", TOKEN)


@pytest.fixture(scope="module")
def chatter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of an LLM agent node (scripted model), requiring the mesh token."""
    yield from _serve(tmp_path_factory.mktemp("adk-chatter"), "chatter", TOKEN)


def card_url(port: int, host: str = "localhost") -> str:
    return f"http://{host}:{port}/.well-known/agent-card.json"


def bearer(token: str = TOKEN) -> dict[str, Any]:
    """What an ADK RemoteA2aAgent needs to send the mesh token (docs/interop.md, "Auth").
    ``credential_key`` named: without it ADK derives one through its own deprecated method
    (a DeprecationWarning from inside google-adk 2.13 on every agent built)."""
    return {
        "credential_key": f"mesh-token-{token}",
        "auth_scheme": HTTPBearer(),
        "auth_credential": AuthCredential(
            auth_type=AuthCredentialTypes.HTTP,
            http=HttpAuth(scheme="bearer", credentials=HttpCredentials(token=token)),
        ),
    }


async def run_adk(agent: BaseAgent, text: str) -> list[Event]:
    """One user turn through ADK's InMemoryRunner; every event it yields. The RemoteA2aAgents
    in it are cleaned up after: the runner's ``close`` leaves their HTTP clients open."""
    runner = InMemoryRunner(agent=agent, app_name="interop")
    remotes = [agent] if isinstance(agent, RemoteA2aAgent) else []
    if isinstance(agent, LlmAgent):
        remotes += [
            tool.agent
            for tool in agent.tools
            if isinstance(tool, AgentTool) and isinstance(tool.agent, RemoteA2aAgent)
        ]
    try:
        session = await runner.session_service.create_session(app_name="interop", user_id="u1")
        message = types.Content(role="user", parts=[types.Part(text=text)])

        async def collect() -> list[Event]:
            return [
                event
                async for event in runner.run_async(
                    user_id="u1", session_id=session.id, new_message=message
                )
            ]

        return await asyncio.wait_for(collect(), RUN_TIMEOUT_S)
    finally:
        await runner.close()
        for remote in remotes:
            await remote.cleanup()


def texts(events: list[Event], author: str) -> list[str]:
    """The answer texts ``author``'s complete (not partial) events carried, in order (ADK turns
    a task's WORKING status messages into ``thought`` parts: not answers)."""
    return [
        part.text
        for event in events
        if event.author == author and not event.partial and event.content
        for part in event.content.parts or ()
        if part.text and not part.thought
    ]


def errors(events: list[Event]) -> list[str]:
    return [event.error_message for event in events if event.error_message]


def holds_converted(text: str) -> bool:
    """The text is a rendering of the typed result: a JSON object equal to it."""
    try:
        return bool(json.loads(text) == CONVERTED)
    except ValueError:
        return False


# -- the card -----------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_the_card_parses_with_the_sdk_and_names_the_origin_it_was_fetched_from(
    quotes: int, host: str
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        raw = (await http.get(card_url(quotes, host))).json()
        card = await A2ACardResolver(http, f"http://{host}:{quotes}").get_agent_card()
    # Strict too: every field the card has is one of the protocol's AgentCard.
    ParseDict(raw, AgentCard(), ignore_unknown_fields=False)
    assert card.name == "quotes"
    assert [skill.id for skill in card.skills] == ["convert"]
    assert card.supported_interfaces, "the card lists no interface"
    for interface in card.supported_interfaces:
        assert interface.url.startswith(f"http://{host}:{quotes}"), interface


async def test_adk_reads_the_card_from_a_file_and_calls_the_node(
    chatter: int, tmp_path: Path
) -> None:
    """ADK's own reading of a card (a card kept in a file goes through ADK's parser, not the
    a2a-sdk resolver), then a call to the URL it names."""
    async with httpx.AsyncClient(timeout=10) as http:
        raw = (await http.get(card_url(chatter, "127.0.0.1"))).json()
    path = tmp_path / "chatter-card.json"
    path.write_text(json.dumps(raw))
    remote = RemoteA2aAgent(name="chatter", agent_card=str(path), **bearer())

    events = await run_adk(remote, "hello, Ada")

    assert not errors(events), errors(events)
    assert "Hello Ada, from the mesh." in texts(events, "chatter")
    assert remote.description == raw["description"]


# -- RemoteA2aAgent used directly ---------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_remote_agent_talks_to_a_mesh_llm_agent(chatter: int, host: str) -> None:
    remote = RemoteA2aAgent(name="chatter", agent_card=card_url(chatter, host), **bearer())

    events = await run_adk(remote, "hello, Ada")

    assert not errors(events), errors(events)
    assert "Hello Ada, from the mesh." in texts(events, "chatter")


async def test_remote_agent_calls_a_typed_skill_with_json_text(quotes: int) -> None:
    """ADK sends the JSON object as text, naming no skill: the node's only typed skill takes it,
    and the answer carries a text rendering of the typed result (ADK reads text)."""
    remote = RemoteA2aAgent(name="quotes", agent_card=card_url(quotes), **bearer())

    events = await run_adk(remote, json.dumps(CONVERT))

    assert not errors(events), errors(events)
    answers = texts(events, "quotes")
    assert any(holds_converted(text) for text in answers), answers


@pytest.mark.parametrize("agent", ["quotes", "chatter"])
async def test_without_the_token_adk_surfaces_a_401(quotes: int, chatter: int, agent: str) -> None:
    port = {"quotes": quotes, "chatter": chatter}[agent]
    remote = RemoteA2aAgent(name=agent, agent_card=card_url(port))

    events = await run_adk(remote, json.dumps(CONVERT) if agent == "quotes" else "hello, Ada")

    assert any("401" in error for error in errors(events)), [e.model_dump() for e in events]
    assert not texts(events, agent)


async def test_a_wrong_token_is_refused_too(chatter: int) -> None:
    remote = RemoteA2aAgent(name="chatter", agent_card=card_url(chatter), **bearer("not-it"))

    events = await run_adk(remote, "hello, Ada")

    assert any("401" in error for error in errors(events)), [e.model_dump() for e in events]


# -- RemoteA2aAgent as an AgentTool of an ADK LlmAgent --------------------------------------------


async def test_agent_tool_gets_the_typed_result_as_text(quotes: int) -> None:
    """AgentTool hands the parent model the text of the remote answer only: it must hold the
    typed result (before issue 14 the model got {"result": ""})."""
    remote = RemoteA2aAgent(name="quotes", agent_card=card_url(quotes), **bearer())
    model = ToolCaller(tool="quotes", args={"request": json.dumps(CONVERT)})
    parent = LlmAgent(
        name="planner", model=model, instruction="Convert.", tools=[AgentTool(agent=remote)]
    )

    events = await run_adk(parent, "What are 10 USD in euros?")

    assert not errors(events), errors(events)
    assert len(model.seen) == 1, model.seen
    assert holds_converted(model.seen[0]["result"]), model.seen
    assert texts(events, "planner")[-1].startswith("The tool said:")


async def test_agent_tool_talks_to_a_mesh_llm_agent(chatter: int) -> None:
    remote = RemoteA2aAgent(name="chatter", agent_card=card_url(chatter), **bearer())
    model = ToolCaller(tool="chatter", args={"request": "hello, Grace"})
    parent = LlmAgent(
        name="planner", model=model, instruction="Greet.", tools=[AgentTool(agent=remote)]
    )

    events = await run_adk(parent, "Say hello to Grace")

    assert not errors(events), errors(events)
    assert model.seen == [{"result": "Hello Grace, from the mesh."}]


async def test_agent_tool_without_the_token_gives_the_model_the_401(chatter: int) -> None:
    remote = RemoteA2aAgent(name="chatter", agent_card=card_url(chatter))
    model = ToolCaller(tool="chatter", args={"request": "hello, Grace"})
    parent = LlmAgent(
        name="planner", model=model, instruction="Greet.", tools=[AgentTool(agent=remote)]
    )

    await run_adk(parent, "Say hello to Grace")

    assert len(model.seen) == 1, model.seen
    assert "401" in model.seen[0]["result"], model.seen


# -- google-adk stays a test dependency ---------------------------------------------------------


def test_the_runtime_never_imports_adk() -> None:
    """Every module of mesh, the registry and the example agents imported: no google.adk
    among what loaded (lint-imports cannot name a subpackage of ``google``; pyproject.toml)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "for top in ('mesh', 'registry', 'agents'):\n"
        "    package = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'google.adk' or m.startswith('google.adk.'))\n"
        "print(len(sys.modules), loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

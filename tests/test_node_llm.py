"""An LLM node (the assistant, on the scripted model): conversations by contextId, typed LLM
skills validated against their output model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mesh._a2a.client import A2APeer
from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def assistant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("assistant")
    port = free_port()
    argv = ["mesh", "serve", "agents.assistant:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data")]
    url = f"http://127.0.0.1:{port}"
    with running(argv, name="assistant", tmp=tmp, env=clean_env(), health=url + "/health"):
        yield url


async def test_follow_up_in_the_same_context_remembers(assistant: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, assistant)
        first = await peer.send("my name is Ada")
        assert first.ok
        assert "Ada" in first.text
        follow = await peer.send("what is my name?", context_id=first.context_id)
        assert follow.text == "Your name is Ada."
        assert follow.context_id == first.context_id
        other = await peer.send("what is my name?")
        assert "Ada" not in other.text
        assert follow.metadata["usage"]["inputTokens"] > 0
        await peer.aclose()


async def test_typed_llm_skill_returns_the_output_model(assistant: str) -> None:
    from agents.assistant import Summary

    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, assistant)
        result = await peer.send({"text": "hello world", "max_words": 3}, skill="summarize")
        assert result.ok, result.error
        summary = Summary.model_validate(result.data)
        assert summary.words == 3
        bad = await peer.send({"max_words": 3}, skill="summarize")
        assert bad.state == "rejected"
        assert bad.error is not None
        assert "text" in bad.error["message"]
        await peer.aclose()


async def test_chat_streams_tool_progress_and_text(assistant: str) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, assistant)
        updates = [u async for u in peer.stream("convert 100 eur to usd")]
        assert any(u.kind == "status" and "convert" in u.text for u in updates)
        # The model's text arrives as chunks of the answer artifact, closed by the whole of it.
        chunks = [u for u in updates if u.kind == "artifact" and not u.last_chunk]
        assert len(chunks) >= 2
        assert chunks[0].append is False
        assert chunks[1].append is True
        assert "".join(u.text for u in chunks) == "100 EUR is 108 USD."
        artifact = next(u for u in updates if u.kind == "artifact" and u.last_chunk)
        assert artifact.text == "100 EUR is 108 USD."
        assert artifact.artifact_id == chunks[0].artifact_id
        assert artifact.append is False
        assert not [u for u in updates if u.kind == "status" and u.partial]
        assert updates[-1].state == "completed"
        await peer.aclose()


async def test_metrics_count_model_and_tool_calls(assistant: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, assistant)
        await peer.send("convert 5 gbp to eur")
        await peer.aclose()
        text = (await http.get(assistant + "/metrics")).text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    tools = [s for s in samples if s.name == "mesh_tool_calls_total"]
    assert any(
        s.labels == {"agent": "assistant", "tool": "convert", "outcome": "ok"} for s in tools
    )
    models = [s for s in samples if s.name == "mesh_model_calls_total" and s.value > 0]
    assert any(s.labels["model"] == "scripted" for s in models)
    tokens = [s for s in samples if s.name == "mesh_tokens_total" and s.labels["kind"] == "input"]
    assert tokens
    assert tokens[0].value > 0


@pytest.mark.parametrize(
    ("target", "repaired"),
    [("tests.node_agents:reviewer", True), ("tests.node_agents:stubborn_reviewer", False)],
)
async def test_llm_skill_output_gets_one_repair_attempt(
    tmp_path: Path, target: str, repaired: bool
) -> None:
    port = free_port()
    argv = ["mesh", "serve", target, "--port", str(port), "--data-dir", str(tmp_path / "d")]
    url = f"http://127.0.0.1:{port}"
    with running(argv, name="reviewer", tmp=tmp_path, env=clean_env(), health=url + "/health"):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, url)
            result = await peer.send({"text": "a draft"}, skill="review")
            await peer.aclose()
    if repaired:
        assert result.ok, result.error
        assert result.data == {"verdict": "ok", "notes": "repaired"}
        # The task reports the usage of the turn (both model calls).
        assert result.metadata["usage"]["outputTokens"] > 0
    else:
        assert result.state == "failed"
        assert result.error is not None
        assert "verdict" in result.error["message"]
        assert "after one repair attempt" in result.error["message"]

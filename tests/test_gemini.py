"""GeminiModel through the real google-genai SDK against a Gemini-speaking server on 127.0.0.1."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing
from typing import Any, cast

import pytest

from mesh._errors import ConfigError, ModelError, ModelRateLimited
from mesh._models.base import ModelRequest, ModelResponse, ToolDeclaration
from mesh._models.gemini import GeminiModel
from mesh._types import Content, FunctionResponse, Part
from tests.fakes.gemini_server import FakeGemini, call_response, text_response, usage
from tests.support import ROOT, free_port

MODEL = "gemini-test"

# Read before the suite's env isolation runs: only the real-API test uses it.
_REAL_KEY = os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY")

WEATHER = ToolDeclaration(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)

# Bytes whose standard base64 uses '+' and '/', so an alphabet mix-up would show.
SIGNATURE = bytes([0xFB, 0xFF, 0xBF, 0x01, 0x02, 0x03])
SIGNATURE_B64 = base64.b64encode(SIGNATURE).decode()


@pytest.fixture(autouse=True)
def _no_sdk_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Beyond the suite-wide list: variables that would change the SDK's transport or target.
    for name in ("GOOGLE_GENAI_HTTP_CLIENT", "GOOGLE_VERTEX_BASE_URL", "GOOGLE_GENAI_CLIENT_MODE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


@pytest.fixture
async def make_model(fake: FakeGemini) -> AsyncIterator[Callable[..., GeminiModel]]:
    models: list[GeminiModel] = []

    def make(**overrides: Any) -> GeminiModel:
        kwargs: dict[str, Any] = {
            "api_key": "test-key",
            "base_url": fake.url,
            "retries": 1,
            "retry_delay_s": 0.01,
            "timeout_s": 10.0,
        }
        kwargs.update(overrides)
        model = GeminiModel(MODEL, **kwargs)
        models.append(model)
        return model

    yield make
    for model in models:
        await model.aclose()


def ask(text: str = "Weather in Paris?", **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        system_instruction="You are terse.",
        contents=(Content.user(text),),
        tools=(WEATHER,),
        **kwargs,
    )


def with_tool_result(request: ModelRequest, turn: Content, result: Any) -> ModelRequest:
    call = turn.function_calls[0]
    answer = Part(
        function_response=FunctionResponse(id=call.id, name=call.name, response={"result": result})
    )
    contents = (*request.contents, turn, Content(role="user", parts=(answer,)))
    return request.model_copy(update={"contents": contents})


def decoded(signature: str) -> bytes:
    """Wire base64 in either alphabet (the SDK re-encodes URL-safe; Google accepts both)."""
    return base64.urlsafe_b64decode(signature.replace("+", "-").replace("/", "_"))


async def collect(model: GeminiModel, request: ModelRequest) -> list[ModelResponse]:
    return [chunk async for chunk in model.stream(request)]


# -- the tool loop -------------------------------------------------------------------------------


@pytest.mark.integration
async def test_function_call_then_text_round_trips_id_and_signature(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    model = make_model()
    fake.reply(
        call_response(
            "get_weather", {"city": "Paris"}, id="call-7", thought_signature=SIGNATURE_B64
        )
    )
    fake.reply(text_response("Sunny, 21C.", usage=usage(prompt=30, candidates=4)))

    first = await model.generate(ask())
    call = first.content.function_calls[0]
    assert (call.id, call.name, call.args) == ("call-7", "get_weather", {"city": "Paris"})
    assert first.content.parts[0].thought_signature == SIGNATURE_B64

    second = await model.generate(with_tool_result(ask(), first.content, {"sky": "sunny"}))
    assert second.content.text == "Sunny, 21C."
    assert second.finish_reason == "STOP"

    wire = fake.requests[1]
    assert wire.path == f"/v1beta/models/{MODEL}:generateContent"
    assert wire.headers["x-goog-api-key"] == "test-key"
    assert [c["role"] for c in wire.contents] == ["user", "model", "user"]
    model_part = wire.contents[1]["parts"][0]
    assert model_part["functionCall"] == {
        "id": "call-7",
        "name": "get_weather",
        "args": {"city": "Paris"},
    }
    # Byte-for-byte, whatever base64 alphabet carried it.
    assert decoded(model_part["thoughtSignature"]) == SIGNATURE
    assert wire.contents[2]["parts"][0]["functionResponse"] == {
        "id": "call-7",
        "name": "get_weather",
        "response": {"result": {"sky": "sunny"}},
    }


@pytest.mark.integration
async def test_missing_call_id_is_generated_then_stripped_on_the_wire(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    model = make_model()
    fake.reply(call_response("get_weather", {"city": "Oslo"}))
    fake.reply(call_response("get_weather", {"city": "Rome"}))
    fake.reply(text_response("ok"))

    first = await model.generate(ask())
    second = await model.generate(ask())
    ids = [first.content.function_calls[0].id, second.content.function_calls[0].id]
    assert all(ids)
    assert ids[0] != ids[1]

    await model.generate(with_tool_result(ask(), first.content, 3))
    wire = fake.requests[2].contents
    assert wire[1]["parts"][0]["functionCall"] == {"name": "get_weather", "args": {"city": "Oslo"}}
    assert wire[2]["parts"][0]["functionResponse"] == {
        "name": "get_weather",
        "response": {"result": 3},
    }


@pytest.mark.integration
async def test_system_instruction_tools_and_config_on_the_wire(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.reply(text_response("hi"))
    await make_model().generate(ask(temperature=0.0, max_output_tokens=64))

    wire = fake.requests[0]
    assert wire.body["systemInstruction"]["parts"] == [{"text": "You are terse."}]
    assert wire.function_declarations == [
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parametersJsonSchema": WEATHER.parameters,
        }
    ]
    assert wire.body["generationConfig"] == {"temperature": 0.0, "maxOutputTokens": 64}
    assert "toolConfig" not in wire.body  # automatic function calling is the SDK's, not the API's


@pytest.mark.integration
async def test_response_schema_asks_for_json(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    schema = {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}},
        "required": ["approved"],
    }
    fake.reply(text_response('{"approved": true}'))
    response = await make_model().generate(
        ModelRequest(contents=(Content.user("decide"),), response_schema=schema)
    )
    assert response.content.text == '{"approved": true}'

    config = fake.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config.get("responseJsonSchema", config.get("response_json_schema")) == schema
    assert "tools" not in fake.requests[0].body


@pytest.mark.integration
async def test_thought_parts_are_kept_apart_and_sent_back(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    model = make_model()
    fake.reply(
        text_response(
            "42", thought="Let me think.", thought_signature=SIGNATURE_B64, usage=usage(5, 1, 9)
        )
    )
    fake.reply(text_response("again"))

    first = await model.generate(ModelRequest(contents=(Content.user("q"),)))
    thought, answer = first.content.parts
    assert (thought.text, thought.thought) == ("Let me think.", True)
    assert (answer.text, answer.thought, answer.thought_signature) == ("42", False, SIGNATURE_B64)
    assert first.content.text == "42"
    assert first.usage is not None
    assert first.usage.thinking_tokens == 9

    follow_up = (Content.user("q"), first.content, Content.user("and?"))
    await model.generate(ModelRequest(contents=follow_up))
    sent = fake.requests[1].contents[1]["parts"]
    assert sent[0] == {"text": "Let me think.", "thought": True}
    assert sent[1]["text"] == "42"
    assert decoded(sent[1]["thoughtSignature"]) == SIGNATURE


@pytest.mark.integration
async def test_usage_metadata_mapped(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.reply(
        text_response(
            "x", usage=usage(prompt=100, candidates=20, thoughts=7, cached=40, tool_use=3)
        )
    )
    response = await make_model().generate(ModelRequest(contents=(Content.user("q"),)))
    assert response.usage is not None
    assert response.usage.as_dict() == {
        "input_tokens": 103,  # prompt + tool-use prompt
        "output_tokens": 20,
        "cached_tokens": 40,
        "thinking_tokens": 7,
        "total_tokens": 130,
    }
    assert response.model_version == "gemini-fake-001"


# -- streaming -----------------------------------------------------------------------------------


@pytest.mark.integration
async def test_stream_yields_deltas_then_one_final_with_last_usage(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.stream(
        [
            text_response("", thought="Hmm.", finish=None, usage=usage(prompt=18)),
            text_response("Echo: ", finish=None, usage=usage(prompt=18, candidates=2)),
            text_response("world", usage=usage(prompt=18, candidates=10, thoughts=4)),
        ]
    )
    chunks = await collect(make_model(), ModelRequest(contents=(Content.user("world"),)))

    assert fake.requests[0].path == f"/v1beta/models/{MODEL}:streamGenerateContent"
    assert fake.requests[0].query == {"alt": "sse"}
    *partials, final = chunks
    assert [c.partial for c in chunks] == [True] * len(partials) + [False]
    assert "".join(c.content.text for c in partials) == "Echo: world"
    assert all(c.usage is None for c in partials)
    assert final.content.text == "Echo: world"
    assert [p.thought for p in final.content.parts if p.text] == [True, False]
    # The last chunk's running total, not a sum over the three chunks.
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (18, 10)
    assert (final.usage.thinking_tokens, final.usage.total_tokens) == (4, 32)
    assert final.finish_reason == "STOP"


@pytest.mark.integration
async def test_stream_function_call_keeps_generated_id(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.stream(
        [
            text_response("Checking. ", finish=None),
            call_response("get_weather", {"city": "Lima"}, thought_signature=SIGNATURE_B64),
        ]
    )
    *partials, final = await collect(make_model(), ask())
    streamed = [c for p in partials for c in p.content.function_calls]
    assert len(streamed) == 1
    assert final.content.function_calls == streamed
    assert final.content.text == "Checking. "
    assert final.content.parts[-1].thought_signature == SIGNATURE_B64


@pytest.mark.integration
async def test_stream_stopped_early_closes_cleanly(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.stream([text_response("a", finish=None), text_response("b")])
    model = make_model()
    # Gemini's stream() is an async generator; the base type only promises an iterator.
    chunks = cast(
        AsyncGenerator[ModelResponse, None],
        model.stream(ModelRequest(contents=(Content.user("q"),))),
    )
    async with aclosing(chunks) as stream:
        async for chunk in stream:
            assert chunk.content.text == "a"
            break
    fake.reply(text_response("next"))  # the client is still usable afterwards
    assert (
        await model.generate(ModelRequest(contents=(Content.user("q"),)))
    ).content.text == "next"


@pytest.mark.integration
async def test_stream_http_error_is_translated(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.fail(503, "overloaded")
    with pytest.raises(ModelError, match="overloaded") as info:
        await collect(make_model(), ModelRequest(contents=(Content.user("q"),)))
    assert (info.value.status, info.value.retryable) == (503, True)


# -- errors and retries --------------------------------------------------------------------------


@pytest.mark.integration
async def test_429_is_rate_limited_after_the_retries(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.fail(429, "quota exceeded")
    fake.fail(429, "quota exceeded")
    with pytest.raises(ModelRateLimited, match="quota exceeded") as info:
        await make_model(retries=2).generate(ModelRequest(contents=(Content.user("q"),)))
    assert info.value.status == 429
    assert len(fake.requests) == 2


@pytest.mark.integration
async def test_503_succeeds_after_one_retry(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.fail(503, "try again")
    fake.reply(text_response("recovered"))
    response = await make_model(retries=2).generate(ModelRequest(contents=(Content.user("q"),)))
    assert response.content.text == "recovered"
    assert len(fake.requests) == 2


@pytest.mark.integration
async def test_503_every_time_fails_as_retryable_model_error(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    for _ in range(3):
        fake.fail(503, "down")
    with pytest.raises(ModelError) as info:
        await make_model(retries=2).generate(ModelRequest(contents=(Content.user("q"),)))
    assert not isinstance(info.value, ModelRateLimited)
    assert (info.value.status, info.value.retryable) == (503, True)
    assert len(fake.requests) == 2
    assert fake.pending == 1


@pytest.mark.integration
async def test_400_is_not_retried(fake: FakeGemini, make_model: Callable[..., GeminiModel]) -> None:
    fake.fail(400, "contents[0].parts: must not be empty")
    fake.reply(text_response("never sent"))
    with pytest.raises(ModelError, match=r"contents\[0\]\.parts") as info:
        await make_model(retries=3).generate(ModelRequest(contents=(Content.user("q"),)))
    assert (info.value.status, info.value.retryable) == (400, False)
    assert len(fake.requests) == 1


@pytest.mark.integration
async def test_timeout_becomes_model_error(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.reply(text_response("too late"), delay_s=3.0)
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"timeout_s=0\.3") as info:
        await make_model(timeout_s=0.3).generate(ModelRequest(contents=(Content.user("q"),)))
    assert time.monotonic() - started < 2.5
    assert info.value.retryable
    assert info.value.status is None


@pytest.mark.integration
async def test_unreachable_server_becomes_model_error(
    make_model: Callable[..., GeminiModel],
) -> None:
    model = make_model(base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ModelError, match=r"cannot reach http://127\.0\.0\.1") as info:
        await model.generate(ModelRequest(contents=(Content.user("q"),)))
    assert info.value.retryable


@pytest.mark.integration
async def test_blocked_prompt_is_a_model_error(
    fake: FakeGemini, make_model: Callable[..., GeminiModel]
) -> None:
    fake.reply({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage(prompt=3)})
    with pytest.raises(ModelError, match="blocked the prompt: SAFETY"):
        await make_model().generate(ModelRequest(contents=(Content.user("q"),)))


# -- configuration -------------------------------------------------------------------------------


def test_no_key_anywhere_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GOOGLE_API_KEY"):
        GeminiModel(MODEL)


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="retries"):
        GeminiModel(MODEL, api_key="k", retries=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        GeminiModel(MODEL, api_key="k", timeout_s=0)


@pytest.mark.integration
async def test_key_from_env_is_read_by_the_sdk(
    fake: FakeGemini, make_model: Callable[..., GeminiModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "env-key")
    fake.reply(text_response("ok"))
    await make_model(api_key=None).generate(ModelRequest(contents=(Content.user("q"),)))
    assert fake.requests[0].headers["x-goog-api-key"] == "env-key"


async def test_describe_never_shows_the_key() -> None:
    model = GeminiModel(
        MODEL, api_key="sk-secret-123", base_url="http://user:pw@127.0.0.1:1/", retries=2
    )
    try:
        facts = model.describe()
    finally:
        await model.aclose()
    assert "sk-secret-123" not in repr(facts)
    assert "pw@" not in repr(facts)
    assert facts == {
        "name": MODEL,
        "kind": "GeminiModel",
        "provider": "gemini-api",
        "api_version": "v1beta",
        "timeout_s": 60.0,
        "retries": 2,
        "base_url": "http://127.0.0.1:1/",
    }


@pytest.mark.integration
def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, mesh._models.gemini; print('google.genai' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "False"
    assert "google.genai" not in out.stderr


# -- the real service ----------------------------------------------------------------------------


@pytest.mark.gemini
@pytest.mark.skipif(not _REAL_KEY, reason="needs GOOGLE_API_KEY and network")
async def test_real_gemini_tool_loop_and_stream() -> None:
    model = GeminiModel(
        os.environ.get("MESH_GEMINI_TEST_MODEL", "gemini-2.5-flash"),
        api_key=_REAL_KEY,
        timeout_s=60.0,
    )
    try:
        request = ask("Use the tool: what is the weather in Paris?", temperature=0.0)
        first = await model.generate(request)
        assert first.content.function_calls, first
        assert first.content.function_calls[0].name == "get_weather"
        second = await model.generate(
            with_tool_result(request, first.content, {"sky": "sunny", "temp_c": 21})
        )
        assert "21" in second.content.text
        assert second.usage is not None
        assert second.usage.input_tokens > 0

        chunks = await collect(model, ModelRequest(contents=(Content.user("Count to five."),)))
        assert [c.partial for c in chunks][-1] is False
        assert sum(1 for c in chunks if c.usage is not None) == 1
        assert "5" in chunks[-1].content.text or "five" in chunks[-1].content.text.lower()
    finally:
        await model.aclose()

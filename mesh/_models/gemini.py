"""``GeminiModel``: the Gemini API (or Vertex AI) through the google-genai async client.

This is the only module that imports ``google.genai``, and it does so lazily: the SDK costs
about half a second to import, and a node running the scripted model should not pay it.
Everything that crosses this module's edge is a ``mesh._types`` / ``mesh._models.base`` value;
google-genai types and errors never leak out.

    model = GeminiModel("gemini-2.5-flash", api_key=key)
    response = await model.generate(ModelRequest(contents=(Content.user("hi"),)))
    await model.aclose()

Wire facts this module relies on (checked against google-genai 3.6):

- ``api_version`` is pinned (``v1beta``; ``v1beta1`` on Vertex): the SDK's default moved from
  ``v1beta`` to ``v1`` in 3.0.
- the SDK has no timeout and no retries by default; both are set explicitly here.
- ``functionCall.id`` is optional on the wire. When Gemini omits it we make one up (prefix
  ``mesh-``) so the runner can pair calls with responses, and strip it again on the way back,
  since Gemini never saw it.
- ``thoughtSignature`` is bytes in the SDK and an opaque base64 string in ``mesh._types.Part``;
  it must come back byte-for-byte on the next turn.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sys
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pydantic

from mesh._errors import ConfigError, ModelError, ModelRateLimited
from mesh._models.base import Model, ModelRequest, ModelResponse
from mesh._types import Content, FunctionCall, FunctionResponse, Part, Usage

if TYPE_CHECKING:
    from google.genai import types as genai_types

__all__ = ["GeminiModel"]

log = logging.getLogger(__name__)

# Ids we invent for function calls that arrived without one. Stateless on purpose: sessions
# outlive the process, so "did Gemini send this id?" must be readable from the id itself.
_GENERATED_ID_PREFIX = "mesh-"

_GEMINI_API_VERSION = "v1beta"
_VERTEX_API_VERSION = "v1beta1"


class GeminiModel(Model):
    """A Gemini model served by the Gemini Developer API or, with ``vertex=True``, Vertex AI.

    ``api_key=None`` lets the SDK read ``GOOGLE_API_KEY`` / ``GEMINI_API_KEY`` itself; entry
    points should read the environment and pass the key in. ``vertex`` is never taken from
    the environment (pass ``vertex=True`` with ``project``/``location``, or an express-mode key).
    ``retries`` is the number of attempts including the first (408/429/5xx, timeouts and
    connection errors are retried with exponential back-off starting at ``retry_delay_s``).
    ``timeout_s`` bounds each attempt.

    Raises ``ConfigError`` at construction when the SDK finds no credentials.
    """

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        vertex: bool = False,
        project: str | None = None,
        location: str | None = None,
        retry_delay_s: float = 1.0,
    ) -> None:
        if not name:
            raise ConfigError("GeminiModel needs a model name, e.g. 'gemini-2.5-flash'")
        if timeout_s <= 0:
            raise ConfigError(f"GeminiModel timeout_s must be > 0, got {timeout_s}")
        if retries < 1:
            raise ConfigError(
                f"GeminiModel retries counts attempts and must be >= 1, got {retries}"
            )
        from google import genai
        from google.genai import types

        self.name = name
        self.timeout_s = timeout_s
        self.retries = retries
        self.vertex = vertex
        self.project = project
        self.location = location
        self.base_url = base_url
        self.api_version = _VERTEX_API_VERSION if vertex else _GEMINI_API_VERSION
        http_options = types.HttpOptions(
            base_url=base_url,
            api_version=self.api_version,
            timeout=max(1, round(timeout_s * 1000)),  # the SDK wants milliseconds
            retry_options=types.HttpRetryOptions(
                attempts=retries,
                initial_delay=retry_delay_s,
                max_delay=max(retry_delay_s, 30.0),
                jitter=retry_delay_s,
            ),
        )
        try:
            self._client = genai.Client(
                api_key=api_key,
                vertexai=vertex,
                project=project,
                location=location,
                http_options=http_options,
            )
        except Exception as exc:  # ValueError (no key) or google.auth's DefaultCredentialsError
            where = "Vertex AI (project/location or credentials)" if vertex else "GOOGLE_API_KEY"
            raise ConfigError(
                f"cannot create Gemini client for {name!r}: {exc} Set {where}, or use the "
                "scripted model for offline runs."
            ) from exc

    # -- Model -----------------------------------------------------------------------------

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """One complete response."""
        contents, config = _to_genai(request)
        try:
            resp = await self._client.aio.models.generate_content(
                model=self.name, contents=contents, config=config
            )
        except Exception as exc:
            raise self._translate(exc) from exc
        candidate = _first_candidate(resp, self.name)
        parts = _from_genai_parts(
            candidate.content.parts if candidate and candidate.content else ()
        )
        return ModelResponse(
            content=Content(role="model", parts=tuple(parts)),
            usage=_usage(resp.usage_metadata),
            finish_reason=_finish_reason(candidate),
            model_version=resp.model_version,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelResponse]:
        """Text deltas as partial responses, then one final response.

        The final response holds the whole turn (consecutive text deltas merged) and the usage
        of the LAST chunk that reported any: Gemini sends running totals, never deltas.
        """
        contents, config = _to_genai(request)
        parts: list[Part] = []
        meta: Any = None
        finish: str | None = None
        version: str | None = None
        async with aclosing(self._chunks(contents, config)) as chunks:
            async for chunk in chunks:
                candidate = _first_candidate(chunk, self.name)
                delta = _from_genai_parts(
                    candidate.content.parts if candidate and candidate.content else ()
                )
                if chunk.usage_metadata is not None:
                    meta = chunk.usage_metadata
                finish = _finish_reason(candidate) or finish
                version = chunk.model_version or version
                if delta:
                    parts.extend(delta)
                    yield ModelResponse(
                        content=Content(role="model", parts=tuple(delta)),
                        partial=True,
                        model_version=version,
                    )
        yield ModelResponse(
            content=Content(role="model", parts=tuple(_merge_text(parts))),
            usage=_usage(meta),
            finish_reason=finish,
            model_version=version,
        )

    async def aclose(self) -> None:
        """Close the SDK's HTTP clients (async and the sync one it always creates)."""
        await self._client.aio.aclose()
        self._client.close()

    def describe(self) -> dict[str, Any]:
        """Public facts for /introspect: never the key."""
        facts: dict[str, Any] = {
            "name": self.name,
            "kind": type(self).__name__,
            "provider": "vertex-ai" if self.vertex else "gemini-api",
            "api_version": self.api_version,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
        }
        if self.base_url:
            facts["base_url"] = _without_userinfo(self.base_url)
        if self.vertex:
            facts["project"] = self.project
            facts["location"] = self.location
        return facts

    # -- internals -------------------------------------------------------------------------

    async def _chunks(
        self, contents: list[genai_types.Content], config: genai_types.GenerateContentConfig
    ) -> AsyncGenerator[genai_types.GenerateContentResponse, None]:
        # The request (and any HTTP error) happens on the first iteration, not on the await;
        # errors can also arrive mid-stream as an SSE error event. Translate all of them here
        # so the caller's loop body, which yields, stays outside the try.
        try:
            stream = await self._client.aio.models.generate_content_stream(
                model=self.name, contents=contents, config=config
            )
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                # Closes the HTTP response when the consumer stops early.
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        except Exception as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: Exception) -> Exception:
        """The one place SDK and transport errors become mesh errors."""
        from google.genai import errors

        if isinstance(exc, ModelError):
            return exc
        where = f"gemini model {self.name!r}"
        if isinstance(exc, errors.APIError):
            code = int(exc.code) if exc.code else None
            status = f" {exc.status}" if exc.status else ""
            message = f"{where}: HTTP {code}{status}: {exc.message or exc}"
            if code == 429:
                return ModelRateLimited(
                    f"{message} (rate limit or quota; gave up after {self.retries} attempt(s))",
                    status=429,
                    retryable=True,
                )
            retryable = code is not None and (code >= 500 or code == 408)
            return ModelError(message, status=code, retryable=retryable)
        if _is_timeout(exc):
            return ModelError(
                f"{where}: no answer within timeout_s={self.timeout_s} "
                f"(after {self.retries} attempt(s))",
                retryable=True,
            )
        if _is_transport_error(exc):
            target = _without_userinfo(self.base_url) if self.base_url else "the Gemini API"
            return ModelError(
                f"{where}: cannot reach {target}: {type(exc).__name__}: {exc}", retryable=True
            )
        if isinstance(exc, errors.UnknownApiResponseError | pydantic.ValidationError):
            # The request was built before the call, so a parse failure here is the answer's.
            return ModelError(f"{where}: unreadable response: {exc}")
        return exc


# -- translation: mesh -> google.genai ----------------------------------------------------------


def _to_genai(
    request: ModelRequest,
) -> tuple[list[genai_types.Content], genai_types.GenerateContentConfig]:
    from google.genai import types

    tools = None
    if request.tools:
        tools = [
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(
                        name=t.name, description=t.description, parameters_json_schema=t.parameters
                    )
                    for t in request.tools
                ]
            )
        ]
    config = types.GenerateContentConfig(
        system_instruction=request.system_instruction,
        tools=tools,
        # The runner executes tools itself (with its own events, metrics and limits).
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        temperature=request.temperature,
        max_output_tokens=request.max_output_tokens,
        response_mime_type="application/json" if request.response_schema is not None else None,
        response_json_schema=request.response_schema,
    )
    contents = [
        types.Content(role=c.role, parts=[_to_genai_part(p) for p in c.parts])
        for c in request.contents
    ]
    return contents, config


def _to_genai_part(part: Part) -> genai_types.Part:
    from google.genai import types

    signature = _signature_bytes(part.thought_signature)
    if part.function_call is not None:
        fc = part.function_call
        return types.Part(
            function_call=types.FunctionCall(id=_wire_id(fc.id), name=fc.name, args=dict(fc.args)),
            thought_signature=signature,
        )
    if part.function_response is not None:
        fr = part.function_response
        return types.Part(
            function_response=types.FunctionResponse(
                id=_wire_id(fr.id), name=fr.name, response=dict(fr.response)
            ),
            thought_signature=signature,
        )
    return types.Part(
        text=part.text if part.text is not None else "",
        thought=True if part.thought else None,
        thought_signature=signature,
    )


def _wire_id(call_id: str) -> str | None:
    return None if call_id.startswith(_GENERATED_ID_PREFIX) else call_id


def _signature_bytes(signature: str | None) -> bytes | None:
    if signature is None:
        return None
    # Accept both alphabets: Google emits standard base64, pydantic serialises URL-safe.
    padded = signature + "=" * (-len(signature) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ModelError(f"thought_signature is not base64: {signature[:16]!r}...") from exc


# -- translation: google.genai -> mesh ----------------------------------------------------------


def _first_candidate(resp: genai_types.GenerateContentResponse, model: str) -> Any:
    if resp.candidates:
        return resp.candidates[0]
    feedback = resp.prompt_feedback
    if feedback is not None and feedback.block_reason is not None:
        reason = _enum_name(feedback.block_reason)
        detail = f" ({feedback.block_reason_message})" if feedback.block_reason_message else ""
        raise ModelError(f"gemini model {model!r} blocked the prompt: {reason}{detail}")
    return None


def _from_genai_parts(parts: Iterable[genai_types.Part] | None) -> list[Part]:
    out: list[Part] = []
    for p in parts or ():
        signature = (
            base64.b64encode(p.thought_signature).decode("ascii") if p.thought_signature else None
        )
        if p.function_call is not None:
            fc = p.function_call
            call = FunctionCall(
                id=fc.id or f"{_GENERATED_ID_PREFIX}{uuid.uuid4().hex[:16]}",
                name=fc.name or "",
                args=dict(fc.args or {}),
            )
            out.append(Part(function_call=call, thought_signature=signature))
        elif p.function_response is not None:
            fr = p.function_response
            response = FunctionResponse(
                id=fr.id or f"{_GENERATED_ID_PREFIX}{uuid.uuid4().hex[:16]}",
                name=fr.name or "",
                response=dict(fr.response or {}),
            )
            out.append(Part(function_response=response, thought_signature=signature))
        elif p.text is not None or signature is not None:
            # A signature may ride on an empty text part; it still has to go back.
            out.append(
                Part(text=p.text or "", thought=bool(p.thought), thought_signature=signature)
            )
        else:
            log.debug("dropping a Gemini part mesh cannot represent: %s", _part_kind(p))
    return out


def _merge_text(parts: list[Part]) -> list[Part]:
    """Join streamed text deltas back into whole parts (thoughts apart from the answer)."""
    merged: list[Part] = []
    for part in parts:
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and part.text is not None
            and prev.text is not None
            and part.thought == prev.thought
            and part.thought_signature is None
        ):
            merged[-1] = prev.model_copy(update={"text": prev.text + part.text})
        else:
            merged.append(part)
    return merged


def _usage(meta: genai_types.GenerateContentResponseUsageMetadata | None) -> Usage | None:
    if meta is None:
        return None
    # Tool-use prompt tokens are billed as input, so input + output + thinking == total.
    return Usage(
        input_tokens=(meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0),
        output_tokens=meta.candidates_token_count or 0,
        cached_tokens=meta.cached_content_token_count or 0,
        thinking_tokens=meta.thoughts_token_count or 0,
        total_tokens=meta.total_token_count or 0,
    )


def _finish_reason(candidate: Any) -> str | None:
    if candidate is None or candidate.finish_reason is None:
        return None
    return _enum_name(candidate.finish_reason)


def _enum_name(value: Any) -> str:
    return str(getattr(value, "value", value))


def _part_kind(part: genai_types.Part) -> str:
    return ",".join(sorted(k for k, v in part if v is not None)) or "empty"


# -- transport errors ---------------------------------------------------------------------------


def _http_modules() -> list[Any]:
    # Whichever HTTP libraries the SDK may be using; only those already imported matter.
    return [m for m in (sys.modules.get("httpx2"), sys.modules.get("httpx")) if m is not None]


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):  # aiohttp's timeout is the builtin one
        return True
    return any(isinstance(exc, m.TimeoutException) for m in _http_modules())


def _is_transport_error(exc: BaseException) -> bool:
    if any(isinstance(exc, m.TransportError) for m in _http_modules()):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))

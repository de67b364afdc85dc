"""A Gemini REST endpoint on 127.0.0.1 for tests: scripted replies, recorded requests.

The real google-genai SDK is pointed at it (``GeminiModel(..., base_url=fake.url)``), so the
SDK's own request building, SSE parsing, retries and error mapping all run in the test.

    with FakeGemini() as fake:
        fake.reply(call_response("lookup", {"q": "x"}, thought_signature="c2ln"))
        fake.reply(text_response("done", usage=usage(prompt=10, candidates=2)))
        ...
        assert fake.requests[1].contents[-1]["parts"][0]["functionResponse"]["id"] == ...

Replies are consumed in order, one per request. A request with no reply left gets a 500 whose
message says so, which fails the test loudly rather than hanging it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "FakeGemini",
    "Recorded",
    "Reply",
    "call_response",
    "error_body",
    "text_response",
    "usage",
]

_PATH = re.compile(r"^/(?P<version>v1\w*)/models/(?P<model>[^/:]+):(?P<method>\w+)$")

# Google's proto-JSON parser accepts both spellings; the SDK sends snake_case for nested keys.
_SNAKE_TO_CAMEL = {
    "parameters_json_schema": "parametersJsonSchema",
    "response_json_schema": "responseJsonSchema",
}

_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass
class Reply:
    """One scripted answer. ``chunks`` are SSE events for ``streamGenerateContent``."""

    body: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None
    status: int = 200
    delay_s: float = 0.0


@dataclass
class Recorded:
    """One request as it reached the server."""

    method: str
    path: str
    version: str
    model: str
    rpc: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        return self.rpc == "streamGenerateContent"

    @property
    def contents(self) -> list[dict[str, Any]]:
        return list(self.body.get("contents", []))

    @property
    def function_declarations(self) -> list[dict[str, Any]]:
        """All declared functions, with schema keys normalised to camelCase."""
        out: list[dict[str, Any]] = []
        for tool in self.body.get("tools", []):
            for decl in tool.get("functionDeclarations", tool.get("function_declarations", [])):
                out.append({_SNAKE_TO_CAMEL.get(k, k): v for k, v in decl.items()})
        return out


def usage(
    prompt: int = 0, candidates: int = 0, thoughts: int = 0, cached: int = 0, tool_use: int = 0
) -> dict[str, Any]:
    """A ``usageMetadata`` object; the total is the sum, as the real service reports it."""
    meta = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts + tool_use,
    }
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
    if cached:
        meta["cachedContentTokenCount"] = cached
    if tool_use:
        meta["toolUsePromptTokenCount"] = tool_use
    return meta


def _response(
    parts: list[dict[str, Any]], finish: str | None, meta: dict[str, Any] | None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {
        "candidates": [candidate],
        "modelVersion": "gemini-fake-001",
        "responseId": "fake-response",
    }
    if meta is not None:
        body["usageMetadata"] = meta
    return body


def text_response(
    text: str,
    *,
    usage: dict[str, Any] | None = None,
    thought: str | None = None,
    thought_signature: str | None = None,
    finish: str | None = "STOP",
) -> dict[str, Any]:
    """A ``generateContent`` body answering ``text`` (optionally after a thought part)."""
    parts: list[dict[str, Any]] = []
    if thought is not None:
        parts.append({"text": thought, "thought": True})
    part: dict[str, Any] = {"text": text}
    if thought_signature is not None:
        part["thoughtSignature"] = thought_signature
    parts.append(part)
    return _response(parts, finish, usage)


def call_response(
    name: str,
    args: dict[str, Any],
    *,
    id: str | None = None,
    thought_signature: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``generateContent`` body asking for one function call (``id`` omitted if None)."""
    call: dict[str, Any] = {"name": name, "args": args}
    if id is not None:
        call["id"] = id
    part: dict[str, Any] = {"functionCall": call}
    if thought_signature is not None:
        part["thoughtSignature"] = thought_signature
    return _response([part], "STOP", usage)


def error_body(code: int, message: str) -> dict[str, Any]:
    """Google's error envelope."""
    return {
        "error": {"code": code, "message": message, "status": _STATUS_NAMES.get(code, "UNKNOWN")}
    }


class FakeGemini:
    """The fake service: a Starlette app under uvicorn, in a thread, on a socket it bound itself."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._replies: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    # -- scripting -------------------------------------------------------------------------

    def reply(self, body: dict[str, Any], *, delay_s: float = 0.0) -> None:
        """Answer the next request with ``body`` (200)."""
        self._push(Reply(body=body, delay_s=delay_s))

    def stream(self, chunks: list[dict[str, Any]]) -> None:
        """Answer the next (streaming) request with these SSE events."""
        self._push(Reply(chunks=chunks))

    def fail(self, status: int, message: str = "scripted failure") -> None:
        """Answer the next request with an HTTP error in Google's envelope."""
        self._push(Reply(body=error_body(status, message), status=status))

    def _push(self, reply: Reply) -> None:
        with self._lock:
            self._replies.append(reply)

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        with self._lock:
            return len(self._replies)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeGemini:
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake Gemini server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        self._sock.close()

    def __enter__(self) -> FakeGemini:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the endpoint ----------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        match = _PATH.match(request.url.path)
        if match is None or request.method != "POST":
            return JSONResponse(error_body(404, f"no route {request.url.path}"), status_code=404)
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return JSONResponse(error_body(400, "body is not JSON"), status_code=400)
        recorded = Recorded(
            method=request.method,
            path=request.url.path,
            version=match["version"],
            model=match["model"],
            rpc=match["method"],
            query=dict(request.query_params),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        with self._lock:
            self.requests.append(recorded)
            reply = self._replies.popleft() if self._replies else None
        if not recorded.headers.get("x-goog-api-key"):
            return JSONResponse(error_body(401, "missing x-goog-api-key"), status_code=401)
        if reply is None:
            msg = f"fake Gemini: no scripted reply left for request #{len(self.requests)}"
            return JSONResponse(error_body(500, msg), status_code=500)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return JSONResponse(reply.body, status_code=reply.status)
        if recorded.streaming:
            if recorded.query.get("alt") != "sse":
                return JSONResponse(error_body(400, "stream without alt=sse"), status_code=400)
            events = reply.chunks if reply.chunks is not None else [reply.body or {}]
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        if reply.chunks is not None:
            msg = "fake Gemini: a stream was scripted but generateContent was called"
            return JSONResponse(error_body(500, msg), status_code=500)
        return JSONResponse(reply.body)


async def _sse(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in events:
        yield f"data: {json.dumps(event)}\r\n\r\n".encode()

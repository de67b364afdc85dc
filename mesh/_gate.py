"""``RequestGate``: what a node checks on an A2A request before the A2A layer runs: ``POST /``
(JSON-RPC) and every request under ``/a2a/rest/`` (HTTP+JSON), alike.

In order, each refusal answered at once and nothing stored:

1. the mesh token, when the node has one (``Authorization: Bearer``, scheme case-insensitive
   as RFC 7235 says), or with keys (``MESH_KEYS``) a caller's call token (``mesh._identity``:
   the caller named, verified against the mesh's root, once) -> 401 saying why. The end user
   the request is for (``mesh._identity.PRINCIPAL``, the ``sub`` of the call tokens minted while
   serving it) is the call token's ``sub``, or with the mesh token the ``Mesh-Principal``
   header (a malformed one -> 401 saying what a principal is);
2. the body size (``max_body_bytes``) -> 413 (a declared ``Content-Length`` over it at once),
   the bytes of all bodies held at once (``max_inflight_bytes``) -> 503 ``busy, retry`` with
   ``Retry-After``, and the time the body takes to arrive (``body_timeout_s``) -> 408 and the
   connection closed. A request holds the bytes that have ARRIVED, from its first byte to its
   answer: a length declared and never sent holds nothing (two idle connections declaring 10
   and 6 MiB held the whole budget, and every other call got 503, for as long as they
   stayed). When bodies arriving together pass the bound, the one whose next bytes do not fit
   is refused and frees what it held; one request alone is always let in;
3. the body is parsed ONCE, strictly (``mesh._rpc_body``): ``NaN``/``Infinity`` and a body
   nested too deeply are a parse error (-32700), a number no double holds (``1e400``) is invalid
   params (-32602), both naming where they are; a body that is not one JSON-RPC 2.0 request
   (an ``id`` that is an object, a fraction or a boolean, no ``method``...) is -32600 naming
   the member. On REST the JSON body of a method that has one gets the same strict parse, a
   refusal being 400 ``INVALID_ARGUMENT``;
4. the call policy, when the node has one (``MESH_ALLOW``, ``mesh._policy``): a caller (the
   agent its call token names, else ``@token``) no rule allows to call the skill its message
   names -> 403 naming the caller, the skill and the rules for this agent, counted in
   ``mesh_calls_denied_total``; a JSON-RPC error object (code ``POLICY_DENIED``) on JSON-RPC,
   the binding's error shape (``PERMISSION_DENIED``) on REST;
5. new sends while the node drains -> 503.

Then the SDK's route answers (its handler is ``mesh._a2a.handler.MeshRequestHandler``), or for
a send the fast path takes ``mesh._a2a.fastroute`` with this parse, and the request is counted
in ``mesh_requests_total`` by method (a closed set: see ``mesh._metrics``): the JSON-RPC method
name, or the REST method as ``POST /message:send`` (``mesh._a2a.server.REST_METHODS``). The
gate's own refusals on REST are the binding's error shape
(``{"error": {"code": 401, "status": "UNAUTHENTICATED", "message": ...}}``); on JSON-RPC they
stay ``{"error": "...", "status": 401}``. Pure ASGI so SSE streams pass through unbuffered. Params the SDK cannot parse (``"message": 5``) are the
caller's mistake: the SDK's ERROR record with a traceback for them is dropped (its WARNING line
with the parse error follows), so callers cannot fill the log with tracebacks.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mesh._a2a import server
from mesh._a2a.server import REST_METHODS, REST_PREFIX, SEND_METHODS, rest_invalid, rest_method
from mesh._asgi import BodyTooLarge, bearer, read_body, replay
from mesh._errors import PeerRefused
from mesh._identity import PRINCIPAL, CallerCheck, principal_problem
from mesh._policy import ANY, UNIDENTIFIED
from mesh._rpc_body import RpcRefused, parse_json, parse_rpc_body

if TYPE_CHECKING:
    from mesh._node import Node

__all__ = ["METHODS", "POLICY_DENIED", "GatedApp", "RequestGate"]

#: The JSON-RPC error code of a call the call policy refuses (HTTP 403; an implementation-defined
#: server error, outside the codes A2A defines).
POLICY_DENIED = -32050

#: The closed set of the request metrics' method label: JSON-RPC methods and REST methods.
METHODS = server.METHODS | REST_METHODS
_REST_ROOT = REST_PREFIX + "/"
# REST methods whose body is JSON the gate parses (the others have none, or it is ignored).
_REST_BODIES = frozenset(
    {"POST /message:send", "POST /message:stream", "POST /tasks/{id}/pushNotificationConfigs"}
)
_INVALID_PARAMS = -32602
# google.rpc status names of the HTTP statuses the gate answers with, for the REST error shape.
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    503: "UNAVAILABLE",
}

# The SDK dispatcher's records for a request it refuses (logged with a traceback at ERROR).
_REFUSAL_RECORDS = frozenset(
    {"Failed to validate base JSON-RPC request", "Failed to parse request params"}
)


class _NoTracebackForRefusals(logging.Filter):
    """Drops the SDK's ERROR record for a request it refuses as malformed: the refusal is the
    caller's error, and the SDK's next record (WARNING, with the parse error) says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _REFUSAL_RECORDS


# The end user a request opened with the mesh token is on behalf of (mesh._identity.PRINCIPAL).
_PRINCIPAL_HEADER = b"mesh-principal"

_SDK_DISPATCHER_LOG = logging.getLogger("a2a.server.routes.jsonrpc_dispatcher")
_log = logging.getLogger("mesh._gate")


class GatedApp(FastAPI):
    """A node's FastAPI app behind its ``gate``, which every HTTP request passes first: the
    gate answers it (its refusals, the fast route's sends) or passes it on to FastAPI itself
    (``behind_gate``), so that what the fast route answers skips FastAPI's machinery: its
    per-request check of OpenTelemetry's providers (``NativeTelemetry.enabled``, ~32 k
    instructions a request when none is set), its telemetry and body-limit middleware, as
    ``registry.app.RegistryApp`` does for the registry's hot routes. An error the gate raises
    is answered by Starlette's ``ServerErrorMiddleware``, with the app's own handler, as when
    the gate was a middleware inside it."""

    gate: ASGIApp | None = None
    _front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gate is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        front = self._front
        if front is None:
            # Made at the first request, as FastAPI makes its middleware stack.
            handler = next(
                (h for key, h in self.exception_handlers.items() if key in (500, Exception)),
                None,
            )
            front = self._front = ServerErrorMiddleware(self.gate, handler, debug=self.debug)
        await front(scope, receive, send)

    async def behind_gate(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI itself: where the gate passes on what it does not answer."""
        await super().__call__(scope, receive, send)


class _Deadline:
    """One body read's deadline (``_BodyDeadlines``)."""

    __slots__ = ("_ours", "cancelling", "done", "expired", "task", "when")

    def __init__(self, task: asyncio.Task[Any], when: float) -> None:
        self.task: asyncio.Task[Any] | None = task
        self.when = when
        self.cancelling = task.cancelling()
        self.done = False
        self.expired = False
        self._ours = False

    def expire(self) -> None:
        self.expired = True
        assert self.task is not None  # not done
        self.task.cancel()

    def close(self) -> bool:
        """The read is over: whether a cancellation it ended with is this deadline's (what
        ``asyncio.timeout``'s exit decides: its cancellation taken back, none other left)."""
        task = self.task
        if task is not None:
            # Not kept: a deadline may wait in the queue behind a slow one for a while.
            self.task = None
            self.done = True
            self._ours = self.expired and task.uncancel() <= self.cancelling
        return self._ours


class _BodyDeadlines:
    """What ``asyncio.timeout(seconds)`` around each body read did (its task cancelled when
    the read is not over ``seconds`` after it started, the cancellation then taken as the
    timeout), for ~1 k instructions a read instead of ~29 k (its timer handle, made and
    cancelled, and its context manager): the deadlines all have the same length, so they fall
    due in the order they were set, and one loop timer, for the earliest, serves them all."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._pending: deque[_Deadline] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> _Deadline:
        """The deadline of the read the current task starts now."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None  # a coroutine the server runs
        pending = self._pending
        if loop is not self._loop:
            # Another event loop (a test's): the last one's deadlines went with it.
            self._loop, self._timer = loop, None
            pending.clear()
        while pending and pending[0].done:
            pending.popleft()
        deadline = _Deadline(task, loop.time() + self.seconds)
        pending.append(deadline)
        if self._timer is None:
            self._timer = loop.call_at(deadline.when, self._fall_due)
        return deadline

    def _fall_due(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        now = loop.time()
        pending = self._pending
        while pending and (pending[0].done or pending[0].when <= now):
            deadline = pending.popleft()
            if not deadline.done:
                deadline.expire()
        if pending:
            self._timer = loop.call_at(pending[0].when, self._fall_due)


class _Busy(Exception):
    """Holding a body of ``size`` bytes would pass ``max_inflight_bytes``."""

    def __init__(self, size: int) -> None:
        self.size = size


class RequestGate:
    """The pure-ASGI gate of a node's A2A routes (see the module docstring), in front of the
    node's FastAPI app (``GatedApp``): ``app`` is FastAPI itself."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node
        #: Bytes of request bodies held now (read, being read, or being worked on).
        self.held_bytes = 0
        token = node.settings.token
        self._token = None if token is None else token.encode()
        # With keys, a caller's own call token (mesh._identity) is a credential too, and some
        # credential is required: a node with keys is never open.
        self._callers: CallerCheck | None = None
        if node.keys is not None:
            self._callers = CallerCheck(node.keys.root, node.agent.name)
        self._known_callers: set[str] = set()
        self._skills = tuple(s.id for s in node.agent.all_skills)
        self._deadlines = _BodyDeadlines(node.settings.body_timeout_s)
        if not any(isinstance(f, _NoTracebackForRefusals) for f in _SDK_DISPATCHER_LOG.filters):
            _SDK_DISPATCHER_LOG.addFilter(_NoTracebackForRefusals())

    def _unauthorized(self, given: bytes | None, scope: Scope) -> str | None:
        """Why ``given`` (the bearer credentials) is no credential here, else None; a verified
        caller identity goes in ``scope["state"]["mesh_caller"]``."""
        if (
            given is not None
            and self._token is not None
            and hmac.compare_digest(given, self._token)
        ):
            # The mesh token's holders (the CLI, the console, a gateway) may say whom they call
            # for; a call token's principal is its signed claim, never a header.
            return self._principal_header(scope)
        if given is not None and self._callers is not None and given.count(b".") == 2:
            try:
                caller = self._callers.verify(given.decode("ascii", "replace"))
            except PeerRefused as exc:
                return f"call token refused: {exc}"
            scope.setdefault("state", {})["mesh_caller"] = caller.agent
            if caller.principal is not None:
                PRINCIPAL.set(caller.principal)
                _log.info("call from %s on behalf of %s", caller.agent, caller.principal)
            if caller.kid not in self._known_callers and len(self._known_callers) < 1024:
                self._known_callers.add(caller.kid)
                _log.info("caller %s verified by its call token (key %s)", caller.agent, caller.kid)
            return None
        wanted = "the mesh token, MESH_TOKEN"
        if self._callers is not None:
            wanted = "a call token of an agent of this mesh" + (
                ", or the mesh token (MESH_TOKEN)" if self._token is not None else ""
            )
        return f"this node needs 'Authorization: Bearer <token>' on A2A calls ({wanted})"

    def _principal_header(self, scope: Scope) -> str | None:
        """Take the ``Mesh-Principal`` header of a request opened with the mesh token as the
        request's principal; why it cannot be one, else None."""
        raw = next((v for k, v in scope["headers"] if k == _PRINCIPAL_HEADER), None)
        if raw is None:
            return None
        value = raw.decode("latin-1")
        problem = principal_problem(value)
        if problem is not None:
            return f"the Mesh-Principal header: {problem}"
        PRINCIPAL.set(value)
        _log.info("call with the mesh token on behalf of %s", value)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/" and scope["method"] == "POST":
            rest = False
        elif path.startswith(_REST_ROOT):
            rest = True
        else:
            await self.app(scope, receive, send)
            return
        node = self.node
        if self._token is not None or self._callers is not None:
            problem = self._unauthorized(bearer(scope), scope)
            if problem is not None:
                node.metrics.request("unauthorized", ok=False)
                await _reply(
                    send, 401, problem, [(b"www-authenticate", b'Bearer realm="mesh"')], rest=rest
                )
                return
        held = 0

        def reserve(size: int) -> None:
            # The bytes received so far: a declared length is not held until it arrives.
            nonlocal held
            if size > held:
                if not self._hold(size - held, held):
                    raise _Busy(size)
                held = size

        settings = node.settings
        try:
            limit = settings.max_body_bytes
            deadline = self._deadlines.start()
            try:
                body = await read_body(scope, receive, limit=limit, reserve=reserve)
            except asyncio.CancelledError:
                if not deadline.close():
                    raise
                await self._too_slow(send, held, rest)  # the body is body_timeout_s late
                return
            except BodyTooLarge:
                await self._too_large(send, limit, rest)
                return
            except _Busy as busy:
                await self._busy(send, busy.size, rest)
                return
            finally:
                deadline.close()
            if body is None:
                return
            if rest:
                await self._serve_rest(scope, body, receive, send)
            else:
                await self._serve(scope, body, receive, send)
        finally:
            self.held_bytes -= held

    def _hold(self, more: int, own: int) -> bool:
        """Hold ``more`` bytes for a request holding ``own`` already, unless that passes the
        bound while OTHER requests hold bytes too (one request alone is always let in)."""
        total = self.held_bytes + more
        if total > self.node.settings.max_inflight_bytes and self.held_bytes > own:
            return False
        self.held_bytes = total
        return True

    async def _serve(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        node = self.node
        try:
            parsed = parse_rpc_body(body)
        except RpcRefused as refused:
            node.metrics.request("invalid", ok=False)
            await _send(send, 200, refused.body())
            return
        method: str = parsed["method"]
        if node.policy is not None:
            denied = self._denied(scope, method, parsed.get("params"))
            if denied is not None:
                node.metrics.request(method, ok=False)
                error = {"code": POLICY_DENIED, "message": denied}
                answer = {"jsonrpc": "2.0", "id": parsed.get("id"), "error": error}
                await _send(send, 403, json.dumps(answer).encode())
                return
        if node.draining and method in SEND_METHODS:
            await self._shutting_down(send, method, rest=False)
            return

        service = node.service
        fast = service.fastroute if service is not None and method == "SendMessage" else None
        # The fast route's outcome: None when it leaves the request to the SDK's route, else
        # whether its answer is a result (it sends the answer itself, unwatched). True while
        # it runs: one that raises counts as the watch counts an answer it never saw start.
        answered: bool | None = None
        try:
            # Counted until the answer is sent: a drain waits for the last event of a stream.
            with node.exchanges:
                if fast is not None:
                    answered = True
                    answered = await fast.answer(parsed, scope, send)
                if answered is None:
                    del parsed  # the SDK's route parses the body itself
                    await self._sdk_route(scope, method, replay(body, receive), send)
        finally:
            if answered is not None:
                node.metrics.request(method, ok=answered)

    async def _sdk_route(self, scope: Scope, method: str, receive: Receive, send: Send) -> None:
        """The SDK's route answers the request, counted by its answer."""
        status = 200
        is_json = False
        first_chunk = b""

        async def watch(message: Message) -> None:
            nonlocal status, is_json, first_chunk
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = dict(message.get("headers", []))
                is_json = headers.get(b"content-type", b"").startswith(b"application/json")
            elif message["type"] == "http.response.body" and not first_chunk:
                first_chunk = bytes(message.get("body", b""))[:16]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            # JSON-RPC errors are HTTP 200 with {"error": ...} (the SDK writes "error" first).
            ok = status < 400 and not (is_json and first_chunk.startswith(b'{"error"'))
            self.node.metrics.request(method, ok=ok)

    async def _serve_rest(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        node = self.node
        method = rest_method(scope["method"], scope["path"][len(REST_PREFIX) :]) or "other"
        parsed: Any = None
        if method in _REST_BODIES:
            try:
                parsed = parse_json(body)
            except RpcRefused as refused:
                node.metrics.request("invalid", ok=False)
                body = rest_invalid(refused.message, params=refused.code == _INVALID_PARAMS)
                await _send(send, 400, body)
                return
        if node.policy is not None:
            denied = self._denied(scope, method, parsed)
            if denied is not None:
                node.metrics.request(method, ok=False)
                await _reply(send, 403, denied, rest=True)
                return
        if node.draining and method in SEND_METHODS:
            await self._shutting_down(send, method, rest=True)
            return

        receive = replay(body, receive)
        del body

        status = 200

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        service = node.service
        fast = service.fastroute if service is not None and method == "POST /message:send" else None
        try:
            with node.exchanges:
                if fast is None or not await fast.serve_rest(parsed, scope, receive, watch):
                    del parsed
                    await self.app(scope, receive, watch)
        finally:
            # REST errors are HTTP errors (an error inside a stream is not seen here, as on
            # JSON-RPC).
            node.metrics.request(method, ok=status < 400)

    def _denied(self, scope: Scope, method: str, params: Any) -> str | None:
        """Why the call policy refuses this request (``params``: a send's JSON params, or
        None), else None. The skill is the one the message names; naming none, the agent's
        only skill, else all of them (the node picks one later, from the parts)."""
        policy = self.node.policy
        assert policy is not None
        agent = self.node.agent.name
        caller = scope.get("state", {}).get("mesh_caller") or UNIDENTIFIED
        if method in SEND_METHODS:
            skill = _named_skill(params)
            if skill is None and len(self._skills) == 1:
                skill = self._skills[0]
            if skill is not None:
                if policy.allows(caller, skill):
                    return None
                what = f"{agent}:{skill}"
            else:
                if policy.allows_all(caller, self._skills):
                    return None
                skill = ANY
                what = f"{agent} without naming a skill (that needs {agent}:*)"
        else:
            if policy.allows(caller, None):
                return None
            skill = ANY
            what = f"{agent} ({method})"
        self.node.metrics.call_denied(caller, skill)
        return policy.refusal(caller, agent, what)

    async def _shutting_down(self, send: Send, method: str, *, rest: bool) -> None:
        node = self.node
        node.metrics.request(method, ok=False)
        await _reply(
            send, 503, f"{node.agent.name} is shutting down; try another instance", rest=rest
        )

    async def _too_large(self, send: Send, limit: int, rest: bool) -> None:
        self.node.metrics.request("too_large", ok=False)
        await _reply(
            send,
            413,
            f"request body over {limit} bytes (the node's MESH_MAX_BODY_BYTES)",
            rest=rest,
        )

    async def _too_slow(self, send: Send, received: int, rest: bool) -> None:
        self.node.metrics.request("body_timeout", ok=False)
        timeout = self.node.settings.body_timeout_s
        # Closed: the rest of a body that stalled is not worth reading.
        await _reply(
            send,
            408,
            f"the request body did not arrive within {timeout:g} s ({received} bytes did; the "
            f"node's MESH_BODY_TIMEOUT); send the whole body at once",
            [(b"connection", b"close")],
            rest=rest,
        )

    async def _busy(self, send: Send, size: int, rest: bool) -> None:
        self.node.metrics.request("busy", ok=False)
        settings = self.node.settings
        await _reply(
            send,
            503,
            f"{self.node.agent.name} is busy: {self.held_bytes} bytes of requests in progress "
            f"and this one has {size} so far (MESH_MAX_INFLIGHT_BYTES="
            f"{settings.max_inflight_bytes}); "
            "retry shortly or send to another instance",
            [(b"retry-after", b"1")],
            rest=rest,
        )


def _named_skill(params: Any) -> str | None:
    """The skill a send's JSON params name (``message.metadata.skill``), else None."""
    message = params.get("message") if isinstance(params, dict) else None
    metadata = message.get("metadata") if isinstance(message, dict) else None
    skill = metadata.get("skill") if isinstance(metadata, dict) else None
    return skill if isinstance(skill, str) and skill else None


def _json_error(status: int, message: str, *, rest: bool) -> bytes:
    if rest:
        # The HTTP+JSON binding's error shape (what the SDK's REST routes answer with).
        error = {"code": status, "status": _STATUS_NAMES.get(status, "UNKNOWN"), "message": message}
        return json.dumps({"error": error}).encode()
    return json.dumps({"error": message, "status": status}).encode()


async def _reply(
    send: Send,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    rest: bool = False,
) -> None:
    await _send(send, status, _json_error(status, message, rest=rest), headers)


async def _send(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

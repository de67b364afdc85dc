"""``FastRoute``: the way in to the fast path for a body the node's gate has parsed, on both
bindings: JSON-RPC ``SendMessage`` (``serve``) and HTTP+JSON ``POST /message:send``
(``serve_rest``).

The SDK's JSON-RPC route reads and parses the body again, validates it and builds the call
context before it calls the handler: about 0.13 ms of CPU per request, a tenth of what a node
spends on a function skill's task. For the requests the fast path takes, the gate hands its
parse here instead (``mesh._gate``), and this does the route's work with the SDK's own public
pieces: the request read into ``SendMessageRequest`` (``mesh._a2a.fastpath_json``, with
``ParseDict`` for what it does not read), the ``A2A-Version`` check (``validate_version``'s,
called only for a version other than the one it wants), the call context
``DefaultServerCallContextBuilder`` builds (made from the scope's headers without a Starlette
``Request``, unless an authentication middleware put a user there), the handler's
``on_message_send`` (idempotency, then ``FastPath``; its task's history trimmed as the text
is written, ``send_answer_cut``, not in a copy), and the answer or error body
(``build_error_response``; the answer the bytes Starlette's ``JSONResponse`` writes of
``MessageToDict``'s dict, written in one pass by ``fastpath_json.rpc_result``, and sent as
``JSONResponse`` sends them: ``Content-Length``, ``Content-Type``, the body). Every other
request (a malformed one included: it gets the SDK's own error) goes on to the SDK's route
untouched: ``serve`` returns False (``answer``, the gate's call, None) before sending
anything. The REST answer is what the SDK's REST route sends: ``application/a2a+json`` with the
``SendMessageResponse``, or the binding's error payload (``build_rest_error_payload``) with its
HTTP status. Each request answered here counts in ``mesh_fastpath_sends_total`` by binding.
What the answer does not need (the task's log line, its metrics, its count in flight) is done
after the answer is sent: each request's ``AfterAnswer`` (``mesh._a2a.after_answer``), run as
the request ends, whatever it ends with.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING, Any, Literal

from a2a.auth.user import UnauthenticatedUser
from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import build_error_response
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.types import Message, SendMessageRequest, Task
from a2a.utils import constants
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import A2AError, InternalError
from a2a.utils.version_validator import validate_version
from google.protobuf.json_format import ParseDict
from starlette.requests import Request
from starlette.responses import JSONResponse

from mesh._a2a.after_answer import AFTER_ANSWER, AfterAnswer
from mesh._a2a.fastpath import FastPath
from mesh._a2a.fastpath_json import (
    RAW_MESSAGE,
    SETTLED,
    WRITES_SETTLED,
    Settled,
    dumps,
    response_text,
    rpc_result,
    send_request,
)
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import send_answer_cut

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from starlette.types import Receive, Scope, Send

    from mesh._metrics import NodeMetrics

__all__ = ["FastRoute"]

log = logging.getLogger("mesh._a2a")

# The headers the route reads, as the ASGI server hands them (lowercase names).
_EXTENSIONS_NAME = HTTP_EXTENSION_HEADER.lower()
_EXTENSIONS = _EXTENSIONS_NAME.encode("latin-1")
_VERSION = constants.VERSION_HEADER.lower()
_JSON = b"application/json"
_A2A_JSON = constants.A2A_JSON_MEDIA_TYPE.encode("latin-1")


class FastRoute:
    """Answers the JSON-RPC ``SendMessage`` requests ``fastpath`` takes (see the module
    docstring) through ``handler``."""

    def __init__(
        self, handler: MeshRequestHandler, fastpath: FastPath, metrics: NodeMetrics | None = None
    ) -> None:
        self.fastpath = fastpath
        self.metrics = metrics
        self._handler = handler
        # The route's version check, as the SDK's route applies it to the same call.
        self._checked = validate_version(constants.PROTOCOL_VERSION_1_0)(
            handler.on_message_send_unanswered
        )
        self._contexts = DefaultServerCallContextBuilder()

    async def serve(self, body: Any, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer ``body`` (the parsed JSON-RPC request) when the fast path takes it; False,
        with nothing sent, when the SDK's route must handle it."""
        return await self.answer(body, scope, send) is not None

    async def answer(self, body: Any, scope: Scope, send: Send) -> bool | None:
        """``serve`` for the gate: None when the SDK's route must handle ``body`` (nothing
        sent), else whether the answer sent is a result (False: a JSON-RPC error)."""
        prepared = self._prepare(body)
        if prepared is None:
            return None
        request_id, params, built = prepared
        # Decided in the call's context: the message's metadata is read once, for the run too
        # (``MeshExecutor.read_request``), and the run's kind is marked for the store.
        context = self._context(scope, params)
        if built:  # the parse's values, for the run's reading of them (``handed_values``)
            context.state[RAW_MESSAGE] = (params.message, body["params"]["message"])
        if not self.fastpath.takes(params, context):
            return None
        context.state["method"] = "SendMessage"
        context.state["request_id"] = request_id
        context.state[WRITES_SETTLED] = True
        after = context.state[AFTER_ANSWER] = AfterAnswer()
        try:
            try:
                result = await self._call(params, context)
                settled, result, start = self._answer(result, params, context.state.get(SETTLED))
                answer = rpc_result(result, request_id, history_from=start, settled=settled)
            except A2AError as exc:
                error = dumps(build_error_response(request_id, exc))
            except Exception as exc:
                # As the SDK's route does with an unexpected error: JSON-RPC -32603.
                log.exception("SendMessage failed")
                error = dumps(build_error_response(request_id, InternalError(message=str(exc))))
            else:
                await _send_json(send, 200, answer, _JSON, after)
                self._count("jsonrpc")
                return True
            await _send_json(send, 200, error, _JSON, after)
            self._count("jsonrpc")
            return False
        finally:
            after.run()  # what the answer did not wait for (mesh._a2a.after_answer)

    async def serve_rest(self, body: Any, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer ``body`` (the parsed JSON of a REST ``POST /message:send``) when the fast path
        takes it; False, with nothing sent, when the SDK's REST route must handle it."""
        params, built = self._read_params(body)
        if params is None:
            return False
        context = self._context(scope, params)
        if built:
            context.state[RAW_MESSAGE] = (params.message, body["message"])
        if not self.fastpath.takes(params, context):
            return False
        context.state[WRITES_SETTLED] = True
        after = context.state[AFTER_ANSWER] = AfterAnswer()
        try:
            try:
                result = await self._call(params, context)
                settled, result, start = self._answer(result, params, context.state.get(SETTLED))
                answer = response_text(result, history_from=start, settled=settled).encode()
            except Exception as exc:
                if not isinstance(exc, A2AError):
                    log.exception("SendMessage failed")  # as the SDK's REST route logs it
                payload = build_rest_error_payload(exc)
                response = JSONResponse(payload, status_code=int(payload["error"]["code"]))
                soon = asyncio.get_running_loop().call_soon(after.run)  # see _send_json
                await response(scope, receive, send)
                soon.cancel()
            else:
                # What the SDK's REST route sends: the response, application/a2a+json.
                await _send_json(send, 200, answer, _A2A_JSON, after)
            self._count("rest")
            return True
        finally:
            after.run()  # what the answer did not wait for (mesh._a2a.after_answer)

    def _context(self, scope: Scope, params: SendMessageRequest) -> ServerCallContext:
        """The call context ``DefaultServerCallContextBuilder`` builds for this request, with
        the request's tenant."""
        if "auth" in scope or "user" in scope:
            # An authentication middleware's user: the builder reads it through a Request.
            context = self._contexts.build(Request(scope))
            context.tenant = params.tenant
            return context
        # Without one, what the builder reads is the headers: ``dict(request.headers)`` (each
        # name's first value) and the extensions asked for; read here from the scope itself.
        raw = scope["headers"]
        headers = {}
        for name, value in raw:  # a loop, not a comprehension: no function made per request
            headers[name.decode("latin-1")] = value.decode("latin-1")
        if len(headers) != len(raw):
            # A name given twice: its first value, as Starlette's Headers reads it.
            headers = {}
            for name, value in raw:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        if _EXTENSIONS_NAME not in headers:
            # The builder's user and extensions when none is asked for: the defaults.
            return _call_context({"headers": headers}, params.tenant, _DEFAULTS_GIVEN, set())
        extensions = [value.decode("latin-1") for name, value in raw if name == _EXTENSIONS]
        return _call_context(
            {"headers": headers},
            params.tenant,
            _ALL_GIVEN,
            get_requested_extensions(extensions),
        )

    def _count(self, binding: Literal["jsonrpc", "rest"]) -> None:
        if self.metrics is not None:
            self.metrics.fastpath_send(binding)

    def _call(self, params: SendMessageRequest, context: ServerCallContext) -> Awaitable[Any]:
        """The handler's ``on_message_send``, its answer not yet trimmed (``_answer``), to
        await (the handler's own coroutine: no coroutine of this one around it)."""
        headers = context.state["headers"]
        version = headers.get(constants.VERSION_HEADER) or headers.get(_VERSION)
        if version == constants.PROTOCOL_VERSION_1_0:
            # The version the check wants, which it lets through.
            return self._handler.on_message_send_unanswered(params, context)
        return self._checked(params, context)  # its own verdict, its own error

    @staticmethod
    def _answer(
        result: Task | Message, params: SendMessageRequest, settled: Settled | None
    ) -> tuple[Settled | None, Task | Message, int]:
        """The call's ``settled`` (kept for the writer), ``on_message_send``'s answer as
        ``result`` and the first history message its text writes (``send_answer_cut``): the
        task is written without a copy of it. A settled task's stand-in (``Settled.is_of``)
        is cut by its held history: the task is not parsed."""
        if not isinstance(result, Task):
            return settled, result, 0
        if settled is not None and result is settled.stand_in:
            return settled, result, _settled_cut(settled, params)
        task, start = send_answer_cut(result, params)
        return settled, task, start

    def _prepare(self, body: Any) -> tuple[str | int, SendMessageRequest, bool] | None:
        """The request id and params of a ``SendMessage`` request, and whether ``send_request``
        built them; else None."""
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
            return None
        if body.get("method") != "SendMessage":
            return None
        request_id = body.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, str | int):
            return None
        params, built = self._read_params(body.get("params"))
        return None if params is None else (request_id, params, built)

    @staticmethod
    def _params(raw: Any) -> SendMessageRequest | None:
        """``raw`` (the JSON of a ``SendMessageRequest``) parsed, or None when the SDK's route
        must answer it (a follow-up, or params it refuses with its own error)."""
        return FastRoute._read_params(raw)[0]

    @staticmethod
    def _read_params(raw: Any) -> tuple[SendMessageRequest | None, bool]:
        """``_params``, and whether ``send_request`` built them (from ``raw``'s common shape,
        which ``handed_values`` reads) rather than ``ParseDict``."""
        if not isinstance(raw, dict):
            return None, False
        message = raw.get("message")
        # Cheap refusals before parsing: follow-ups go to the SDK.
        if not isinstance(message, dict) or message.get("taskId") or message.get("task_id"):
            return None, False
        try:
            fast = send_request(raw)
        except Exception:
            fast = None  # ParseDict decides
        if fast is not None:
            return fast, True
        params = SendMessageRequest()
        try:
            ParseDict(raw, params, ignore_unknown_fields=True)
        except Exception:
            return None, False  # the SDK's route answers with its own error
        return params, False


def _settled_cut(settled: Settled, params: SendMessageRequest) -> int:
    """``send_answer_cut``'s index for the task ``settled`` holds (a status, always), read
    from its history as held (``Settled.history``: each entry's message id is the task's)."""
    history = settled.history
    config = params.configuration
    if config.HasField("history_length"):
        # apply_history_length's rule: the last history_length messages, none for 0
        length, kept = config.history_length, len(history)
        return kept - length if length == 0 or 0 < length < kept else 0
    sent = params.message.message_id
    for i in range(len(history) - 1, -1, -1):
        if history[i].message_id == sent:
            return i + 1
    return 0


# The fields ``ServerCallContext(...)`` is given in ``_context`` (its ``model_fields_set``).
_DEFAULTS_GIVEN = frozenset({"state", "tenant"})
_ALL_GIVEN = frozenset({"state", "tenant", "user", "requested_extensions"})
_new_model = object.__new__
# BaseModel's slots, set through their descriptors: ~0.5 k instructions less each than
# object.__setattr__'s lookup of them.
_set_dict = inspect.getattr_static(ServerCallContext, "__dict__").__set__
_set_fields_set = inspect.getattr_static(ServerCallContext, "__pydantic_fields_set__").__set__
_set_extra = inspect.getattr_static(ServerCallContext, "__pydantic_extra__").__set__
_set_private = inspect.getattr_static(ServerCallContext, "__pydantic_private__").__set__


def _call_context(
    state: dict[str, Any], tenant: str, given: frozenset[str], extensions: set[str]
) -> ServerCallContext:
    """``ServerCallContext(state=state, tenant=tenant, ...)`` (an ``UnauthenticatedUser``, the
    extensions asked for) as pydantic's validation would leave it, without the validation:
    each value is already of its field's type (the state a new dict, the tenant the request's
    string, the extensions a set of strings), and validating them cost ~1 us a request
    (``tests/test_fastroute_context.py`` holds the two equal)."""
    context = _new_model(ServerCallContext)
    _set_dict(
        context,
        {
            "state": state,
            "user": UnauthenticatedUser(),
            "tenant": tenant,
            "requested_extensions": extensions,
        },
    )
    _set_fields_set(context, set(given))
    _set_extra(context, None)
    _set_private(context, None)
    return context


async def _send_json(
    send: Send, status: int, body: bytes, media_type: bytes, after: AfterAnswer
) -> None:
    """What Starlette's ``JSONResponse`` sends (``Content-Length``, then ``Content-Type``).
    A send that has to wait (the caller has not read what was sent before: uvicorn's flow
    control waits for the transport to drain) does not hold ``after`` behind the reader (the
    task still in flight for a drain, its line and metrics unwritten): the loop runs it
    meanwhile. A send that does not wait leaves it to the route, right after."""
    headers = [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", media_type)]
    soon = asyncio.get_running_loop().call_soon(after.run)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    soon.cancel()

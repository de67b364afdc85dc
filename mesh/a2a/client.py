"""``A2APeer``: a small client for one peer node, over a2a-sdk's JSON-RPC client.

    async with httpx.AsyncClient(timeout=30) as http:
        peer = A2APeer(http, "http://127.0.0.1:8017")
        result = await peer.send({"applicant_id": "APP-501", "amount": 250000}, skill="score")
        result.state, result.data            # "completed", {"score": 712, ...}
        result = await peer.call({...}, skill="score")   # the same, lean: see A2APeer.call

Transport and protocol errors are translated here, once, into ``RemoteError`` (reason
``unavailable`` / ``deadline`` / ``failed`` / ``rejected``). Every answer is read within
``max_answer_bytes`` (``mesh.a2a.bounded``: the blocking call's body, and each answer or stream
event the SDK's client reads); an answer over it, or one that is not an A2A answer at all (not
JSON-RPC, neither task nor message, HTTP 404/405, an unknown method) is ``unavailable``: whatever
answered there is not a working A2A node, and the retry tries the next instance. A task that ran and failed is NOT an
exception: it comes back as a ``TaskResult`` with ``state`` "failed"/"rejected"/"canceled" and
``error = {"reason", "message"}``; the caller decides what to do.
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    AgentCardResolutionError,
    Client,
    ClientCallContext,
    ClientConfig,
    ClientFactory,
)
from a2a.client.card_resolver import parse_agent_card
from a2a.helpers import get_data_parts, get_text_parts, new_data_part, new_text_part
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_CURRENT,
    VERSION_HEADER,
)
from a2a.utils.errors import (
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    InvalidParamsError,
    MethodNotFoundError,
    TaskNotFoundError,
)
from google.protobuf.json_format import MessageToDict, ParseError
from google.protobuf.struct_pb2 import Struct

from mesh.a2a.bounded import AnswerTooLarge, BoundedTransport, read_bounded
from mesh.a2a.card import JSON_MODE, card_to_dict
from mesh.errors import RemoteError, RemoteReason
from mesh.outbound import FetchFailed, bounded_get

log = logging.getLogger("mesh.a2a.client")

__all__ = [
    "CARD_TIMEOUT_S",
    "MAX_ANSWER_BYTES",
    "MAX_CARD_BYTES",
    "A2APeer",
    "TaskPage",
    "TaskResult",
    "TaskUpdate",
    "auth_headers",
    "state_name",
]

_FAILED_STATES = {"failed", "rejected", "canceled"}
# The lean SendMessage path (``A2APeer.call``) speaks the same JSON-RPC as the SDK's transport:
# same method, fields, version header, and the same error types for the same error codes.
_RPC_HEADERS = {VERSION_HEADER: PROTOCOL_VERSION_CURRENT, "Content-Type": "application/json"}
_RPC_ERRORS = {code: error for error, code in JSON_RPC_ERROR_CODE_MAP.items()}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_rpc_ids = itertools.count(1)
#: A card is a few KB; far bigger is not a card (the registry's cap too).
MAX_CARD_BYTES = 1_000_000
#: One deadline for a whole card (connect, headers, body).
CARD_TIMEOUT_S = 5.0
#: The largest answer (or stream event) read from a peer; a node's is MESH_MAX_ANSWER_BYTES.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# HTTP statuses that say no A2A endpoint is there (a JSON-RPC route answers every POST /).
_NOT_A2A_STATUS = frozenset({404, 405})


def state_name(state: int) -> str:
    """``TASK_STATE_COMPLETED`` -> ``"completed"``, ``TASK_STATE_INPUT_REQUIRED`` -> ``"input-required"``."""
    name = str(TaskState.Name(state))
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


def _state_json(value: Any) -> str:
    """The JSON form of a state (``"TASK_STATE_INPUT_REQUIRED"``) -> ``"input-required"``."""
    name = value if isinstance(value, str) and value else "TASK_STATE_UNSPECIFIED"
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


def _json_texts(parts: Any) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [str(p["text"]) for p in parts if isinstance(p, Mapping) and "text" in p]


def _json_data(parts: Any) -> list[Any]:
    if not isinstance(parts, list):
        return []
    return [p["data"] for p in parts if isinstance(p, Mapping) and "data" in p]


def _struct(value: Any) -> dict[str, Any]:
    return dict(MessageToDict(value)) if value else {}


def _whole(value: Any) -> Any:
    """Undo protobuf's numbers-are-doubles for whole numbers (``712.0`` -> ``712``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


@dataclass(frozen=True)
class TaskResult:
    """A task as the caller sees it. ``data``: the first JSON artifact part; ``text``: the text
    artifact parts (or the status message when there is no artifact)."""

    task_id: str
    context_id: str
    state: str
    data: dict[str, Any] | None = None
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.state == "completed"

    @property
    def done(self) -> bool:
        return self.state in {"completed", *_FAILED_STATES}

    @classmethod
    def from_json(cls, task: Mapping[str, Any]) -> TaskResult:
        """The same as ``from_task``, from the task's JSON form (a JSON-RPC result)."""
        data: dict[str, Any] | None = None
        texts: list[str] = []
        for artifact in task.get("artifacts") or ():
            parts = artifact.get("parts") if isinstance(artifact, Mapping) else None
            for value in _json_data(parts):
                if data is None and isinstance(value, dict):
                    data = _whole(value)
            texts.extend(_json_texts(parts))
        status = task.get("status")
        status = status if isinstance(status, Mapping) else {}
        message = status.get("message")
        parts = message.get("parts") if isinstance(message, Mapping) else None
        status_text = "\n".join(_json_texts(parts))
        state = _state_json(status.get("state"))
        found_meta = task.get("metadata")
        metadata = dict(found_meta) if isinstance(found_meta, Mapping) else {}
        error: dict[str, Any] | None = None
        if state in _FAILED_STATES:
            found = metadata.get("error")
            error = (
                dict(found)
                if isinstance(found, dict)
                else {"reason": state, "message": status_text or state}
            )
        return cls(
            task_id=str(task.get("id") or ""),
            context_id=str(task.get("contextId") or ""),
            state=state,
            data=data,
            text="".join(texts) if texts else ("" if data is not None else status_text),
            metadata=metadata,
            error=error,
        )

    @classmethod
    def from_task(cls, task: Task) -> TaskResult:
        data: dict[str, Any] | None = None
        texts: list[str] = []
        for artifact in task.artifacts:
            for value in get_data_parts(list(artifact.parts)):
                if data is None and isinstance(value, dict):
                    data = _whole(value)
            texts.extend(get_text_parts(list(artifact.parts)))
        status_text = "\n".join(get_text_parts(list(task.status.message.parts)))
        state = state_name(task.status.state)
        metadata = _struct(task.metadata)
        error: dict[str, Any] | None = None
        if state in _FAILED_STATES:
            found = metadata.get("error")
            error = (
                dict(found)
                if isinstance(found, dict)
                else {"reason": state, "message": status_text or state}
            )
        return cls(
            task_id=task.id,
            context_id=task.context_id,
            state=state,
            data=data,
            text="".join(texts) if texts else ("" if data is not None else status_text),
            metadata=metadata,
            error=error,
        )


@dataclass(frozen=True)
class TaskUpdate:
    """One streamed event: ``kind`` is "task", "status", "artifact" or "message"."""

    kind: str
    task_id: str
    context_id: str
    state: str = ""
    text: str = ""
    data: dict[str, Any] | None = None
    partial: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskPage:
    tasks: list[TaskResult]
    next_page_token: str
    total_size: int


def _task_id(resp: StreamResponse, kind: str | None) -> str:
    if kind == "task":
        return str(resp.task.id)
    if kind == "status_update":
        return str(resp.status_update.task_id)
    if kind == "artifact_update":
        return str(resp.artifact_update.task_id)
    if kind == "message":
        return str(resp.message.task_id)
    return ""


def _update(resp: StreamResponse) -> TaskUpdate | None:
    kind = resp.WhichOneof("payload")
    if kind == "task":
        t = resp.task
        return TaskUpdate("task", t.id, t.context_id, state=state_name(t.status.state))
    if kind == "status_update":
        s = resp.status_update
        meta = _struct(s.status.message.metadata)
        return TaskUpdate(
            "status",
            s.task_id,
            s.context_id,
            state=state_name(s.status.state),
            text="\n".join(get_text_parts(list(s.status.message.parts))),
            partial=bool(meta.get("partial")),
            metadata=_struct(s.metadata),
        )
    if kind == "artifact_update":
        a = resp.artifact_update
        data = next(
            (_whole(d) for d in get_data_parts(list(a.artifact.parts)) if isinstance(d, dict)), None
        )
        return TaskUpdate(
            "artifact",
            a.task_id,
            a.context_id,
            text="".join(get_text_parts(list(a.artifact.parts))),
            data=data,
        )
    if kind == "message":
        m = resp.message
        return TaskUpdate(
            "message", m.task_id, m.context_id, text="\n".join(get_text_parts(list(m.parts)))
        )
    return None


class A2APeer:
    """One peer node at ``base_url``. ``http`` is owned by the caller (timeouts included).

    ``headers`` go with every A2A call to this peer, never with the card fetch: a node sets the
    mesh token here once the peer is verified (``mesh.trust``). The ``http`` client's own
    headers go everywhere (the CLI puts the token the user gave it there). The card is read
    whole within ``card_timeout_s`` and ``MAX_CARD_BYTES``, or not at all; every other answer
    within ``max_answer_bytes`` (each event, for a stream)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        *,
        card: AgentCard | None = None,
        headers: Mapping[str, str] | None = None,
        card_timeout_s: float = CARD_TIMEOUT_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.headers: dict[str, str] = dict(headers or {})
        self.card_timeout_s = card_timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._card = card
        self._clients: dict[bool, Client] = {}
        # What the SDK's clients send through: ``http`` itself, each answer read within
        # ``max_answer_bytes`` (made with the first SDK client).
        self._bounded: httpx.AsyncClient | None = None

    def _context(self, timeout: float | None = None) -> ClientCallContext | None:
        """The SDK call context: the per-call timeout and this peer's headers."""
        if timeout is None and not self.headers:
            return None
        return ClientCallContext(timeout=timeout, service_parameters=dict(self.headers) or None)

    @property
    def name(self) -> str:
        return self._card.name if self._card is not None else self.base_url

    @contextmanager
    def _errors(self, skill: str = "") -> Iterator[None]:
        """The one place a2a-sdk / httpx errors become mesh errors."""
        try:
            yield
        except RemoteError:
            raise
        except (A2AClientError, A2AError, httpx.HTTPError) as exc:
            reason, message = self._classify(exc)
            raise RemoteError(message, peer=self.name, skill=skill, reason=reason) from exc

    def _classify(self, exc: BaseException) -> tuple[RemoteReason, str]:
        """Why a call failed (the retry policy retries only "unavailable"), and what to say."""
        if isinstance(exc, A2AClientTimeoutError | httpx.TimeoutException):
            return "deadline", f"{self.name} did not answer in time"
        if isinstance(exc, AnswerTooLarge) or isinstance(exc.__cause__, AnswerTooLarge):
            return "unavailable", (
                f"{self.name} at {self.base_url} answered more than {self.max_answer_bytes} "
                "bytes: not an A2A answer (a node's cap is MESH_MAX_ANSWER_BYTES)"
            )
        if isinstance(exc, AgentCardResolutionError):
            return "unavailable", (
                f"cannot read the agent card of {self.base_url}: {exc}; is the node running?"
            )
        if isinstance(exc, A2AClientError | httpx.HTTPError):
            status = _http_status(exc)
            if status in (401, 403):
                return "rejected", (
                    f"{self.name} refused the call (HTTP {status}): it needs the mesh token; "
                    "set MESH_TOKEN to the token its node was started with"
                )
            if status in _NOT_A2A_STATUS:
                return "unavailable", (
                    f"{self.name} at {self.base_url} answered HTTP {status}: no A2A endpoint there"
                )
            if status is not None and status not in (502, 503, 504):
                # An answer, not an outage: another attempt would get the same one.
                return "failed", f"{self.name} answered HTTP {status}: {exc}"
            return "unavailable", f"{self.name} is unavailable: {exc}"
        if isinstance(exc, TaskNotFoundError):
            return "failed", f"{self.name}: task not found"
        if isinstance(exc, MethodNotFoundError):
            return "unavailable", (
                f"{self.name} at {self.base_url} does not know the A2A method: not an A2A node"
            )
        if isinstance(exc, InvalidParamsError):
            return "rejected", f"{self.name} rejected the request: {exc}"
        return "failed", f"{self.name} answered with an error: {type(exc).__name__}: {exc}"

    async def card(self) -> AgentCard:
        """The peer's agent card (fetched once)."""
        if self._card is None:
            self._card = await self._read_card()
        return self._card

    async def card_dict(self) -> dict[str, Any]:
        return card_to_dict(await self.card())

    async def fetch_card_dict(self) -> dict[str, Any]:
        """The peer's card read now (not the cached one), as JSON; it becomes the cached one."""
        self._card = await self._read_card()
        return card_to_dict(self._card)

    async def _read_card(self) -> AgentCard:
        """GET the card (without ``headers``: cards are public), the whole answer within
        ``card_timeout_s`` and ``MAX_CARD_BYTES``: whoever a URL leads to may trickle or send
        gigabytes, and the card is read before the peer is trusted. Every failure is
        ``unavailable`` (the retry tries the next instance)."""
        url = self.base_url + AGENT_CARD_WELL_KNOWN_PATH
        problem = ""
        try:
            answer = await bounded_get(
                self.http, url, max_bytes=MAX_CARD_BYTES, timeout_s=self.card_timeout_s
            )
        except FetchFailed as exc:
            problem = {
                "timeout": f"no whole card within {self.card_timeout_s:g}s",
                "too_large": f"the answer is over {MAX_CARD_BYTES} bytes, not an agent card",
            }.get(exc.reason, exc.detail)
            if exc.reason == "unreachable":
                problem += "; is the node running?"
        else:
            if answer.status_code != 200:
                problem = f"HTTP {answer.status_code}"
            else:
                try:
                    card = parse_agent_card(json.loads(answer.content))
                except (ValueError, ParseError) as exc:
                    problem = f"not an agent card ({exc})"
                else:
                    # One line, the first time (re-reads every trust check would be noise).
                    level = logging.INFO if self._card is None else logging.DEBUG
                    log.log(level, "fetched the agent card of %s from %s", card.name[:100], url)
                    return card
        raise RemoteError(
            f"cannot read the agent card of {self.base_url}: {problem}",
            peer=self.name,
            skill="",
            reason="unavailable",
        )

    async def _client(self, streaming: bool) -> Client:
        if streaming not in self._clients:
            card = AgentCard()
            card.CopyFrom(await self.card())
            # Talk to the address we were given: the card may advertise a bind address.
            for iface in card.supported_interfaces:
                iface.url = self.base_url
            if self._bounded is None:
                self._bounded = httpx.AsyncClient(
                    transport=BoundedTransport(self.http, max_bytes=self.max_answer_bytes),
                    headers=self.http.headers,
                    timeout=self.http.timeout,
                    follow_redirects=False,
                    trust_env=False,
                )
            config = ClientConfig(streaming=streaming, httpx_client=self._bounded)
            self._clients[streaming] = ClientFactory(config).create(card)
        return self._clients[streaming]

    @staticmethod
    def message(
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Message:
        """The A2A message for a typed (dict) or text (str) request."""
        meta: dict[str, Any] = dict(metadata or {})
        if skill:
            meta["skill"] = skill
        struct = Struct()
        struct.update(meta)
        part = (
            new_text_part(payload)
            if isinstance(payload, str)
            else new_data_part(payload, media_type=JSON_MODE)
        )
        return Message(
            role=Role.ROLE_USER,
            message_id=message_id or uuid.uuid4().hex,
            context_id=context_id or "",
            parts=[part],
            metadata=struct,
        )

    async def send(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the SDK per call
        wait: bool = True,
    ) -> TaskResult:
        """Send one message and return the task (finished, unless ``wait=False``)."""
        msg = self.message(
            payload, skill=skill, message_id=message_id, context_id=context_id, metadata=metadata
        )
        request = SendMessageRequest(
            message=msg,
            configuration=SendMessageConfiguration(history_length=0, return_immediately=not wait),
        )
        call = self._context(timeout)
        result: TaskResult | None = None
        with self._errors(skill or ""):
            client = await self._client(streaming=False)
            async for resp in client.send_message(request, context=call):
                if resp.WhichOneof("payload") == "task":
                    result = TaskResult.from_task(resp.task)
                elif resp.WhichOneof("payload") == "message":
                    m = resp.message
                    text = "\n".join(get_text_parts(list(m.parts)))
                    result = TaskResult("", m.context_id, "completed", text=text)
        if result is None:
            raise self._not_a2a(skill)
        return result

    async def call(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the HTTP timeout of this call
        wait: bool = True,
    ) -> TaskResult:
        """``send`` on the hot path of a delegation: one blocking ``SendMessage``, its JSON
        built and read here (no protobuf round trips), errors translated like ``send``'s.
        Same wire as the SDK's JSON-RPC transport (method, fields, ``A2A-Version``); the
        client's own headers (the mesh token) go along."""
        meta: dict[str, Any] = dict(metadata or {})
        if skill:
            meta["skill"] = skill
        part: dict[str, Any] = (
            {"text": payload}
            if isinstance(payload, str)
            else {"data": payload, "mediaType": JSON_MODE}
        )
        message: dict[str, Any] = {
            "messageId": message_id or uuid.uuid4().hex,
            "role": "ROLE_USER",
            "parts": [part],
        }
        if context_id:
            message["contextId"] = context_id
        if meta:
            message["metadata"] = meta
        configuration: dict[str, Any] = {"historyLength": 0}
        if not wait:
            configuration["returnImmediately"] = True
        body = {
            "method": "SendMessage",
            "params": {"message": message, "configuration": configuration},
            "id": next(_rpc_ids),
            "jsonrpc": "2.0",
        }
        with self._errors(skill or ""):
            try:
                content = json.dumps(body, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise InvalidParamsError(f"the payload is not JSON: {exc}") from exc
            request = self.http.build_request(
                "POST",
                self.base_url,
                content=content,
                headers={**_RPC_HEADERS, **self.headers} if self.headers else _RPC_HEADERS,
                timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            response = await self.http.send(request, stream=True)
            try:
                response.raise_for_status()
                answer_bytes = await read_bounded(response, max_bytes=self.max_answer_bytes)
            finally:
                await response.aclose()
            try:
                answer = json.loads(answer_bytes)
            except ValueError as exc:
                raise A2AClientError(f"JSON Decode Error: {exc}") from exc
            result = _rpc_result(answer)
        task = result.get("task")
        if isinstance(task, Mapping):
            return TaskResult.from_json(task)
        message_out = result.get("message")
        if isinstance(message_out, Mapping):
            text = "\n".join(_json_texts(message_out.get("parts")))
            return TaskResult("", str(message_out.get("contextId") or ""), "completed", text=text)
        raise self._not_a2a(skill)

    def _not_a2a(self, skill: str | None) -> RemoteError:
        # A JSON-RPC answer without a task or a message: whatever answered is not an A2A node.
        return RemoteError(
            f"{self.name} at {self.base_url} answered without a task or a message: not an A2A "
            "answer",
            peer=self.name,
            skill=skill or "",
            reason="unavailable",
        )

    async def stream(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the SDK per call
    ) -> AsyncIterator[TaskUpdate]:
        """Send one message and yield its events as they arrive; then ``get_task`` for the end."""
        msg = self.message(
            payload, skill=skill, message_id=message_id, context_id=context_id, metadata=metadata
        )
        request = SendMessageRequest(
            message=msg, configuration=SendMessageConfiguration(history_length=0)
        )
        call = self._context(timeout)
        with self._errors(skill or ""):
            client = await self._client(streaming=True)
            async for resp in client.send_message(request, context=call):
                update = _update(resp)
                if update is not None:
                    yield update

    async def run(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the SDK per call
        on_task: Callable[[str], None] | None = None,
    ) -> TaskResult | None:
        """Stream one message and return its task as the stream left it: the events carry
        everything ``get_task`` would (status, metadata, artifacts), so one round trip does.
        ``on_task(task_id)`` runs as soon as the id is known (to cancel the task later).
        None when the stream ended without a task; check ``done`` for a stream cut short."""
        msg = self.message(
            payload, skill=skill, message_id=message_id, context_id=context_id, metadata=metadata
        )
        request = SendMessageRequest(
            message=msg, configuration=SendMessageConfiguration(history_length=0)
        )
        call = self._context(timeout)
        task: Task | None = None
        known = ""
        with self._errors(skill or ""):
            client = await self._client(streaming=True)
            async for resp in client.send_message(request, context=call):
                kind = resp.WhichOneof("payload")
                event_task = _task_id(resp, kind)
                if event_task and not known:
                    known = event_task
                    if on_task is not None:
                        on_task(known)
                if kind == "task":
                    task = resp.task
                elif kind == "status_update" and task is not None:
                    # What the server's TaskManager does with the same event.
                    update = resp.status_update
                    if update.HasField("metadata"):
                        task.metadata.MergeFrom(update.metadata)
                    task.status.CopyFrom(update.status)
                elif kind == "artifact_update" and task is not None:
                    append_artifact_to_task(task, resp.artifact_update)
                elif kind == "message":
                    m = resp.message
                    text = "\n".join(get_text_parts(list(m.parts)))
                    return TaskResult("", m.context_id, "completed", text=text)
        return None if task is None else TaskResult.from_task(task)

    async def get_task(self, task_id: str, *, history_length: int = 0) -> TaskResult:
        with self._errors():
            client = await self._client(streaming=False)
            task = await client.get_task(
                GetTaskRequest(id=task_id, history_length=history_length), context=self._context()
            )
        return TaskResult.from_task(task)

    async def cancel(self, task_id: str) -> TaskResult:
        with self._errors():
            client = await self._client(streaming=False)
            task = await client.cancel_task(CancelTaskRequest(id=task_id), context=self._context())
        return TaskResult.from_task(task)

    async def list_tasks(
        self,
        *,
        context_id: str | None = None,
        page_size: int = 50,
        page_token: str = "",
    ) -> TaskPage:
        with self._errors():
            client = await self._client(streaming=False)
            page = await client.list_tasks(
                ListTasksRequest(
                    context_id=context_id or "",
                    page_size=page_size,
                    page_token=page_token,
                    include_artifacts=True,
                ),
                context=self._context(),
            )
        return TaskPage(
            tasks=[TaskResult.from_task(t) for t in page.tasks],
            next_page_token=page.next_page_token,
            total_size=page.total_size,
        )

    async def aclose(self) -> None:
        """Close the SDK clients (the caller's ``httpx`` client stays open)."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._bounded is not None:
            await self._bounded.aclose()  # its transport leaves ``http`` open
            self._bounded = None


def auth_headers(token: str | None) -> dict[str, str]:
    """Headers that present the mesh token to nodes that require one (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def _rpc_result(answer: Any) -> Mapping[str, Any]:
    """The ``result`` of a JSON-RPC response; an error raises the A2A error the SDK's
    transport would raise for it (same code -> type map), anything malformed A2AClientError."""
    if not isinstance(answer, dict):
        raise A2AClientError(
            f"Invalid JSON-RPC response: expected an object, got {type(answer).__name__}"
        )
    error = answer.get("error")
    if error:
        if not isinstance(error, dict):
            raise A2AClientError(f"Invalid JSON-RPC response: error is not an object: {error!r}")
        code, message = error.get("code"), error.get("message", str(error))
        data: dict[str, Any] | None = None
        raw = error.get("data")
        if isinstance(raw, list):
            for item in raw:
                if isinstance(item, dict) and item.get("@type") == _ERROR_INFO:
                    data = item.get("metadata") or None
                    break
        if isinstance(code, int) and code in _RPC_ERRORS:
            raise _RPC_ERRORS[code](message, data=data)
        raise A2AClientError(f"JSON-RPC Error {code}: {message}")
    result = answer.get("result")
    if not isinstance(result, dict):
        raise A2AClientError("Invalid JSON-RPC response: it has no 'result' object")
    return result


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status behind a client error (the SDK wraps httpx's HTTPStatusError)."""
    cause = exc if isinstance(exc, httpx.HTTPStatusError) else exc.__cause__
    return cause.response.status_code if isinstance(cause, httpx.HTTPStatusError) else None

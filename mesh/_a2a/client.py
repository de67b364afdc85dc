"""``A2APeer``: one peer node, as a caller talks to it.

    async with httpx.AsyncClient(timeout=30) as http:
        peer = A2APeer(http, "http://127.0.0.1:8017")
        result = await peer.send({"applicant_id": "APP-501", "amount": 250000}, skill="score")
        result.state, result.data            # "completed", {"score": 712, ...}
        async for update in peer.stream("convert 100 eur to usd"):
            update.kind, update.text         # "status", "calling convert" ... as they happen

One way to send per need: ``send`` is one blocking ``SendMessage`` (one JSON body each way, the
task in the answer; built and read by ``mesh._a2a.jsonrpc`` without protobuf, lean enough for every
delegation; over the client's ``mesh._pool.DirectPool`` when the client is mesh's own, h11 on a
kept-alive connection without httpx's request/response layers), ``stream`` a
``SendStreamingMessage`` whose events arrive as they happen (through
the a2a-sdk's client, as do ``get_task``, ``cancel`` and ``list_tasks``). Every answer is parsed
by ``mesh._a2a.results``. A peer whose card offers HTTP+JSON and no JSON-RPC (not a mesh node:
they offer both, JSON-RPC first) is spoken to over HTTP+JSON: ``send`` goes through the SDK's
REST client instead (once its card is known: a delegation reads it before the first call; an
``A2APeer`` that has not read it learns it from the JSON-RPC send's 404/405, and sends again),
and the SDK's clients take the binding the card lists first among those two.

Transport and protocol errors become ``RemoteError`` here, once (``_translate``; the reason of an
httpx error is ``mesh._failures.reason_of``'s): ``unavailable`` / ``deadline`` / ``failed`` /
``rejected``. Every answer is read within ``max_answer_bytes`` (``mesh._a2a.bounded``: the
blocking call's body, and each answer or stream event the SDK's client reads); an answer over it,
or one that is not an A2A answer at all (not JSON-RPC, neither task nor message, HTTP 404/405, an
unknown method) is ``unavailable``: whatever answered there is not a working A2A node, and the
retry tries the next instance. A task that ran and failed is NOT an exception: it comes back as a
``TaskResult`` with ``state`` "failed"/"rejected"/"canceled" and ``error = {"reason",
"message"}``; the caller decides what to do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

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
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    AgentCard,
    AgentInterface,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, TransportProtocol
from a2a.utils.errors import A2AError, InvalidParamsError, MethodNotFoundError, TaskNotFoundError
from google.protobuf.json_format import ParseError
from google.protobuf.struct_pb2 import Struct

from mesh._a2a import jsonrpc
from mesh._a2a.bounded import AnswerTooLarge, BoundedTransport, read_bounded
from mesh._a2a.card import JSON_MODE, card_to_dict
from mesh._a2a.results import TaskPage, TaskResult, TaskUpdate, as_json
from mesh._errors import FetchFailed, RemoteError, RemoteReason
from mesh._failures import NOT_A2A_STATUS, reason_of, status_of
from mesh._outbound import bounded_get
from mesh._pool import REPLAYABLE, DirectPool, plain_mesh_transport
from mesh._tls import describe_failure, verify_failure

log = logging.getLogger("mesh._a2a.client")

__all__ = [
    "CARD_TIMEOUT_S",
    "MAX_ANSWER_BYTES",
    "MAX_CARD_BYTES",
    "A2APeer",
    "TaskPage",
    "TaskResult",
    "TaskUpdate",
    "auth_headers",
]

#: A card is a few KB; far bigger is not a card (the registry's cap too).
MAX_CARD_BYTES = 1_000_000
#: One deadline for a whole card (connect, headers, body).
CARD_TIMEOUT_S = 5.0
#: The largest answer (or stream event) read from a peer; a node's is MESH_MAX_ANSWER_BYTES.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# The bindings the SDK's clients may use, the card's order deciding (a mesh node: JSON-RPC).
_BINDINGS = (TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON)
# The states after which a stream has nothing more to say (terminal, or waiting for input).
_ENDING = frozenset(
    {"completed", "failed", "rejected", "canceled", "input-required", "auth-required"}
)


class A2APeer:
    """One peer node at ``base_url``. ``http`` is owned by the caller (timeouts included).

    ``headers`` go with every A2A call to this peer, never with the card fetch: a node sets the
    mesh token here once the peer is verified (``mesh._trust``). The ``http`` client's own
    headers go everywhere (the CLI puts the token the user gave it there). The card is read
    whole within ``card_timeout_s`` and ``MAX_CARD_BYTES``, or not at all; every other answer
    within ``max_answer_bytes`` (each event, for a stream). ``credential``, when set, gives
    headers made fresh for each call (a node with keys: its caller identity token,
    ``mesh._identity``), over ``headers``."""

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
        self.credential: Callable[[], Mapping[str, str]] | None = None
        self.card_timeout_s = card_timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._card = card
        self._clients: dict[bool, Client] = {}
        # What the SDK's clients send through: ``http`` itself, each answer read within
        # ``max_answer_bytes`` (made with the first SDK client).
        self._bounded: httpx.AsyncClient | None = None
        # The JSON-RPC endpoint, and the direct pool ``send`` takes when ``http`` has one.
        self._url = httpx.URL(self.base_url)
        self._direct_for: httpx.AsyncClient | None = None
        self._direct: DirectPool | None = None
        # ``_direct_headers``' last list, by what it was made of.
        self._merged: tuple[list[Any], tuple[Any, ...], list[tuple[str, str]]] | None = None
        # Whether the card speaks HTTP+JSON only, by the card it was read of (asked per send).
        self._rest: tuple[AgentCard, bool] | None = None

    @property
    def name(self) -> str:
        return self._card.name if self._card is not None else self.base_url

    # -- sending ----------------------------------------------------------------------------
    async def send(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the HTTP timeout of this call
        wait: bool = True,
        task_id: str | None = None,
        sent: Callable[[], object] | None = None,
    ) -> TaskResult:
        """Send one message (a dict: one JSON data part; a str: text) and return its task:
        finished, or as it is once it exists with ``wait=False``. With ``task_id`` (and its
        ``context_id``) the message goes to that task: the answer to a task that waits for
        input (``input-required``/``auth-required``). Re-sending the same
        ``message_id`` returns the same task (the node deduplicates). ``timeout`` bounds the
        whole call except connecting, which the client's own connect timeout bounds when
        sooner (a host that never answers is ``unavailable``: another instance may be up).
        ``sent()``, when the call goes through the client's direct pool, is called as soon as
        the request's bytes are written, before its answer is waited for
        (``DirectPool.post``): the caller's bookkeeping that does not need the answer runs
        while the peer works. Other ways of sending do not call it."""

        # Each way called directly (no closure made and awaited per call: every delegation
        # sends here).
        if self._card is None or not self._rest_only(self._card):
            try:
                return await self._send_jsonrpc(
                    payload,
                    skill=skill,
                    message_id=message_id,
                    context_id=context_id,
                    metadata=metadata,
                    timeout=timeout,
                    wait=wait,
                    task_id=task_id,
                    sent=sent,
                )
            except RemoteError as exc:
                # No JSON-RPC here (404/405: nothing was run): a peer whose card we have not
                # read yet may speak HTTP+JSON only.
                if self._card is not None or status_of(exc.__cause__ or exc) not in NOT_A2A_STATUS:
                    raise
                try:
                    card = await self.card()
                except RemoteError:
                    card = None  # nothing there: the JSON-RPC error says so
                if card is None or not _rest_only(card):
                    raise
        return await self._send_rest(
            payload,
            skill=skill,
            message_id=message_id,
            context_id=context_id,
            metadata=metadata,
            timeout=timeout,
            wait=wait,
            task_id=task_id,
        )

    async def _send_jsonrpc(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None,
        message_id: str | None,
        context_id: str | None,
        metadata: Mapping[str, Any] | None,
        timeout: float | None,  # noqa: ASYNC109 - the HTTP timeout of this call
        wait: bool,
        task_id: str | None,
        sent: Callable[[], object] | None = None,
    ) -> TaskResult:
        """``send`` as one JSON-RPC request built and read by ``mesh._a2a.jsonrpc``."""
        # ``_errors``' translation, without a context manager's generator per call.
        try:
            content = jsonrpc.send_message_body(
                payload,
                skill=skill,
                message_id=message_id,
                context_id=context_id,
                metadata=metadata,
                wait=wait,
                task_id=task_id,
            )
            direct = self._direct_pool()
            if direct is not None:
                answer = await self._post_direct(direct, content, timeout, skill, sent)
            else:
                answer = await self._post_httpx(content, timeout, skill)
            result = jsonrpc.result_of(answer)
        except RemoteError:
            raise
        except (A2AError, httpx.HTTPError) as exc:
            raise self._translated(exc, skill or "") from exc
        # A parsed answer's objects are dicts: that check before the ABC's.
        if type(task := result.get("task")) is dict or isinstance(task, Mapping):
            return TaskResult.from_json(task)
        if isinstance(message := result.get("message"), Mapping):
            return TaskResult.from_message(message)
        raise self._not_a2a(skill)

    async def _post_direct(
        self,
        direct: DirectPool,
        content: bytes,
        timeout: float | None,  # noqa: ASYNC109 - the deadline of this call
        skill: str | None,
        sent: Callable[[], object] | None = None,
    ) -> bytes:
        """The JSON-RPC POST through the client's ``DirectPool`` (the hot path, see
        ``mesh._pool``): the same headers as through httpx (the client's own, the call's), a
        stale kept-alive connection retried once (the node deduplicates by message id), one
        deadline for the whole answer: ``timeout``, else the client's read timeout."""
        configured = self.http.timeout
        total = timeout if timeout is not None else configured.read
        connect = configured.connect
        if total is not None:
            connect = total if connect is None else min(connect, total)
        status, answer = await direct.post(
            self._url,
            self._direct_headers(),
            content,
            timeout=total,
            connect_timeout=connect,
            max_bytes=self.max_answer_bytes,
            too_large=lambda: AnswerTooLarge(self.max_answer_bytes),
            error_bytes=_REFUSAL_BYTES,
            sent=sent,
        )
        if 200 <= status < 300:
            return answer
        if status == 403:
            raise self._refused(answer, skill)
        # httpx's own error for the status (what ``_translate`` reads), as ``_post_httpx``.
        request = httpx.Request("POST", self._url)
        httpx.Response(status, content=answer, request=request).raise_for_status()
        raise AssertionError("unreachable")  # raise_for_status raised for a non-2xx status

    async def _post_httpx(
        self,
        content: bytes,
        timeout: float | None,  # noqa: ASYNC109 - the HTTP timeout of this call
        skill: str | None,
    ) -> bytes:
        """The JSON-RPC POST through the ``httpx`` client (one that is not mesh's own)."""
        request = self.http.build_request(
            "POST",
            self.base_url,
            content=content,
            headers={**jsonrpc.HEADERS, **self._call_headers()},
            timeout=self._timeout(timeout),
            # Sent again once if a stale kept-alive connection loses it (mesh._pool): the
            # node deduplicates by message id, so a message that did arrive runs once.
            extensions={REPLAYABLE: True},
        )
        response = await self.http.send(request, stream=True)
        try:
            if response.status_code == 403:
                try:
                    refusal = await read_bounded(response, max_bytes=_REFUSAL_BYTES)
                except AnswerTooLarge:
                    refusal = b""
                raise self._refused(refusal, skill)
            response.raise_for_status()
            return await read_bounded(response, max_bytes=self.max_answer_bytes)
        finally:
            await response.aclose()

    def _rest_only(self, card: AgentCard) -> bool:
        """``_rest_only(card)``, worked out once per card (a card is replaced, never changed)."""
        known = self._rest
        if known is None or known[0] is not card:
            known = self._rest = (card, _rest_only(card))
        return known[1]

    def _refused(self, body: bytes, skill: str | None) -> RemoteError:
        # A call policy's refusal (mesh._policy) says who may not call what.
        return RemoteError(
            f"{self.name} refused the call (HTTP 403): {_refusal(body)}",
            peer=self.name,
            skill=skill or "",
            reason="rejected",
        )

    def _direct_pool(self) -> DirectPool | None:
        """The ``DirectPool`` of the transport ``http`` sends this peer's calls through: one of
        mesh's (``mesh._pool.create_transport``) on a client that adds nothing of its own to a
        request (no auth, no event hooks); None for any other client (then httpx sends)."""
        if self._direct_for is not self.http:
            self._direct_for = self.http
            self._direct = None
            transport = plain_mesh_transport(self.http, self._url)
            if transport is not None:
                self._direct = transport.direct
        return self._direct

    def _direct_headers(self) -> list[tuple[str, str]]:
        """The headers of a direct call: the call's over the client's, by name, as httpx
        merges them; the same list while neither changes (a fresh credential changes them
        every call)."""
        # The client's headers as httpx holds them (its list of raw name, lower-case name and
        # value: compared as it is, not copied out through ``Headers.raw`` per call; httpx is
        # pinned below 1.0, where it is stable) and the call's.
        client = self.http.headers._list
        call = tuple(self._call_headers().items())
        known = self._merged
        if known is not None and known[0] == client and known[1] == call:
            return known[2]
        headers = self._client_headers()
        for name, value in (*jsonrpc.HEADERS.items(), *call):
            headers[name.lower()] = value
        merged = list(headers.items())
        self._merged = (list(client), call, merged)
        return merged

    def _client_headers(self) -> dict[str, str]:
        """The client's own headers (lower-case names), as httpx would send them, asking for
        no compression (the direct path decodes none)."""
        headers = dict(self.http.headers.multi_items())
        headers["accept-encoding"] = "identity"
        return headers

    async def _send_rest(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None,
        message_id: str | None,
        context_id: str | None,
        metadata: Mapping[str, Any] | None,
        timeout: float | None,  # noqa: ASYNC109 - forwarded to the SDK per call
        wait: bool,
        task_id: str | None,
    ) -> TaskResult:
        """``send`` through the SDK's client (the peer speaks HTTP+JSON only)."""
        with self._errors(skill or ""):
            try:
                message = _message(payload, skill, message_id, context_id, metadata, task_id)
            except (TypeError, ValueError) as exc:
                raise InvalidParamsError(f"the payload is not JSON: {exc}") from exc
            request = SendMessageRequest(
                message=message,
                configuration=SendMessageConfiguration(
                    history_length=0, return_immediately=not wait
                ),
            )
            client = await self._client(streaming=False)
            answers = cast(
                "AsyncGenerator[StreamResponse, None]",
                client.send_message(request, context=self._context(timeout)),
            )
            async with contextlib.aclosing(answers):
                async for answer in answers:  # a blocking send: exactly one answer
                    found = as_json(answer)
                    if isinstance(task := found.get("task"), Mapping):
                        return TaskResult.from_json(task)
                    if isinstance(reply := found.get("message"), Mapping):
                        return TaskResult.from_message(reply)
        raise self._not_a2a(skill)

    async def stream(
        self,
        payload: dict[str, Any] | str,
        *,
        skill: str | None = None,
        message_id: str | None = None,
        context_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the SDK per call
        task_id: str | None = None,
    ) -> AsyncGenerator[TaskUpdate, None]:
        """Send one message (to the task ``task_id`` when given, as ``send``) and yield its
        events as they arrive; ``get_task`` for the end. The stream stops after the first
        event in a terminal or interrupted state: a task waiting for input says so and the
        stream ends there (a subscription would stay open)."""
        request = SendMessageRequest(
            message=_message(payload, skill, message_id, context_id, metadata, task_id),
            configuration=SendMessageConfiguration(history_length=0),
        )
        with self._errors(skill or ""):
            client = await self._client(streaming=True)
            events = cast(
                "AsyncGenerator[StreamResponse, None]",
                client.send_message(request, context=self._context(timeout)),
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    update = TaskUpdate.from_json(as_json(event))
                    if update is None:
                        continue
                    yield update
                    if update.kind in ("task", "status") and update.state in _ENDING:
                        return

    async def subscribe(
        self,
        task_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the SDK per call
    ) -> AsyncGenerator[TaskUpdate, None]:
        """``SubscribeToTask``: the task as it is now, then its events as they arrive. Stops
        after the first event in a terminal or interrupted state, as ``stream`` does (the
        SDK's subscription stays open on a waiting task). A task already terminal is a
        ``RemoteError`` (the node answers -32004): ``get_task`` has its end."""
        with self._errors():
            client = await self._client(streaming=True)
            events = cast(
                "AsyncGenerator[StreamResponse, None]",
                client.subscribe(
                    SubscribeToTaskRequest(id=task_id), context=self._context(timeout)
                ),
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    update = TaskUpdate.from_json(as_json(event))
                    if update is None:
                        continue
                    yield update
                    if update.kind in ("task", "status") and update.state in _ENDING:
                        return

    # -- tasks ------------------------------------------------------------------------------
    async def get_task(self, task_id: str, *, history_length: int = 0) -> TaskResult:
        with self._errors():
            client = await self._client(streaming=False)
            task = await client.get_task(
                GetTaskRequest(id=task_id, history_length=history_length), context=self._context()
            )
        return TaskResult.from_json(as_json(task))

    async def find_task(self, task_id: str) -> TaskResult | None:
        """``get_task``, or None when the peer answers that it has no such task."""
        try:
            with self._errors():
                client = await self._client(streaming=False)
                task = await client.get_task(
                    GetTaskRequest(id=task_id, history_length=0), context=self._context()
                )
        except RemoteError as exc:
            if isinstance(exc.__cause__, TaskNotFoundError):
                return None
            raise
        return TaskResult.from_json(as_json(task))

    async def cancel(self, task_id: str) -> TaskResult:
        with self._errors():
            client = await self._client(streaming=False)
            task = await client.cancel_task(CancelTaskRequest(id=task_id), context=self._context())
        return TaskResult.from_json(as_json(task))

    async def list_tasks(
        self,
        *,
        context_id: str | None = None,
        page_size: int = 50,
        page_token: str = "",
        state: str | None = None,
        include_artifacts: bool = True,
    ) -> TaskPage:
        """One page of the peer's tasks, newest first; ``state`` ("input-required", as
        ``TaskResult.state`` spells it) keeps those in that state."""
        status = TaskState.TASK_STATE_UNSPECIFIED
        if state:
            try:
                status = TaskState.Value("TASK_STATE_" + state.upper().replace("-", "_"))
            except ValueError:
                raise ValueError(f"{state!r} is not a task state") from None
        with self._errors():
            client = await self._client(streaming=False)
            page = await client.list_tasks(
                ListTasksRequest(
                    context_id=context_id or "",
                    status=status,
                    page_size=page_size,
                    page_token=page_token,
                    history_length=0,
                    include_artifacts=include_artifacts,
                ),
                context=self._context(),
            )
        return TaskPage(
            tasks=[TaskResult.from_json(as_json(t)) for t in page.tasks],
            next_page_token=page.next_page_token,
            total_size=page.total_size,
        )

    # -- the card ---------------------------------------------------------------------------
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
            failure = verify_failure(exc)
            if failure is not None:
                problem = describe_failure(url, failure)
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

    async def aclose(self) -> None:
        """Close the SDK clients (the caller's ``httpx`` client stays open)."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._bounded is not None:
            await self._bounded.aclose()  # its transport leaves ``http`` open
            self._bounded = None

    # -- plumbing ---------------------------------------------------------------------------
    def _timeout(self, timeout: float | None) -> Any:
        if timeout is None:
            return httpx.USE_CLIENT_DEFAULT
        connect = self.http.timeout.connect
        return httpx.Timeout(timeout, connect=timeout if connect is None else min(connect, timeout))

    def _context(self, timeout: float | None = None) -> ClientCallContext | None:
        """The SDK call context: the per-call timeout and this peer's headers."""
        headers = self._call_headers()
        if timeout is None and not headers:
            return None
        return ClientCallContext(timeout=timeout, service_parameters=headers or None)

    def _call_headers(self) -> dict[str, str]:
        """The headers of one call: ``headers``, and a fresh ``credential`` over them."""
        if self.credential is None:
            return dict(self.headers)
        return {**self.headers, **self.credential()}

    async def _client(self, streaming: bool) -> Client:
        if streaming not in self._clients:
            card = AgentCard()
            card.CopyFrom(await self.card())
            # Talk to the address we were given: the card may advertise a bind address (an
            # HTTP+JSON interface keeps its path, under our origin).
            for iface in card.supported_interfaces:
                iface.url = _rebased(iface, self.base_url)
            if self._bounded is None:
                self._bounded = httpx.AsyncClient(
                    transport=BoundedTransport(self.http, max_bytes=self.max_answer_bytes),
                    headers=self.http.headers,
                    timeout=self.http.timeout,
                    follow_redirects=False,
                    trust_env=False,
                )
            config = ClientConfig(
                streaming=streaming,
                httpx_client=self._bounded,
                supported_protocol_bindings=list(_BINDINGS),
            )
            self._clients[streaming] = ClientFactory(config).create(card)
        return self._clients[streaming]

    @contextmanager
    def _errors(self, skill: str = "") -> Iterator[None]:
        """Where a2a-sdk and httpx errors become ``RemoteError`` (``_translated``, the one
        translation; ``_send_jsonrpc`` applies it without this context manager)."""
        try:
            yield
        except RemoteError:
            raise
        except (A2AError, httpx.HTTPError) as exc:
            raise self._translated(exc, skill) from exc

    def _translated(self, exc: A2AError | httpx.HTTPError, skill: str) -> RemoteError:
        reason, message = self._translate(exc)
        return RemoteError(message, peer=self.name, skill=skill, reason=reason)

    def _translate(self, exc: A2AError | httpx.HTTPError) -> tuple[RemoteReason, str]:
        """Why a call failed (only "unavailable" is retried, at another instance), and what
        to say. Protocol answers by their A2A error type; transport failures (the SDK wraps
        httpx's errors) by ``reason_of``."""
        name, url = self.name, self.base_url
        if isinstance(exc, AnswerTooLarge) or isinstance(exc.__cause__, AnswerTooLarge):
            return "unavailable", (
                f"{name} at {url} answered more than {self.max_answer_bytes} bytes: not an A2A "
                "answer (a node's cap is MESH_MAX_ANSWER_BYTES)"
            )
        if isinstance(exc, AgentCardResolutionError):
            return (
                "unavailable",
                f"cannot read the agent card of {url}: {exc}; is the node running?",
            )
        if isinstance(exc, MethodNotFoundError):
            return "unavailable", f"{name} at {url} does not know the A2A method: not an A2A node"
        if isinstance(exc, InvalidParamsError):
            return "rejected", f"{name} rejected the request: {exc}"
        if isinstance(exc, TaskNotFoundError):
            return "failed", f"{name}: task not found"
        if isinstance(exc, A2AError) and not isinstance(exc, A2AClientError):
            return "failed", f"{name} answered with an error: {type(exc).__name__}: {exc}"
        failure = verify_failure(exc)
        if failure is not None:
            # Another instance may hold a certificate this process trusts.
            return "unavailable", describe_failure(url, failure)
        transport = exc if isinstance(exc, httpx.HTTPError) else exc.__cause__
        if not isinstance(transport, httpx.HTTPError):
            if isinstance(exc, A2AClientTimeoutError):
                return "deadline", f"{name} did not answer in time"
            # Not JSON, not JSON-RPC, an SSE error event: nothing a working node answers.
            return "unavailable", f"{name} at {url} did not answer as an A2A node: {exc}"
        reason, status = reason_of(transport), status_of(transport)
        if reason == "deadline":
            return reason, f"{name} did not answer in time"
        if status == 403:
            # A call policy's refusal (mesh._policy): the callee says who may not call what.
            body = _read(transport)
            return reason, f"{name} refused the call (HTTP 403): {_refusal(body)}"
        if status == 401:
            return reason, (
                f"{name} refused the call (HTTP {status}): it needs the mesh token; "
                "set MESH_TOKEN to the token its node was started with"
            )
        if status in NOT_A2A_STATUS:
            return reason, f"{name} at {url} answered HTTP {status}: no A2A endpoint there"
        if status is not None:
            # 502/503/504 (unavailable): an outage in front of that node; any other: an answer.
            return reason, f"{name} at {url} answered HTTP {status}: {transport}"
        return reason, f"the connection to {url} failed: {transport}; is the node running?"

    def _not_a2a(self, skill: str | None) -> RemoteError:
        # A JSON-RPC answer without a task or a message: whatever answered is not an A2A node.
        return RemoteError(
            f"{self.name} at {self.base_url} answered without a task or a message: not an A2A "
            "answer",
            peer=self.name,
            skill=skill or "",
            reason="unavailable",
        )


def _rest_only(card: AgentCard) -> bool:
    """Whether ``card`` offers HTTP+JSON and no JSON-RPC."""
    bindings = {i.protocol_binding for i in card.supported_interfaces}
    return TransportProtocol.JSONRPC not in bindings and TransportProtocol.HTTP_JSON in bindings


def _rebased(iface: AgentInterface, base_url: str) -> str:
    """The URL to reach ``iface`` at: ``base_url`` for JSON-RPC (served at the root of the
    address we were given), the interface's own path under ``base_url``'s origin for others."""
    if iface.protocol_binding == TransportProtocol.JSONRPC:
        return base_url
    base = urlsplit(base_url)
    return urlunsplit((base.scheme, base.netloc, urlsplit(iface.url).path, "", ""))


# The most of a refusal's body read for its reason.
_REFUSAL_BYTES = 4096


def _read(error: httpx.HTTPError) -> bytes:
    """The body of the answer behind ``error`` when it was read (not a stream left unread)."""
    if not isinstance(error, httpx.HTTPStatusError):
        return b""
    try:
        return error.response.content
    except httpx.ResponseNotRead:
        return b""


def _refusal(raw: bytes) -> str:
    """The message of a refusal's JSON body (JSON-RPC or REST error shape), else a stand-in."""
    try:
        body = json.loads(raw[:_REFUSAL_BYTES])
    except ValueError:
        body = None
    found = body.get("error") if isinstance(body, dict) else None
    message = found.get("message") if isinstance(found, dict) else found
    if isinstance(message, str) and message:
        return message[:500]
    return "not allowed to call it (no reason given)"


def _message(
    payload: dict[str, Any] | str,
    skill: str | None,
    message_id: str | None,
    context_id: str | None,
    metadata: Mapping[str, Any] | None,
    task_id: str | None = None,
) -> Message:
    """The protobuf message the SDK's client sends (``stream``), as ``jsonrpc`` builds it."""
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
        task_id=task_id or "",
        parts=[part],
        metadata=struct,
    )


def auth_headers(token: str | None) -> dict[str, str]:
    """Headers that present the mesh token to nodes that require one (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}

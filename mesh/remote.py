"""Remote agents as tools: ``remote("credit-bureau", skill="score")``.

    loan_officer = Agent(
        name="loan-officer",
        tools=[lookup_applicant,
               remote("credit-bureau", skill="score"),     # found through the registry
               remote("income-verifier")],                 # every skill of that agent
    )

``remote(...)`` is a ``Toolset``. At the start of each turn it resolves the agent's instances
(``DiscoveryClient``, or a fixed URL), reads the agent card (cached), and declares one tool per
skill: a typed skill's tool takes the skill's input JSON Schema (card extension
``urn:mesh:skill-schemas:v1``) as parameters; a text skill's tool takes ``{"text": ...}``.

A call checks the arguments against the schema (a bad argument goes back to the model as a
tool error, nothing is sent), then sends ONE A2A message (data part, metadata ``skill``,
``traceparent``, ``deadline``, ``caller``) under the retry policy: a failed attempt is re-sent
with the SAME message id to the next healthy instance (the node deduplicates, so the skill runs
once), each instance behind its circuit breaker, all within the call's deadline. The answer is
checked against the output schema and given to the model. Every failure reaches the model as a
``RemoteError`` (peer, skill, reason) - never a crash, never a hang. Cancelling the turn sends
CancelTask for the child task.

The caller's session keeps one A2A context per peer (session state ``_mesh.contexts.<peer>``),
so a specialist sees the conversation continue. The child's token usage (its ``usage`` plus its
own ``children_usage``) goes to ``ctx.metadata["usage_sink"]`` when the caller provides one.

Inside a node, the lifespan calls ``bind(discovery=..., http=..., metrics=...)`` and ``aclose()``.
Used on its own (a script with a ``Runner``), the toolset opens its own HTTP client, which connects
only inside ``$MESH_PEER_NETWORKS`` (default: any network but link-local), and finds the registry
at ``$MESH_REGISTRY`` (default http://127.0.0.1:8400); call ``aclose()`` when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import httpx

from mesh.errors import AgentNotFound, ConfigError, DiscoveryError, RemoteError, ToolError
from mesh.netpolicy import NetworkPolicy
from mesh.resilience import (
    BreakerBoard,
    BreakerState,
    CircuitOpen,
    DeadlineExceeded,
    RetryPolicy,
    call_with_failover,
)
from mesh.schema_check import SchemaViolation, check
from mesh.tools import ToolContext
from mesh.tracing import TraceParent
from mesh.trust import Admitted, PeerRefused, PeerTrust

if TYPE_CHECKING:
    from mesh.a2a.client import A2APeer, TaskResult
    from mesh.discovery.client import DiscoveryClient
    from mesh.metrics import BreakerState as MetricBreakerState
    from mesh.metrics import NodeMetrics

__all__ = ["RemoteAgent", "RemoteSkillTool", "context_key", "remote"]

log = logging.getLogger("mesh.remote")

TEXT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "What to ask, in plain language."}},
    "required": ["text"],
}
_OPEN_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_BREAKER_NAMES: dict[BreakerState, MetricBreakerState] = {
    BreakerState.CLOSED: "closed",
    BreakerState.HALF_OPEN: "half-open",
    BreakerState.OPEN: "open",
}
# A finished child task's ``metadata.error.reason`` -> the RemoteError reason. A task its node
# ended because it stopped (shutdown past the drain grace, or a crash found at restart) says
# nothing about the request: the instance was unavailable, and the retry (same message id,
# which that node released) goes to another one.
_REASONS = {
    "deadline": "deadline",
    "rejected": "rejected",
    "canceled": "canceled",
    "shutdown": "unavailable",
    "interrupted": "unavailable",
}
# Trace of turns that arrived without one: every delegation of one turn shares a trace id.
_TURN_TRACES: OrderedDict[str, TraceParent] = OrderedDict()
_TURN_TRACES_MAX = 1024


def context_key(peer: str) -> str:
    """The session-state key holding the A2A context id used with ``peer``."""
    return f"_mesh.contexts.{peer}"


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _tool_name(peer: str, skill_id: str, typed: bool) -> str:
    raw = f"{peer}_{skill_id}" if typed or skill_id != "chat" else f"ask_{peer}"
    return re.sub(r"[^A-Za-z0-9_]", "_", raw)[:64]


@dataclass
class CallRecord:
    """One finished delegation, kept (the last few) for /introspect."""

    skill: str
    target: str
    task_id: str
    trace_id: str
    started_at: float
    ended_at: float
    outcome: str
    attempts: int


class RemoteSkillTool:
    """One skill of a remote agent, as a ``Tool``."""

    def __init__(
        self,
        owner: RemoteAgent,
        skill_id: str,
        *,
        description: str,
        input_schema: dict[str, Any] | None,
        output_schema: dict[str, Any] | None,
        typed: bool,
    ) -> None:
        self.owner = owner
        self.skill_id = skill_id
        self.typed = typed
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.name = _tool_name(owner.peer, skill_id, typed)
        self.description = description or f"Skill {skill_id!r} of agent {owner.peer!r}."
        if typed:
            self.parameters: dict[str, Any] = dict(input_schema or _OPEN_PARAMETERS)
        else:
            self.parameters = TEXT_PARAMETERS

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self.owner.invoke(self, args, ctx)

    def __repr__(self) -> str:
        return f"RemoteSkillTool({self.owner.peer!r}, {self.skill_id!r})"


class RemoteAgent:
    """A peer agent's skills as tools (see the module docstring). Build with ``remote()``."""

    def __init__(
        self,
        agent: str | None,
        skill: str | None = None,
        *,
        url: str | None = None,
        deadline_s: float = 30.0,
        policy: RetryPolicy | None = None,
        breakers: BreakerBoard | None = None,
        card_ttl_s: float = 30.0,
    ) -> None:
        if agent is None and url is None:
            raise ConfigError("remote(): give an agent name or url=")
        if deadline_s <= 0:
            raise ConfigError(f"remote({agent or url!r}): deadline_s must be > 0")
        self.url = url.rstrip("/") if url else None
        self.peer = agent or self.url or ""
        self.skill = skill
        self.deadline_s = deadline_s
        self.policy = policy or RetryPolicy(attempts=4, initial_delay=0.1, max_delay=1.0)
        self.breakers = breakers or BreakerBoard(failure_threshold=3, cool_down=10.0)
        self.breakers.on_change = self._breaker_changed
        self.card_ttl_s = card_ttl_s
        self.caller = ""
        self.instances: list[str] = []
        self.recent: deque[CallRecord] = deque(maxlen=20)
        self._named = agent is not None
        self._discovery: DiscoveryClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._metrics: NodeMetrics | None = None
        self._owned: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._peers: dict[str, A2APeer] = {}
        # Until a node binds its own (token and MESH_PEER_NETWORKS), or _ready() opens this
        # toolset's own client: the card must name the agent asked for.
        self._trust = PeerTrust()
        self._card: dict[str, Any] | None = None
        self._card_at = float("-inf")
        # The largest answer read from a peer (None: A2APeer's default, 32 MiB).
        self._max_answer_bytes: int | None = None
        # Whether the breaker series show the current instances.
        self._exported = False

    # -- lifecycle ------------------------------------------------------------------------
    def bind(
        self,
        *,
        discovery: DiscoveryClient | None = None,
        http: httpx.AsyncClient | None = None,
        metrics: NodeMetrics | None = None,
        caller: str | None = None,
        trust: PeerTrust | None = None,
        max_answer_bytes: int | None = None,
    ) -> None:
        """Use the node's shared clients, metrics and peer checks (called from the node's
        lifespan): ``trust`` decides which instance URLs get calls and the mesh token;
        ``max_answer_bytes`` bounds each answer read from a peer (``MESH_MAX_ANSWER_BYTES``)."""
        if max_answer_bytes is not None:
            self._max_answer_bytes = max_answer_bytes
            self._peers.clear()
        if trust is not None:
            self._trust = trust
            self._peers.clear()
        if discovery is not None:
            self._discovery = discovery
        if http is not None:
            self._http = http
            self._peers.clear()
        if metrics is not None:
            self._metrics = metrics
            self._exported = False
        if caller:
            self.caller = caller
        self._loop = None  # bound resources belong to the running loop

    async def aclose(self) -> None:
        """Close what this toolset opened itself (never what ``bind`` gave it)."""
        for peer in self._peers.values():
            await peer.aclose()
        self._peers.clear()
        owned, self._owned = self._owned, []
        for resource in owned:
            await resource.aclose()
            if resource is self._http:
                self._http = None
            if resource is self._discovery:
                self._discovery = None

    async def _ready(self) -> tuple[httpx.AsyncClient, DiscoveryClient | None]:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            # First use, or a new event loop (a test, a script): resources of the old one
            # cannot be used here.
            self._lock = asyncio.Lock()
            if self._loop is not None and self._owned:
                self._owned = []
                self._http = None
                self._discovery = None
                self._peers.clear()
            self._loop = loop
        async with self._lock:
            if self._http is None:
                from mesh.netguard import create_http_client

                # Outside a node (a node binds its own client): no token to protect, so any
                # network unless MESH_PEER_NETWORKS narrows it; link-local (cloud metadata)
                # never. Checked before each URL is used (PeerTrust, for a clear refusal) and
                # as each connection is made (the client), like a node's.
                networks = NetworkPolicy.from_env(os.environ, "MESH_PEER_NETWORKS")
                networks = networks or NetworkPolicy.parse("any")
                self._http = create_http_client(
                    networks, timeout=httpx.Timeout(self.deadline_s + 5.0, connect=2.0)
                )
                self._owned.append(self._http)
                if self._trust.networks is None:
                    self._trust = PeerTrust(networks=networks)
                    self._peers.clear()
            if self._discovery is None and self.url is None:
                from mesh.discovery import create_backend
                from mesh.discovery.client import DiscoveryClient

                # Outside a node (a script, a notebook) nobody bound a discovery client: find
                # peers the way `mesh serve` would, from the same environment variables.
                location = os.environ.get("MESH_DISCOVERY", "registry")
                token = os.environ.get("CONSUL_HTTP_TOKEN")
                if not location.startswith("consul://"):
                    location = os.environ.get("MESH_REGISTRY", "http://127.0.0.1:8400")
                    token = os.environ.get("MESH_REGISTRY_TOKEN")
                backend = create_backend(location, token=token)
                self._discovery = DiscoveryClient(backend)
                self._owned.append(self._discovery)
        return self._http, self._discovery

    def _peer(self, http: httpx.AsyncClient, url: str) -> A2APeer:
        from mesh.a2a.client import CARD_TIMEOUT_S, MAX_ANSWER_BYTES, A2APeer

        peer = self._peers.get(url)
        if peer is None or peer.http is not http:
            # A card read outside any call (declaring tools) is bounded by the call's deadline.
            limit = min(CARD_TIMEOUT_S, self.deadline_s)
            peer = self._peers[url] = A2APeer(
                http,
                url,
                card_timeout_s=limit,
                max_answer_bytes=self._max_answer_bytes or MAX_ANSWER_BYTES,
            )
        return peer

    async def _admit(
        self, http: httpx.AsyncClient, url: str, skill: str
    ) -> tuple[A2APeer, Admitted]:
        """The peer at ``url`` once ``mesh.trust`` verified it (its calls then carry the
        token); a refused URL is ``unavailable`` (the retry tries the next instance)."""
        peer = self._peer(http, url)
        agent = self.peer if self._named else None
        try:
            admitted = await self._trust.admit(url, agent, peer.fetch_card_dict)
        except PeerRefused as exc:
            peer.headers = {}
            raise self._unavailable(skill, str(exc)) from exc
        peer.headers = dict(admitted.headers)
        return peer, admitted

    # -- discovery and card ---------------------------------------------------------------
    async def _targets(self, skill: str) -> list[str]:
        _, discovery = await self._ready()
        if self.url is not None:
            return [self.url]
        assert discovery is not None
        try:
            found = await discovery.require(agent=self.peer)
        except AgentNotFound as exc:
            raise self._unavailable(skill, str(exc)) from exc
        except DiscoveryError as exc:
            raise self._unavailable(skill, f"cannot reach discovery ({exc})") from exc
        instances = [i.url.rstrip("/") for i in found]
        if instances != self.instances:
            self.instances = instances
            # Breakers (and their series) of targets discovery no longer names go: whoever
            # registers chooses the URLs, and junk registrations must not pile up.
            self.breakers.retain(instances)
            self._exported = False
        if not self._exported:
            self._export_breakers()
        return list(self.instances)

    async def _load_card(self, skill: str) -> dict[str, Any]:
        if self._card is not None and time.monotonic() - self._card_at < self.card_ttl_s:
            return self._card
        http, _ = await self._ready()
        last: Exception | None = None
        try:
            targets = await self._targets(skill)
        except RemoteError as exc:
            targets, last = [], exc
        for target in targets:
            try:
                _, admitted = await self._admit(http, target, skill)
            except RemoteError as exc:
                last = exc
                continue
            card = dict(admitted.card)
            self._card, self._card_at = card, time.monotonic()
            if not self._named:
                self.peer = str(card.get("name") or self.peer)
            return card
        if self._card is not None:
            return self._card  # the last known card: the peer may come back before the call
        raise RemoteError(
            f"{self.peer} is unavailable: cannot read its agent card ({last})",
            peer=self.peer,
            skill=skill,
            reason="unavailable",
        )

    async def tools(self, ctx: ToolContext) -> list[RemoteSkillTool]:
        """One tool per skill (or the one ``skill``) of the peer, from its card."""
        try:
            card = await self._load_card(self.skill or "")
        except RemoteError as exc:
            if self.skill is None:
                log.warning("no tools from %s this turn: %s", self.peer, exc)
                return []
            # Declared anyway: calling it retries resolution and reports why it fails.
            log.warning("%s: card unavailable, declaring %s without schema", self.peer, self.skill)
            return [self._placeholder(self.skill)]
        from mesh.a2a.card import skill_schemas

        schemas = skill_schemas(card)
        skills = [s for s in card.get("skills", []) if isinstance(s, Mapping) and s.get("id")]
        if self.skill is not None:
            skills = [s for s in skills if s["id"] == self.skill]
            if not skills:
                offered = sorted(str(s.get("id")) for s in card.get("skills", []))
                raise ConfigError(
                    f"agent {self.peer!r} has no skill {self.skill!r}; it offers {offered}"
                )
        return [self._tool(str(s["id"]), str(s.get("description", "")), schemas) for s in skills]

    def _tool(
        self, skill_id: str, description: str, schemas: Mapping[str, Mapping[str, Any]]
    ) -> RemoteSkillTool:
        schema = schemas.get(skill_id)
        return RemoteSkillTool(
            self,
            skill_id,
            description=description,
            input_schema=dict(schema["input"]) if schema and schema.get("input") else None,
            output_schema=dict(schema["output"]) if schema and schema.get("output") else None,
            typed=schema is not None,
        )

    def _placeholder(self, skill_id: str) -> RemoteSkillTool:
        return RemoteSkillTool(
            self,
            skill_id,
            description=f"Skill {skill_id!r} of agent {self.peer!r} (currently unreachable).",
            input_schema=None,
            output_schema=None,
            typed=True,
        )

    # -- the call -------------------------------------------------------------------------
    async def invoke(self, tool: RemoteSkillTool, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Run one delegation; returns the peer's answer or raises ``ToolError``/``RemoteError``."""
        skill = tool.skill_id
        started, clock0 = time.time(), time.perf_counter()
        trace = _trace_for(ctx)
        record = CallRecord(skill, "", "", trace.trace_id, started, started, "failed", 0)
        try:
            payload = self._payload(tool, args)
            result = await self._deliver(tool, payload, ctx, trace, record)
            answer = self._answer(tool, result)
            record.outcome = "ok"
            return answer
        except RemoteError as exc:
            record.outcome = exc.reason if exc.reason != "invalid_output" else "failed"
            raise
        except ToolError:
            record.outcome = "rejected"
            raise
        except asyncio.CancelledError:
            record.outcome = "canceled"
            raise
        finally:
            record.ended_at = time.time()
            self.recent.append(record)
            if self._metrics is not None:
                self._metrics.delegation(
                    self.peer, skill, record.outcome, time.perf_counter() - clock0
                )
            log.info(
                "delegation caller=%s peer=%s skill=%s outcome=%s attempts=%d target=%s "
                "task=%s duration_ms=%.1f trace_id=%s",
                ctx.agent_name or self.caller or "-",
                self.peer,
                skill,
                record.outcome,
                record.attempts,
                record.target or "-",
                record.task_id or "-",
                (record.ended_at - started) * 1000,
                trace.trace_id,
            )

    def _payload(self, tool: RemoteSkillTool, args: Mapping[str, Any]) -> dict[str, Any] | str:
        if not tool.typed:
            text = args.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ToolError(
                    f"invalid arguments for {tool.name}: text: a non-empty string is required",
                    kind="invalid_arguments",
                    details=[{"field": "text", "message": "a non-empty string is required"}],
                )
            return text
        if tool.input_schema is None:
            return dict(args)
        try:
            value = check(dict(args), tool.input_schema)
        except SchemaViolation as exc:
            raise ToolError(
                f"invalid arguments for {tool.name}: {exc}",
                kind="invalid_arguments",
                details=exc.errors,
            ) from exc
        return dict(value)

    async def _deliver(
        self,
        tool: RemoteSkillTool,
        payload: dict[str, Any] | str,
        ctx: ToolContext,
        trace: TraceParent,
        record: CallRecord,
    ) -> TaskResult:
        skill = tool.skill_id
        if tool.input_schema is None and tool.typed:
            # Declared while the peer was unreachable: the schema is needed to call it safely.
            card = await self._load_card(skill)
            from mesh.a2a.card import skill_schemas

            fresh = self._tool(skill, tool.description, skill_schemas(card))
            payload = self._payload(fresh, payload if isinstance(payload, dict) else {})
            tool = fresh
        http, _ = await self._ready()
        deadline = time.time() + self.deadline_s
        parent_deadline = ctx.metadata.get("deadline")
        if isinstance(parent_deadline, int | float):
            deadline = min(deadline, float(parent_deadline))
        targets = await self._targets(skill)
        message_id = uuid.uuid4().hex  # the same for every attempt: the peer deduplicates
        context_id = ctx.state.get(context_key(self.peer))
        metadata = {
            "traceparent": str(trace.child()),
            "deadline": deadline,
            "caller": ctx.agent_name or self.caller,
        }
        inflight: dict[str, Any] = {}

        send: dict[str, Any] = {
            "payload": payload,
            "skill": skill if tool.typed or skill != "chat" else None,
            "message_id": message_id,
            "context_id": context_id if isinstance(context_id, str) else None,
            "metadata": metadata,
        }

        async def attempt(url: str) -> TaskResult:
            record.attempts += 1
            record.target = url
            peer, _ = await self._admit(http, url, skill)
            inflight.clear()
            inflight["peer"] = peer
            inflight["send"] = send
            # One blocking SendMessage: one JSON body each way, the finished task in the answer.
            result = await peer.call(**send, timeout=max(0.1, deadline - time.time()))
            task_id = inflight["task_id"] = record.task_id = result.task_id
            if not task_id:
                raise RemoteError(
                    f"{self.peer} at {url} answered without a task",
                    peer=self.peer,
                    skill=skill,
                    reason="unavailable",
                )
            if not result.done:
                # An interrupted task (input-required, auth-required): a delegation cannot
                # answer it; a re-send (same message id) reports its state again.
                raise RemoteError(
                    f"{self.peer} at {url} left task {task_id} unfinished ({result.state})",
                    peer=self.peer,
                    skill=skill,
                    reason="unavailable",
                )
            inflight.clear()
            if not result.ok and (failure := self._failure(skill, result)).reason == "unavailable":
                raise failure  # the instance stopped under the task: retried elsewhere
            return result

        def retried(target: str, exc: BaseException) -> None:
            log.warning(
                "delegation retry peer=%s skill=%s target=%s: %s", self.peer, skill, target, exc
            )
            if self._metrics is not None:
                self._metrics.delegation_retry(self.peer, skill)

        try:
            result = await call_with_failover(
                targets,
                attempt,
                policy=self.policy,
                breakers=self.breakers,
                deadline=deadline,
                on_retry=retried,
            )
        except asyncio.CancelledError:
            await self._cancel_child(inflight, record)
            raise
        except DeadlineExceeded as exc:
            await self._cancel_child(inflight, record)
            raise RemoteError(
                f"{self.peer} did not answer {skill!r} within the deadline "
                f"({self.deadline_s:.0f}s or the caller's)",
                peer=self.peer,
                skill=skill,
                reason="deadline",
            ) from exc
        except CircuitOpen as exc:
            raise self._unavailable(skill, "every instance is failing (circuit open)") from exc
        except RemoteError as exc:
            if exc.reason == "unavailable" and self._discovery is not None:
                self._discovery.invalidate(agent=self.peer)
            if exc.reason == "unavailable" and not str(exc).startswith(
                f"{self.peer} is unavailable"
            ):
                raise self._unavailable(skill, str(exc)) from exc
            raise
        if (
            isinstance(result.context_id, str)
            and result.context_id
            and result.context_id != context_id
        ):
            ctx.state_delta[context_key(self.peer)] = result.context_id
        _report_usage(ctx, result.metadata)
        return result

    def _unavailable(self, skill: str, detail: str) -> RemoteError:
        return RemoteError(
            f"{self.peer} is unavailable: {detail}",
            peer=self.peer,
            skill=skill,
            reason="unavailable",
        )

    async def _cancel_child(self, inflight: Mapping[str, Any], record: CallRecord) -> None:
        peer, task_id, send = inflight.get("peer"), inflight.get("task_id"), inflight.get("send")
        if peer is None or (not task_id and send is None):
            return

        async def cancel() -> None:
            child = task_id
            if not child and send is not None:
                # A blocking send learns its task id at the end: the same message again, not
                # waiting, answers with the task it started (the peer deduplicates).
                child = record.task_id = (await peer.call(**send, timeout=2.0, wait=False)).task_id
            if child:
                await peer.cancel(child)
                log.info("canceled child task %s at %s", child, self.peer)

        # Shielded and bounded: we are being cancelled ourselves, the CancelTask must still go.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(cancel()), 3.0)

    def _failure(self, skill: str, result: TaskResult) -> RemoteError:
        """The error of a child task that finished without completing."""
        error = result.error or {}
        reason = _REASONS.get(str(error.get("reason")), _REASONS.get(result.state, "failed"))
        message = str(error.get("message") or result.text or result.state)
        return RemoteError(
            f"{self.peer} {result.state} the {skill!r} request: {message}",
            peer=self.peer,
            skill=skill,
            reason=reason,  # type: ignore[arg-type]
        )

    def _answer(self, tool: RemoteSkillTool, result: TaskResult) -> Any:
        skill = tool.skill_id
        if result.state != "completed":
            raise self._failure(skill, result)
        if not tool.typed:
            return result.text
        if result.data is None:
            raise RemoteError(
                f"{self.peer} answered {skill!r} without a JSON result",
                peer=self.peer,
                skill=skill,
                reason="invalid_output",
            )
        if tool.output_schema is None:
            return result.data
        try:
            return check(result.data, tool.output_schema)
        except SchemaViolation as exc:
            raise RemoteError(
                f"{self.peer} answered {skill!r} with data that does not match its output "
                f"schema: {exc}",
                peer=self.peer,
                skill=skill,
                reason="invalid_output",
            ) from exc

    # -- visibility -----------------------------------------------------------------------
    def _breaker_changed(self, target: str, state: BreakerState) -> None:
        log.warning(
            "circuit breaker peer=%s target=%s state=%s", self.peer, target, state.name.lower()
        )
        self._export_breakers()

    def _export_breakers(self) -> None:
        """One breaker series per resolved target, from the first resolution on (closed until
        it changes: a healthy mesh shows its breakers instead of no series), and none for
        targets no longer resolved (``NodeMetrics.breaker_states`` bounds the count)."""
        if self._metrics is None:
            return
        targets = self.instances or ([self.url] if self.url else [])
        states = {t: _BREAKER_NAMES[self.breakers.state(t)] for t in targets}
        self._metrics.breaker_states(self.peer, states)
        self._exported = True

    def describe(self) -> dict[str, Any]:
        """For /introspect: the peer as a node of this agent's tree."""
        return {
            "kind": "remote",
            "name": self.peer,
            "url": self.url,
            "skills": [self.skill] if self.skill else None,
            "tools": sorted(
                _tool_name(self.peer, str(s.get("id")), True)
                for s in (self._card or {}).get("skills", [])
            )
            if self._card and not self.skill
            else None,
            "instances": list(self.instances),
            "breakers": self.breakers.states(),
            "deadline_s": self.deadline_s,
            "recent": [asdict(r) for r in self.recent],
        }

    def __repr__(self) -> str:
        return f"remote({self.peer!r}, skill={self.skill!r})"


def remote(
    agent_or_url: str,
    skill: str | None = None,
    *,
    deadline_s: float = 30.0,
    url: str | None = None,
    policy: RetryPolicy | None = None,
    breakers: BreakerBoard | None = None,
) -> RemoteAgent:
    """A peer agent's skills as tools: by name through discovery, or at a fixed URL.

    ``remote("credit-bureau", skill="score")`` declares one tool (``credit_bureau_score``);
    ``remote("income-verifier")`` one per skill. ``remote("http://127.0.0.1:8411")`` or
    ``remote("credit-bureau", url=...)`` skip discovery. ``deadline_s`` bounds each call,
    retries included (the caller's own deadline, when sooner, wins).
    """
    if _is_url(agent_or_url):
        if url is not None:
            raise ConfigError("remote(): give the URL once (positionally or url=)")
        return RemoteAgent(
            None, skill, url=agent_or_url, deadline_s=deadline_s, policy=policy, breakers=breakers
        )
    return RemoteAgent(
        agent_or_url, skill, url=url, deadline_s=deadline_s, policy=policy, breakers=breakers
    )


def _trace_for(ctx: ToolContext) -> TraceParent:
    """The turn's trace: the caller's traceparent, else one new trace per turn (invocation)."""
    parsed = TraceParent.parse(ctx.metadata.get("traceparent"))
    if parsed is not None:
        return parsed
    key = ctx.invocation_id or uuid.uuid4().hex
    trace = _TURN_TRACES.get(key)
    if trace is None:
        trace = _TURN_TRACES[key] = TraceParent.new()
        while len(_TURN_TRACES) > _TURN_TRACES_MAX:
            _TURN_TRACES.popitem(last=False)
    return trace


def _report_usage(ctx: ToolContext, task_metadata: Mapping[str, Any]) -> None:
    """Pass the child's usage (its own plus its children's) to the caller's usage sink."""
    sink = ctx.metadata.get("usage_sink")
    if sink is None:
        return
    total: dict[str, int] = {}
    for key in ("usage", "children_usage"):
        usage = task_metadata.get(key)
        if isinstance(usage, Mapping):
            for name, value in usage.items():
                if isinstance(value, int | float):
                    total[name] = total.get(name, 0) + int(value)
    if not total:
        return
    if callable(sink):
        sink(total)
    elif isinstance(sink, list):
        sink.append(total)

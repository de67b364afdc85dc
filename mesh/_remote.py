"""Remote agents as tools: ``remote("credit-bureau", skill="score")``.

    loan_officer = Agent(
        name="loan-officer",
        tools=[lookup_applicant,
               remote("credit-bureau", skill="score"),     # found through the registry
               remote("income-verifier")],                 # every skill of that agent
    )

``remote(...)`` is a ``Toolset``: configuration (which peer, which skill, the deadline, the retry
policy and the breakers). At the start of each turn it resolves the agent's instances and reads
the agent card (``mesh._card_cache``, through ``mesh._peer_link``), and declares one tool per skill:
a typed skill's tool takes the skill's input JSON Schema (card extension
``urn:mesh:skill-schemas:v1``) as parameters; a text skill's tool takes ``{"text": ...}``. Calling
a tool runs a ``mesh._delegation.Delegation`` (retries with the same message id, failover,
breakers, deadline, cancelling the child task); every failure reaches the model as a
``RemoteError``. The last calls are kept for ``/introspect`` (``describe``), counted on the bound
``NodeMetrics`` and logged (one ``delegation ...`` line each).

Inside a node, the node binds its own copy of each toolset (``copy``, then ``bind(...)`` with its
shared clients, metrics and peer checks) and closes it (``aclose``): the ``Agent`` the user built
stays configuration. Used on its own (a script with a ``Runner``), the toolset opens its own HTTP
client, which connects only inside ``$MESH_PEER_NETWORKS`` (default: any network but
link-local), and finds the registry at ``$MESH_REGISTRY`` (default http://127.0.0.1:8400); call
``aclose()`` when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from mesh._asks import ChildRef, ChildWaiting
from mesh._card_cache import CardCache
from mesh._delegation import (
    CallRecord,
    Delegation,
    check_answer,
    check_arguments,
    context_key,
    turn_trace,
)
from mesh._errors import ConfigError, RemoteError, ToolError
from mesh._peer_link import PeerLink
from mesh._resilience import BreakerBoard, RetryPolicy
from mesh._tools import ToolContext

if TYPE_CHECKING:
    import httpx

    from mesh._discovery.client import DiscoveryClient
    from mesh._metrics import DelegationSeries, NodeMetrics
    from mesh._tracing import TraceParent
    from mesh._trust import PeerTrust

__all__ = ["CallRecord", "RemoteAgent", "RemoteSkillTool", "context_key", "remote"]

log = logging.getLogger("mesh._remote")

#: How long a call of a skill that may ask a person may take by default (``wait_deadline_s``).
WAIT_DEADLINE_S = 7 * 24 * 3600.0
#: How long a blocking call in a node's LLM turn may stay open before it goes long (followed
#: from the turn's resume point: a request held for minutes is cut by proxies and restarts).
LONG_AFTER_S = 5.0
#: How long a CancelTask for a waiting child may take.
CANCEL_S = 3.0

TEXT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "What to ask, in plain language."}},
    "required": ["text"],
}
_OPEN_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


#: The one line per delegation (docs/delegation.md).
_DELEGATION_LINE = (
    "delegation caller=%s peer=%s skill=%s outcome=%s attempts=%d target=%s "
    "task=%s duration_ms=%.1f trace_id=%s"
)


class _Line:
    """The delegation's line, its record made while the peer works (``prepare``, a blocking
    attempt's ``on_sent``) and given its values when the call ends (``_log_delegation``):
    ``makeRecord`` is a third of the line's cost (~17 k of ~57 k instructions), off the hop's
    path there. Made only when it is the record ``log.info`` would make (no caller lookup:
    ``mesh serve``'s ``logging._srcfile = None``, the stock record factory and
    ``makeRecord``), so its content is the same; its time is set when it is logged.

    ``prepare`` also looks up the metric series an ``ok`` call of ``skill`` counts in, those
    made already (``NodeMetrics.delegation_series``: ~6 k at the call's end otherwise), kept
    with the peer's name and the metrics they were found for (``series_for``)."""

    __slots__ = ("_owner", "_series", "_skill", "record")

    def __init__(self, owner: RemoteAgent | None = None, skill: str = "") -> None:
        self.record: logging.LogRecord | None = None
        self._owner = owner
        self._skill = skill
        self._series: tuple[str, NodeMetrics, DelegationSeries] | None = None

    def series_for(self, peer: str, metrics: NodeMetrics) -> DelegationSeries | None:
        """The series ``prepare`` found, if for ``peer`` and ``metrics``."""
        found = self._series
        if found is None or found[0] != peer or found[1] is not metrics:
            return None
        return found[2]

    def prepare(self) -> None:
        owner = self._owner
        if owner is not None and self._series is None:
            metrics = owner._link.metrics
            if metrics is not None:
                peer = owner.peer
                self._series = (peer, metrics, metrics.delegation_series(peer, self._skill))
        if self.record is None and _stock_records() and log.isEnabledFor(logging.INFO):
            # As Logger._log makes it without a caller lookup; the values come at the end.
            self.record = log.makeRecord(
                log.name,
                logging.INFO,
                "(unknown file)",
                0,
                _DELEGATION_LINE,
                (),
                None,
                "(unknown function)",
            )


def _stock_records() -> bool:
    """Whether ``log.info`` makes its record as ``LogRecord(...)`` without a caller lookup and
    without the thread's and process's fields, as under ``mesh serve`` (asked when the line is
    prepared and again when it is logged: a record factory, say OpenTelemetry's, may be
    installed while the peer works, or those fields turned on)."""
    return (
        logging._srcfile is None
        and not (logging.logThreads or logging.logProcesses or logging.logMultiprocessing)
        and logging.getLogRecordFactory() is logging.LogRecord
        and type(log).makeRecord is logging.Logger.makeRecord
        and "makeRecord" not in log.__dict__
    )


def _log_delegation(
    caller: str, peer: str, record: CallRecord, started: float, line: _Line | None = None
) -> None:
    """Log the delegation's line (``line``'s prepared record when there is one). Called, not
    inlined in ``RemoteAgent.invoke``'s ``finally``: a record's line number is found by
    scanning its function's line table up to the call (there: past the whole call and its
    handlers)."""
    values = (
        caller,
        peer,
        record.skill,
        record.outcome,
        record.attempts,
        record.target or "-",
        record.task_id or "-",
        (record.ended_at - started) * 1000,
        record.trace_id,
    )
    if (
        line is None
        or (prepared := line.record) is None
        # What may change while the peer works (``_stock_records``, in line): a record
        # factory installed, the caller lookup turned on, the level, and the thread and
        # process fields a record takes as it is made (``mesh serve`` turns them off).
        or logging._srcfile is not None
        or logging.getLogRecordFactory() is not logging.LogRecord
        or not log.isEnabledFor(logging.INFO)
        or logging.logThreads
        or logging.logProcesses
        or logging.logMultiprocessing
    ):
        log.info(_DELEGATION_LINE, *values)
        return
    line.record = None
    # LogRecord.__init__'s time fields, for now; then what Logger._log does with a record.
    now = time.time()
    prepared.args = values
    prepared.created = now
    prepared.msecs = int((now - int(now)) * 1000) + 0.0
    prepared.relativeCreated = (now - logging._startTime) * 1000  # type: ignore[attr-defined]
    log.handle(prepared)


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _skill_schemas(card: dict[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    from mesh._a2a.card import skill_schemas

    return skill_schemas(card)


def _tool_name(peer: str, skill_id: str, typed: bool) -> str:
    raw = f"{peer}_{skill_id}" if typed or skill_id != "chat" else f"ask_{peer}"
    return re.sub(r"[^A-Za-z0-9_]", "_", raw)[:64]


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
        asks: bool = False,
        long_running: bool = False,
    ) -> None:
        self.owner = owner
        #: The card says a call takes long: it is followed by subscription, not waited on.
        self.long_running = long_running
        self.skill_id = skill_id
        self.typed = typed
        #: The card says the skill may wait for input: its calls get ``wait_deadline_s``.
        self.asks = asks
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

    async def forward(
        self, child: ChildRef, question_id: str, answer: Any, ctx: ToolContext, attempt: int = 0
    ) -> Any:
        """Answer the question ``question_id`` of this skill's waiting ``child`` task (the
        runner's resume of a call that relays it; ``attempt``: how many earlier forwards of
        the call did not settle it); what ``call`` would have returned."""
        return await self.owner.invoke(self, {}, ctx, forward=(child, question_id, answer, attempt))

    async def follow(self, child: ChildRef, ctx: ToolContext) -> Any:
        """Follow this skill's long-running ``child`` task until it ends (the runner's resume
        of a call pending on it, also after this node restarted); what ``call`` would have
        returned."""
        return await self.owner.invoke(self, {}, ctx, follow=child)

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
        wait_deadline_s: float = WAIT_DEADLINE_S,
        policy: RetryPolicy | None = None,
        breakers: BreakerBoard | None = None,
        card_ttl_s: float = 30.0,
        long_running: bool = False,
        long_after_s: float | None = LONG_AFTER_S,
    ) -> None:
        if agent is None and url is None:
            raise ConfigError("remote(): give an agent name or url=")
        # "not > 0": NaN is refused too (it compares false with everything, so "<= 0" let it in).
        if not deadline_s > 0:
            raise ConfigError(f"remote({agent or url!r}): deadline_s must be > 0")
        if not wait_deadline_s > 0:
            raise ConfigError(f"remote({agent or url!r}): wait_deadline_s must be > 0")
        self.agent = agent
        self.url = url.rstrip("/") if url else None
        self.skill = skill
        self.deadline_s = deadline_s
        self.wait_deadline_s = wait_deadline_s
        if long_after_s is not None and not long_after_s > 0:
            raise ConfigError(f"remote({agent or url!r}): long_after_s must be > 0")
        self.long_running = long_running
        self.long_after_s = long_after_s
        self.policy = policy or RetryPolicy(attempts=4, initial_delay=0.1, max_delay=1.0)
        # A board the caller passed is shared by every copy (and keeps its on_change).
        self._given_breakers = breakers
        self.breakers = breakers or BreakerBoard(failure_threshold=3, cool_down=10.0)
        self.card_ttl_s = card_ttl_s
        self.caller = ""
        self.recent: deque[CallRecord] = deque(maxlen=20)
        self._link = PeerLink(
            agent or self.url or "",
            url=self.url,
            named=agent is not None,
            deadline_s=deadline_s,
            breakers=self.breakers,
        )
        self._cards = CardCache(card_ttl_s)
        # The tools declared from the card ``_cards`` holds now, and that card: the same
        # while it is (it keeps one dict until it reads the card again), so a turn neither
        # restores the skills' schemas from the card again nor makes new tools (the runner's
        # declaration of a tool holds while it is the same object).
        self._declared: tuple[dict[str, Any], tuple[RemoteSkillTool, ...]] | None = None

    @property
    def peer(self) -> str:
        """The peer's name: the agent's, or for ``remote(url)`` the one its card gives."""
        return self._link.peer

    @property
    def instances(self) -> list[str]:
        """The instance URLs of the latest resolution."""
        return list(self._link.instances)

    # -- lifecycle --------------------------------------------------------------------------
    def copy(self) -> RemoteAgent:
        """The same configuration, none of the state: what a node binds and runs, so the
        ``Agent`` it was given stays configuration (and two nodes of one ``Agent`` share
        nothing but a breaker board passed to ``remote()``)."""
        return RemoteAgent(
            self.agent,
            self.skill,
            url=self.url,
            deadline_s=self.deadline_s,
            wait_deadline_s=self.wait_deadline_s,
            policy=self.policy,
            breakers=self._given_breakers,
            card_ttl_s=self.card_ttl_s,
            long_running=self.long_running,
            long_after_s=self.long_after_s,
        )

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
        """Use the node's shared clients, metrics and peer checks (the node's lifespan calls it
        on its copy): ``trust`` decides which instance URLs get calls and the mesh token;
        ``max_answer_bytes`` bounds each answer read from a peer (``MESH_MAX_ANSWER_BYTES``)."""
        self._link.bind(
            discovery=discovery,
            http=http,
            metrics=metrics,
            trust=trust,
            max_answer_bytes=max_answer_bytes,
        )
        if caller:
            self.caller = caller

    async def aclose(self) -> None:
        """Close what this toolset opened itself (never what ``bind`` gave it)."""
        await self._link.aclose()

    # -- declaring the tools ----------------------------------------------------------------
    async def tools(self, ctx: ToolContext) -> list[RemoteSkillTool]:
        """One tool per skill (or the one ``skill``) of the peer, from its card."""
        try:
            card = await self._cards.get(self._link, self.skill or "")
        except RemoteError as exc:
            if self.skill is None:
                log.warning("no tools from %s this turn: %s", self.peer, exc)
                return []
            # Declared anyway: calling it retries resolution and reports why it fails.
            log.warning("%s: card unavailable, declaring %s without schema", self.peer, self.skill)
            return [self._placeholder(self.skill)]
        declared = self._declared
        if declared is not None and declared[0] is card:
            return list(declared[1])
        skills = [s for s in card.get("skills", []) if isinstance(s, Mapping) and s.get("id")]
        if self.skill is not None:
            skills = [s for s in skills if s["id"] == self.skill]
            if not skills:
                offered = sorted(str(s.get("id")) for s in card.get("skills", []))
                raise ConfigError(
                    f"agent {self.peer!r} has no skill {self.skill!r}; it offers {offered}"
                )
        schemas = _skill_schemas(card)
        tools = tuple(
            self._tool(schemas, str(s["id"]), str(s.get("description", ""))) for s in skills
        )
        self._declared = (card, tools)
        return list(tools)

    def _tool(
        self, schemas: Mapping[str, Mapping[str, Any]], skill_id: str, description: str
    ) -> RemoteSkillTool:
        schema = schemas.get(skill_id)
        return RemoteSkillTool(
            self,
            skill_id,
            description=description,
            input_schema=dict(schema["input"]) if schema and schema.get("input") else None,
            output_schema=dict(schema["output"]) if schema and schema.get("output") else None,
            typed=schema is not None,
            asks=bool(schema and schema.get("asks")),
            long_running=bool(schema and schema.get("long_running")),
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

    # -- the call ---------------------------------------------------------------------------
    async def invoke(
        self,
        tool: RemoteSkillTool,
        args: Mapping[str, Any],
        ctx: ToolContext,
        *,
        forward: tuple[ChildRef, str, Any, int] | None = None,
        follow: ChildRef | None = None,
    ) -> Any:
        """Run one delegation (or, with ``forward``, send an answer to its waiting child
        task); returns the peer's answer or raises ``ToolError``/``RemoteError``, or
        ``ChildWaiting`` when the child task waits for input (or, for a long-running call in a
        node's turn, once it started). With ``follow``, it follows that long-running child."""
        skill = tool.skill_id
        started, clock0 = time.time(), time.perf_counter()
        trace = turn_trace(ctx)
        record = CallRecord(skill, "", "", trace.trace_id, started, started, "failed", 0)
        line = _Line(self, skill)
        try:
            if forward is not None:
                delegation = self._delegation(tool, ctx, trace, record)
                answer = check_answer(self.peer, tool, await delegation.forward(*forward))
                record.outcome = "ok"
                return answer
            if follow is not None:
                delegation = self._delegation(tool, ctx, trace, record)
                answer = check_answer(self.peer, tool, await delegation.follow(follow))
                record.outcome = "ok"
                return answer
            payload = check_arguments(tool, args)
            if tool.typed and tool.input_schema is None:
                # Declared while the peer was unreachable: the schema is needed to call it safely.
                card = await self._cards.get(self._link, skill)
                tool = self._tool(_skill_schemas(card), skill, tool.description)
                payload = check_arguments(tool, payload if isinstance(payload, dict) else {})
            delegation = self._delegation(tool, ctx, trace, record, line)
            answer = check_answer(self.peer, tool, await delegation.run(payload))
            record.outcome = "ok"
            return answer
        except ChildWaiting as waiting:
            record.outcome = "waiting"
            waiting.cancel = functools.partial(self.cancel_child, waiting.child)
            raise
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
            metrics = self._link.metrics
            if metrics is not None:
                peer = self.peer
                metrics.delegation(
                    peer,
                    skill,
                    record.outcome,
                    time.perf_counter() - clock0,
                    line.series_for(peer, metrics),
                )
            _log_delegation(ctx.agent_name or self.caller or "-", self.peer, record, started, line)

    def _delegation(
        self,
        tool: RemoteSkillTool,
        ctx: ToolContext,
        trace: TraceParent,
        record: CallRecord,
        line: _Line | None = None,
    ) -> Delegation:
        return Delegation(
            self._link,
            tool,
            ctx,
            trace=trace,
            record=record,
            policy=self.policy,
            breakers=self.breakers,
            # A skill that may ask a person gets the waiting deadline (the caller's own,
            # when sooner, still wins).
            deadline_s=self.wait_deadline_s if tool.asks else self.deadline_s,
            caller=self.caller,
            long_running=self.long_running or tool.long_running,
            long_after_s=self.long_after_s,
            # The request on the wire: the line's record is made while the peer works.
            on_sent=line.prepare if line is not None else None,
        )

    def owns(self, child: ChildRef) -> bool:
        """Whether ``child`` is a task of this toolset's peer (by name, or at its fixed URL:
        before its card is read, ``remote(url)``'s peer is known by the URL only)."""
        return child.peer in (self.peer, self.agent) or (
            self.url is not None and child.url.rstrip("/") == self.url
        )

    async def cancel_child(self, child: ChildRef) -> None:
        """CancelTask for a waiting child (its caller was canceled, or its deadline passed):
        at the instance that holds it; bounded, never raises."""
        with contextlib.suppress(Exception):
            await self._link.ready()
            peer, _ = await self._link.admit(child.url, child.skill)
            async with asyncio.timeout(CANCEL_S):
                await peer.cancel(child.task)
            log.info("canceled waiting child task %s at %s", child.task, self.peer)

    # -- visibility -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """For /introspect: the peer as a node of this agent's tree."""
        card = self._cards.card
        return {
            "kind": "remote",
            "name": self.peer,
            "url": self.url,
            "skills": [self.skill] if self.skill else None,
            "tools": sorted(
                _tool_name(self.peer, str(s.get("id")), True) for s in card.get("skills", [])
            )
            if card and not self.skill
            else None,
            "instances": self.instances,
            "breakers": self.breakers.states(),
            "deadline_s": self.deadline_s,
            "wait_deadline_s": self.wait_deadline_s,
            "long_running": self.long_running,
            "long_after_s": self.long_after_s,
            "recent": [asdict(r) for r in self.recent],
        }

    def __repr__(self) -> str:
        return f"remote({self.peer!r}, skill={self.skill!r})"


def remote(
    agent_or_url: str,
    skill: str | None = None,
    *,
    deadline_s: float = 30.0,
    wait_deadline_s: float = WAIT_DEADLINE_S,
    url: str | None = None,
    policy: RetryPolicy | None = None,
    breakers: BreakerBoard | None = None,
    long_running: bool = False,
    long_after_s: float | None = LONG_AFTER_S,
) -> RemoteAgent:
    """A peer agent's skills as tools: by name through discovery, or at a fixed URL.

    ``remote("credit-bureau", skill="score")`` declares one tool (``credit_bureau_score``);
    ``remote("income-verifier")`` one per skill. ``remote("http://127.0.0.1:8411")`` or
    ``remote("credit-bureau", url=...)`` skip discovery. ``deadline_s`` bounds each call,
    retries included (the caller's own deadline, when sooner, wins). ``breakers``: a board of
    your own (its ``on_change`` stays yours), shared with the node's copy of this toolset.

    ``wait_deadline_s`` (default 7 days) replaces ``deadline_s`` for a skill whose card says
    it ``asks`` (its task may wait for a person's answer, relayed to this agent's caller);
    the caller's own deadline still caps it.

    ``long_running=True`` (or ``"long_running": true`` on the skill's card entry, from
    ``@skill(long_running=True)``): each call sends without waiting and follows the child
    task by subscription, reconnecting when the stream drops, instead of holding one request
    open for its whole length; give it a ``deadline_s`` that long (docs/delegation.md).
    ``long_after_s`` (default 5): in a node's LLM turn, a blocking call still open after that
    many seconds goes long the same way (its child kept in the turn's resume point, followed,
    sent again if its node is lost); None: never.
    """
    if _is_url(agent_or_url):
        if url is not None:
            raise ConfigError("remote(): give the URL once (positionally or url=)")
        agent, url = None, agent_or_url
    else:
        agent = agent_or_url
    return RemoteAgent(
        agent,
        skill,
        url=url,
        deadline_s=deadline_s,
        wait_deadline_s=wait_deadline_s,
        policy=policy,
        breakers=breakers,
        long_running=long_running,
        long_after_s=long_after_s,
    )

"""``Delegation``: one call of a remote skill, what ``remote()``'s tools run.

A call checks the arguments against the skill's input schema (``check_arguments``: a bad argument
goes back to the model as a tool error, nothing is sent), then sends ONE A2A message (data part,
metadata ``skill``, ``traceparent``, ``deadline``, ``caller``) under the retry policy: a failed
attempt is re-sent with the SAME message id to the next healthy instance (the node deduplicates,
so the skill runs once), each instance behind its circuit breaker, all within the call's deadline
(``deadline_s``, or the caller's own when sooner). The answer is checked against the output schema
(``check_answer``). Every failure is a ``RemoteError`` (peer, skill, reason), never a crash or a
hang. When the turn is cancelled, or the deadline passes, the child task gets a CancelTask.

When someone follows the caller's task live (it was sent with ``SendStreamingMessage``, or is
subscribed to: ``ctx.metadata["relay"]``, see ``mesh._a2a.relay``), each attempt streams the same
message instead and relays the child's progress as it comes; its result is the child task as
``GetTask`` gives it, the same as the blocking answer, so nothing after the send changes.

A long-running call (the card says the skill is ``long_running``, or ``remote(long_running=True)``)
holds no request open while the child works: the message goes without waiting
(``returnImmediately``: the child's task id comes at once) and the child is followed by
``SubscribeToTask``; a dropped or stalled stream is read again with backoff (0.2 s doubling to
5 s, within the deadline), ``GetTask`` deciding each time whether the child ended meanwhile (and
polling when the peer cannot stream); a subscription is also renewed every 5 s after a
``GetTask``, since a peer may run a task outside its SDK handler (its fast path) where
subscribers never see its end. Its result is the same finished task, so the deadline,
cancel and retry rules above stay as they are.

In a node's LLM turn (``ctx.metadata["durable_children"]``), a long call does not follow the
child in line: once the child's task id is known it raises ``ChildWaiting`` with no questions,
so the runner makes the call pending and the node writes it to the task's resume point (state
``children``) BEFORE anyone waits on it; the node then goes on at once (``follow``, through the
runner's resume). A coordinator that stopped meanwhile runs the turn again by recovery rule 4 and
``follow`` re-attaches to the child by its task id: nothing is sent twice, unless the child
was lost with its node (its instance no longer answers, or its restarted node ended it
``interrupted``): then ``follow`` sends the same message again, as a blocking call's retry does
(the child's ``ChildRef.payload`` keeps its data).

The caller's session keeps one A2A context per peer (session state ``_mesh.contexts.<peer>``),
so a specialist sees the conversation continue. The child's token usage (its ``usage`` plus its
own ``childrenUsage``) goes to ``ctx.metadata["usage_sink"]`` when the caller provides one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from mesh._a2a.metadata_keys import CALLER_TASK, CHILDREN_USAGE, USAGE, read, usage_counts
from mesh._asks import TASKS_EXTENSION, ChildRef, ChildWaiting
from mesh._errors import (
    CircuitOpen,
    DeadlineExceeded,
    RemoteError,
    RemoteReason,
    SchemaViolation,
    ToolError,
)
from mesh._resilience import BreakerBoard, RetryPolicy, call_with_failover
from mesh._schema_check import check
from mesh._tools import ToolContext
from mesh._tracing import TraceParent

if TYPE_CHECKING:
    from mesh._a2a.client import A2APeer
    from mesh._a2a.relay import ChildRelay, Relay
    from mesh._a2a.results import TaskResult, TaskUpdate
    from mesh._peer_link import PeerLink

__all__ = [
    "CallRecord",
    "Delegation",
    "InFlightChild",
    "Outgoing",
    "SkillTool",
    "check_answer",
    "check_arguments",
    "child_failure",
    "context_key",
    "report_usage",
    "turn_trace",
]

log = logging.getLogger("mesh._remote")

# A finished child task's ``metadata.error.reason`` -> the RemoteError reason. A task its node
# ended because it stopped (shutdown past the drain grace, or a crash found at restart) says
# nothing about the request: the instance was unavailable, and the retry (same message id,
# which that node released) goes to another one.
_REASONS: dict[str, RemoteReason] = {
    "deadline": "deadline",
    "rejected": "rejected",
    "canceled": "canceled",
    "shutdown": "unavailable",
    "interrupted": "unavailable",
}
# How long a CancelTask for the child may take (we are being cancelled ourselves).
_CANCEL_S = 3.0
# A long-running call: the send that starts the child answers at once (the task as it is).
_START_S = 10.0
# Longest silence on a followed child's stream before it is read again (the node's SSE pings
# every 15 s, so a live stream is never this quiet).
_STALL_S = 45.0
# Between two reads of a followed child after its stream dropped: doubling, bounded.
_FOLLOW_FIRST_S, _FOLLOW_MAX_S = 0.2, 5.0
# Reads of a followed child in a row its instance does not answer before it is unavailable
# (about 6 s with the backoff above): a node that is gone is not waited on until the deadline.
_FOLLOW_TRIES = 5
# The longest one subscription to a followed child is read before GetTask checks on it.
_WINDOW_S = 5.0
_ENDED = frozenset({"completed", "failed", "rejected", "canceled"})
# A span id of all zeros: invalid (W3C Trace Context), never sent.
_ZERO_SPAN = "0" * 16


def context_key(peer: str) -> str:
    """The session-state key holding the A2A context id used with ``peer``."""
    return f"_mesh.contexts.{peer}"


def _state_value(ctx: ToolContext, key: str) -> Any:
    """``ctx.state.get(key)`` (``StateView.get``: the turn's pending write, else the session's),
    without making the view for a plain context over a dict (two Python calls and an object
    fewer a delegation)."""
    if type(ctx) is ToolContext and type(ctx.session_state) is dict:
        delta = ctx.state_delta
        return delta[key] if key in delta else ctx.session_state.get(key)
    return ctx.state.get(key)


class SkillTool(Protocol):
    """What a delegation needs of the tool that stands for a remote skill. Its schemas are
    never changed in place (their compiled checks are kept by the object: ``check(fixed=)``)."""

    @property
    def name(self) -> str: ...

    @property
    def skill_id(self) -> str: ...

    @property
    def typed(self) -> bool: ...

    @property
    def input_schema(self) -> dict[str, Any] | None: ...

    @property
    def output_schema(self) -> dict[str, Any] | None: ...


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


@dataclass(slots=True)
class Outgoing:
    """The one message of a delegation: every attempt sends it again, with the same id. Not
    changed once made (not frozen: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, ~1.5 k instructions a field, and every delegation makes one)."""

    payload: dict[str, Any] | str
    skill: str | None
    message_id: str
    context_id: str | None
    metadata: dict[str, Any]

    async def send(
        self,
        peer: A2APeer,
        *,
        timeout: float,  # noqa: ASYNC109 - the HTTP timeout of this send
        wait: bool = True,
        sent: Callable[[], object] | None = None,
    ) -> TaskResult:
        return await peer.send(
            self.payload,
            skill=self.skill,
            message_id=self.message_id,
            context_id=self.context_id,
            metadata=self.metadata,
            timeout=timeout,
            wait=wait,
            sent=sent,
        )

    def stream(self, peer: A2APeer, *, timeout: float) -> AsyncGenerator[TaskUpdate, None]:
        return peer.stream(
            self.payload,
            skill=self.skill,
            message_id=self.message_id,
            context_id=self.context_id,
            metadata=self.metadata,
            timeout=timeout,
        )


@dataclass
class InFlightChild:
    """The child task of the attempt under way: the instance it went to and the message that
    started it. Its id arrives with the answer; until then the same message, re-sent without
    waiting, answers with it (the peer deduplicates)."""

    peer: A2APeer
    message: Outgoing
    task_id: str = ""
    canceled: bool = False

    async def cancel(self) -> None:
        """Send CancelTask for the child (learning its id first if need be)."""
        if not self.task_id:
            self.task_id = (await self.message.send(self.peer, timeout=2.0, wait=False)).task_id
        if self.task_id:
            await self.peer.cancel(self.task_id)
            self.canceled = True


class Delegation:
    """One call of ``tool`` at the peer ``link`` reaches, for the turn ``ctx`` (see the module
    docstring). ``record`` is filled in as it goes (attempts, target, child task id).
    ``on_sent()``: called as soon as a blocking attempt's request is on the wire, while the
    peer works (``A2APeer.send``'s ``sent``): the caller's bookkeeping that does not need the
    answer goes there, off the hop's path."""

    def __init__(
        self,
        link: PeerLink,
        tool: SkillTool,
        ctx: ToolContext,
        *,
        trace: TraceParent,
        record: CallRecord,
        policy: RetryPolicy,
        breakers: BreakerBoard,
        deadline_s: float,
        caller: str,
        long_running: bool = False,
        long_after_s: float | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> None:
        self.link = link
        self.on_sent = on_sent
        #: Follow the child by subscription instead of one blocking request.
        self.long_running = long_running
        #: A blocking call still open after this long goes long (in a node's turn only).
        self.long_after_s = long_after_s
        self.tool = tool
        self.ctx = ctx
        self.trace = trace
        self.record = record
        self.policy = policy
        self.breakers = breakers
        self.deadline_s = deadline_s
        self.caller = caller
        self.deadline = 0.0
        self.child: InFlightChild | None = None
        self._message: Outgoing | None = None

    @property
    def peer(self) -> str:
        return self.link.peer

    async def run(self, payload: dict[str, Any] | str) -> TaskResult:
        """Send ``payload`` (checked by ``check_arguments``) and return the child task as it
        ended; ``RemoteError`` when no instance could take it."""
        ctx, skill = self.ctx, self.tool.skill_id
        if not self.link.is_ready():
            await self.link.ready()
        self._start_clock()
        targets = await self.link.targets(skill)
        context_id = _state_value(ctx, context_key(self.peer))
        context_id = context_id if isinstance(context_id, str) else None
        # The message id and the child span's id, from one ``os.urandom`` call (one system
        # call and the span's two Python calls fewer, ~4 k instructions): each uniform, and
        # independent of the other, as drawn apart.
        ids = os.urandom(24).hex()
        self._message = Outgoing(
            payload=payload,
            skill=self._skill_sent,
            # The same for every attempt: the peer deduplicates (uuid4's hex without its
            # version bits, at a quarter of its cost).
            message_id=ids[:32],
            context_id=context_id,
            metadata=self._metadata(ids[32:]),
        )
        return await self._deliver(targets)

    @property
    def _skill_sent(self) -> str | None:
        skill = self.tool.skill_id
        return skill if self.tool.typed or skill != "chat" else None

    def _start_clock(self) -> None:
        self.deadline = time.time() + self.deadline_s
        parent_deadline = self.ctx.metadata.get("deadline")
        if isinstance(parent_deadline, int | float):
            self.deadline = min(self.deadline, float(parent_deadline))

    async def _deliver(self, targets: list[str]) -> TaskResult:
        """Send ``self._message`` to ``targets`` under the retry policy; the child task as it
        ended, or ``ChildWaiting`` (it asks, or a long child started in a node's turn)."""
        ctx, skill = self.ctx, self.tool.skill_id
        assert self._message is not None
        context_id = self._message.context_id
        try:
            result = await call_with_failover(
                targets,
                self._attempt,
                policy=self.policy,
                breakers=self.breakers,
                deadline=self.deadline,
                on_retry=self._retried,
            )
        except asyncio.CancelledError:
            await self._cancel_child()
            raise
        except DeadlineExceeded as exc:
            await self._cancel_child()
            raise self._past_deadline() from exc
        except CircuitOpen as exc:
            detail = "every instance is failing (circuit open)"
            raise RemoteError.unavailable(self.peer, skill, detail) from exc
        except RemoteError as exc:
            if exc.reason == "deadline":  # the HTTP timeout of the attempt: the same deadline
                await self._cancel_child()
                raise self._past_deadline() from exc
            if exc.reason == "unavailable":
                self.link.forget_instances()
            raise
        if result.context_id and result.context_id != context_id:
            ctx.state_delta[context_key(self.peer)] = result.context_id
        if result.waiting:
            # The child asks its caller: the call waits on its questions, relayed, until an
            # answer is forwarded (``forward``).
            raise ChildWaiting(self._child_ref(self.record.target, result), result.questions)
        if not result.done:
            # A long child started (``_detached``): the call is pending on it, kept in the
            # caller's resume point; ``follow`` goes on with it.
            raise ChildWaiting(self._child_ref(self.record.target, result, resend=True), ())
        report_usage(ctx, result.metadata)
        return result

    @property
    def _detached(self) -> bool:
        """A long call whose caller keeps its children in a resume point (a node's LLM turn)."""
        return self.long_running and bool(self.ctx.metadata.get("durable_children"))

    async def follow(self, child: ChildRef) -> TaskResult:
        """Follow the long-running ``child`` task (started by ``run``, or before a restart of
        this node) by its id until it ends: its task then; ``ChildWaiting`` when it asks;
        ``RemoteError`` when it cannot be read until the deadline.

        A child whose instance no longer answers, or that its node ended ``interrupted`` (the
        node stopped under it), is sent again as a blocking call would be: the same message
        (same id: a replica sharing the store, or the restarted node, replays it instead of
        running it twice) to the agent's other instances first; in a node's turn the call
        is then pending on the task that answers (``ChildWaiting``, kept in the resume point)."""
        skill = self.tool.skill_id
        await self.link.ready()
        self._start_clock()
        self.record.target, self.record.task_id = child.url, child.task
        try:
            result = await self._reattach(child)
        except asyncio.CancelledError:
            await self._cancel_child()
            raise
        except RemoteError as exc:
            if exc.reason == "deadline":
                await self._cancel_child()
            if exc.reason != "unavailable" or not child.payload:
                raise
            gone = exc.detail
        else:
            self.child = None
            # Ended because its node stopped under it (``interrupted``/``shutdown``): the
            # node released the message id, so the same message runs it again.
            lost = not result.ok and result.state in _ENDED
            if not (lost and child_failure(self.peer, skill, result).reason == "unavailable"):
                if result.waiting:
                    raise ChildWaiting(child, result.questions)
                report_usage(self.ctx, result.metadata)
                return result
            if not child.payload:
                return result
            gone = f"it ended the task {result.state}: {(result.error or {}).get('reason')}"
        log.warning(
            "%s task %s at %s is lost (%s): sending its message %s again",
            self.peer, child.task, child.url, gone, child.message_id,
        )  # fmt: skip
        self.link.forget_instances()
        self.child = None
        self.long_running = True  # it went long once: the new run is followed the same way
        self._message = Outgoing(
            payload=json.loads(child.payload),
            skill=self._skill_sent,
            message_id=child.message_id,
            context_id=child.context or None,
            metadata=self._metadata(),
        )
        try:
            found = await self.link.targets(skill)
        except RemoteError:
            found = []
        # The next instance first; the one that lost it last (restarted, it runs it again).
        targets = [*(u for u in found if u != child.url), child.url]
        return await self._deliver(targets)

    async def _reattach(self, child: ChildRef) -> TaskResult:
        """Read the long-running ``child`` at its recorded instance until it ends or waits."""
        self.record.attempts += 1
        peer, _ = await self.link.admit(child.url, self.tool.skill_id)
        message = Outgoing("", None, child.message_id, child.context, {})
        self.child = InFlightChild(peer, message, task_id=child.task)
        relay: Relay | None = self.ctx.metadata.get("relay")
        live = relay.child(self.peer) if relay is not None and relay.live else None
        return await self._follow(peer, self.child, live)

    async def _attempt(self, url: str) -> TaskResult:
        """One try at the instance at ``url``: every ``unavailable`` leaves here in the one
        form (``RemoteError.unavailable``), retried at the next instance."""
        skill, record = self.tool.skill_id, self.record
        assert self._message is not None
        record.attempts += 1
        record.target = url
        peer, _ = await self.link.admit(url, skill)
        child = self.child = InFlightChild(peer, self._message)
        relay: Relay | None = self.ctx.metadata.get("relay")
        try:
            if self.long_running:
                live = relay.child(self.peer) if relay is not None and relay.live else None
                result = await self._followed(peer, child, live)
            elif relay is not None and relay.live:
                # Someone follows the caller's task live: the child's progress is relayed.
                result = await self._streamed(peer, child, relay.child(self.peer))
            else:
                # One blocking SendMessage: one JSON body each way, the finished task in the
                # answer.
                timeout = max(0.1, self.deadline - time.time())
                after = self.long_after_s
                # Sent by the peer itself (``Outgoing.send``'s call, one coroutine fewer on
                # the hop's path each way).
                message = self._message
                # A node's LLM turn (``durable_children``) goes long when the blocking send is
                # still open after ``after`` seconds, sooner than the deadline: the send's own
                # timeout is the switch (the request dropped at ``after`` as a timer around it
                # would drop it, one timer fewer), and the rest is ``_gone_long``'s. Written
                # here, not in a coroutine of its own: two coroutines fewer on the hop's path
                # each way.
                long_at = (
                    after
                    if after is not None
                    and after < timeout
                    and self.ctx.metadata.get("durable_children")
                    else None
                )
                gone_at: float | None = None
                try:
                    result = await peer.send(
                        message.payload,
                        skill=message.skill,
                        message_id=message.message_id,
                        context_id=message.context_id,
                        metadata=message.metadata,
                        timeout=timeout if long_at is None else long_at,
                        sent=self.on_sent,
                    )
                except RemoteError as exc:
                    if long_at is None or exc.reason != "deadline":
                        raise
                    gone_at = long_at
                # Outside the handler: the send below is not raised "during" the timeout.
                if gone_at is not None:
                    result = await self._gone_long(peer, gone_at)
        except RemoteError as exc:
            if exc.reason == "unavailable":
                raise RemoteError.unavailable(self.peer, skill, exc.detail) from exc
            raise
        child.task_id = record.task_id = result.task_id
        if result.replied:  # a direct Message (reply="message"): the whole answer, no task
            self.child = None
            return result
        if not result.task_id:
            detail = f"the instance at {url} answered without a task"
            raise RemoteError.unavailable(self.peer, skill, detail)
        if self._detached and result.state in ("submitted", "working"):
            self.child = None  # the caller's resume point holds it from here on
            return result
        if result.waiting:
            # The child asks its caller: an answer (never retried, the instance is healthy);
            # ``run`` makes it ChildWaiting.
            self.child = None
            return result
        if not result.done:
            # Not a state a finished attempt leaves (working: the node did not answer the
            # blocking send properly); a re-send (same message id) reports its state again.
            detail = f"the instance at {url} left task {result.task_id} unfinished ({result.state})"
            raise RemoteError.unavailable(self.peer, skill, detail)
        self.child = None
        if not result.ok and (failure := child_failure(self.peer, skill, result)).reason == (
            "unavailable"
        ):
            # The instance stopped under the task: retried elsewhere.
            detail = f"the instance at {url} {failure.detail}"
            raise RemoteError.unavailable(self.peer, skill, detail) from failure
        return result

    async def _streamed(self, peer: A2APeer, child: InFlightChild, relay: ChildRelay) -> TaskResult:
        """The attempt as a stream: the same message, each event of the child relayed as it
        comes, then the child task as ``GetTask`` gives it (what the blocking send answers).
        The stream ends at the child's end or when it waits for input."""
        assert self._message is not None
        remaining = max(0.1, self.deadline - time.time())
        try:
            async with asyncio.timeout(remaining):
                async with contextlib.aclosing(
                    self._message.stream(peer, timeout=remaining)
                ) as events:
                    async for update in events:
                        if update.kind == "message":  # a direct reply: the whole answer
                            return update.reply()
                        if update.task_id and not child.task_id:
                            child.task_id = update.task_id  # a cancel from here on reaches it
                        await relay.forward(update)
                await relay.flush()
                if not child.task_id:
                    raise RemoteError.unavailable(
                        self.peer, self.tool.skill_id, f"{peer.base_url} streamed no task"
                    )
                return await peer.get_task(child.task_id)
        except TimeoutError:
            raise RemoteError(
                f"{self.peer} did not answer in time",
                peer=self.peer,
                skill=self.tool.skill_id,
                reason="deadline",
            ) from None

    async def _gone_long(self, peer: A2APeer, after: float) -> TaskResult:
        """A blocking send still open after ``after`` seconds (sooner than the deadline) was
        dropped (the child's task goes on): the call goes long. The same message, re-sent
        without waiting, gives the child's task as it is now (the peer deduplicates by message
        id); the call is then pending on it like a declared long one."""
        assert self._message is not None
        self.long_running = True
        log.info(
            "%s %r: still running after %.1fs, followed from here on",
            self.peer,
            self.tool.skill_id,
            after,
        )
        remaining = max(0.1, min(_START_S, self.deadline - time.time()))
        return await self._message.send(peer, timeout=remaining, wait=False)

    async def _followed(
        self, peer: A2APeer, child: InFlightChild, relay: ChildRelay | None
    ) -> TaskResult:
        """The attempt of a long-running call: the message sent without waiting, then the
        child followed until it ends or waits for input (see the module docstring); the child
        task as ``GetTask`` gives it. ``relay``: the caller's task is streamed."""
        assert self._message is not None
        timeout = max(0.1, min(_START_S, self.deadline - time.time()))
        first = await self._message.send(peer, timeout=timeout, wait=False)
        child.task_id = first.task_id  # from here on a cancel or a deadline reaches it
        if not first.task_id or first.state in _ENDED or first.waiting or self._detached:
            return first
        return await self._follow(peer, child, relay)

    async def _follow(
        self, peer: A2APeer, child: InFlightChild, relay: ChildRelay | None
    ) -> TaskResult:
        """Read the child task ``child.task_id`` at ``peer`` until it ends or waits; an
        instance that cannot be read ``_FOLLOW_TRIES`` times in a row is ``unavailable``."""
        delay, unreadable = _FOLLOW_FIRST_S, 0
        while True:
            remaining = self.deadline - time.time()
            if remaining <= 0:
                raise self._past_deadline()
            streamed = windowed = False
            try:
                # One window of the subscription at a time: a task the peer ran outside its
                # SDK handler (its fast path for a blocking send: one that went long past
                # ``long_after_s``) never shows its end to subscribers; GetTask does.
                async with asyncio.timeout(min(remaining, _WINDOW_S)):
                    async with contextlib.aclosing(
                        peer.subscribe(child.task_id, timeout=min(remaining, _STALL_S))
                    ) as events:
                        async for update in events:
                            streamed = True
                            if relay is not None:
                                await relay.forward(update)
            except TimeoutError:
                if time.time() >= self.deadline:
                    raise self._past_deadline() from None
                windowed = True
            except NotImplementedError:
                pass  # the peer does not stream: GetTask alone follows it
            except RemoteError as exc:
                # Dropped, stalled, or the task ended between two reads (-32004): GetTask says.
                log.info(
                    "following %s task %s at %s: %s", self.peer, child.task_id, peer.base_url, exc
                )
            if relay is not None:
                await relay.flush()
            try:
                now = await peer.get_task(child.task_id)
            except RemoteError as exc:
                unreadable += 1
                if exc.reason != "unavailable" or unreadable >= _FOLLOW_TRIES:
                    raise
                log.info(
                    "following %s task %s: %s; reading it again", self.peer, child.task_id, exc
                )
            else:
                unreadable = 0
                if now.state in _ENDED or now.waiting:
                    return now
            if windowed:
                continue  # nothing failed: the next window at once
            if streamed:
                delay = _FOLLOW_FIRST_S  # the stream worked for a while: a new drop starts over
            await asyncio.sleep(max(0.0, min(delay, self.deadline - time.time())))
            delay = min(delay * 2, _FOLLOW_MAX_S)

    def _metadata(self, span: str = "") -> dict[str, Any]:
        """What every message of this delegation carries besides its parts. ``span``: the child
        span's id, 16 random hex digits drawn by the caller (else drawn here); all zeros (the
        spec's invalid id) is drawn again, as ``TraceParent.child_text`` does."""
        ctx = self.ctx
        trace = self.trace
        metadata: dict[str, Any] = {
            "traceparent": f"00-{trace.trace_id}-{span}-{trace.flags}"
            if span and span != _ZERO_SPAN
            else trace.child_text(),
            "deadline": self.deadline,
            "caller": ctx.agent_name or self.caller,
        }
        caller_task = ctx.metadata.get("task_id")
        if isinstance(caller_task, str) and caller_task:
            metadata[CALLER_TASK] = caller_task  # lets readers fold the hops of a chain
        return metadata

    def _child_ref(self, url: str, result: TaskResult, *, resend: bool = False) -> ChildRef:
        """``result``'s child task; ``resend``: with the message's data, so a long child can be
        sent again (``follow``) when its instance loses it."""
        assert self._message is not None
        return ChildRef(
            peer=self.peer,
            skill=self.tool.skill_id,
            url=url,
            task=result.task_id,
            context=result.context_id,
            message_id=self._message.message_id,
            payload=json.dumps(self._message.payload) if resend else "",
        )

    async def forward(
        self, child: ChildRef, question_id: str, answer: Any, attempt: int = 0
    ) -> TaskResult:
        """Send ``answer`` to the question ``question_id`` of the waiting ``child`` task: to
        the instance that holds it first, then the agent's other instances (a replica on a
        shared store finds the task). Its message id is derived from the child task, the
        question, the answer and ``attempt`` (the earlier forwards of this call that did not
        settle it), so the same forward sent again (a node that stopped during it runs
        again) is deduplicated at every hop, and a later one is new. Returns the child task
        once it ended; ``ChildWaiting`` when it asks again (the next question, or the answer
        was invalid there); ``RemoteError`` when no instance could take it."""
        skill = self.tool.skill_id
        await self.link.ready()
        self._start_clock()
        text = json.dumps([child.task, question_id, answer, attempt], sort_keys=True, default=str)
        metadata = self._metadata()
        if question_id:
            metadata[TASKS_EXTENSION] = {"answers": question_id}
        self._message = Outgoing(
            payload=answer if isinstance(answer, dict | str) else json.dumps(answer),
            skill=None,
            message_id=hashlib.sha256(text.encode()).hexdigest()[:32],
            context_id=child.context,
            metadata=metadata,
        )
        try:
            found = await self.link.targets(skill)
        except RemoteError:
            found = []
        targets = [child.url, *(u for u in found if u != child.url)]
        failure: RemoteError | None = None
        for url in targets:
            if time.time() >= self.deadline:
                raise self._past_deadline()
            try:
                result = await self._forward_to(url, child)
            except RemoteError as exc:
                if exc.reason != "unavailable":
                    raise
                failure = exc
            else:
                report_usage(self.ctx, result.metadata)
                return result
        assert failure is not None
        raise failure

    async def _forward_to(self, url: str, child: ChildRef) -> TaskResult:
        assert self._message is not None
        skill = self.tool.skill_id
        self.record.attempts += 1
        self.record.target, self.record.task_id = url, child.task
        peer, _ = await self.link.admit(url, skill)
        timeout = max(0.1, self.deadline - time.time())
        try:
            result = await peer.send(
                self._message.payload,
                message_id=self._message.message_id,
                context_id=child.context,
                task_id=child.task,
                metadata=self._message.metadata,
                timeout=timeout,
            )
        except RemoteError as exc:
            if exc.reason == "unavailable":
                raise RemoteError.unavailable(self.peer, skill, exc.detail) from exc
            # A task that ended meanwhile (answered at the child directly: -32004), or that
            # this instance does not hold: what the task is now decides.
            now = await peer.find_task(child.task)
            if now is None:
                raise
            result = now
        if result.waiting:
            raise ChildWaiting(replace(child, url=url), result.questions)
        if not result.done:
            detail = f"the instance at {url} left task {child.task} unfinished ({result.state})"
            raise RemoteError.unavailable(self.peer, skill, detail)
        return result

    def _retried(self, target: str, exc: BaseException) -> None:
        skill = self.tool.skill_id
        log.warning(
            "delegation retry peer=%s skill=%s target=%s: %s", self.peer, skill, target, exc
        )
        if self.link.metrics is not None:
            self.link.metrics.delegation_retry(self.peer, skill)

    def _past_deadline(self) -> RemoteError:
        return RemoteError(
            f"{self.peer} did not answer {self.tool.skill_id!r} within the deadline "
            f"({self.deadline_s:.0f}s or the caller's)",
            peer=self.peer,
            skill=self.tool.skill_id,
            reason="deadline",
        )

    async def _cancel_child(self) -> None:
        child = self.child
        if child is None:
            return
        # Shielded and bounded: we are being cancelled ourselves, the CancelTask must still go.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(child.cancel()), _CANCEL_S)
        if child.task_id:
            self.record.task_id = child.task_id
        if child.canceled:
            log.info("canceled child task %s at %s", child.task_id, self.peer)


def check_arguments(tool: SkillTool, args: Mapping[str, Any]) -> dict[str, Any] | str:
    """What to send for the model's ``args``: the text of a text skill, the checked JSON of a
    typed one. ``ToolError`` (``invalid_arguments``, naming each field) when they do not fit."""
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
        value = check(dict(args), tool.input_schema, fixed=True)
    except SchemaViolation as exc:
        raise ToolError(
            f"invalid arguments for {tool.name}: {exc}",
            kind="invalid_arguments",
            details=exc.errors,
        ) from exc
    return dict(value)


def child_failure(peer: str, skill: str, result: TaskResult) -> RemoteError:
    """The error of a child task that finished without completing."""
    error = result.error or {}
    reason = _REASONS.get(str(error.get("reason")), _REASONS.get(result.state, "failed"))
    detail = f"{result.state} the {skill!r} request: {error.get('message') or result.text or result.state}"
    return RemoteError(f"{peer} {detail}", peer=peer, skill=skill, reason=reason, detail=detail)


def check_answer(peer: str, tool: SkillTool, result: TaskResult) -> Any:
    """What the model gets of a finished child task: the text of a text skill, the data of a
    typed one checked against its output schema; else the ``RemoteError`` it deserves."""
    skill = tool.skill_id
    if result.state != "completed":
        raise child_failure(peer, skill, result)
    if not tool.typed:
        return result.text
    if result.data is None:
        raise RemoteError(
            f"{peer} answered {skill!r} without a JSON result",
            peer=peer,
            skill=skill,
            reason="invalid_output",
        )
    if tool.output_schema is None:
        return result.data
    try:
        return check(result.data, tool.output_schema, fixed=True)
    except SchemaViolation as exc:
        raise RemoteError(
            f"{peer} answered {skill!r} with data that does not match its output schema: {exc}",
            peer=peer,
            skill=skill,
            reason="invalid_output",
        ) from exc


# The last valid ``traceparent`` text ``turn_trace`` parsed, and its parse: every delegation of
# a turn reads its turn's one header, and a ``TraceParent`` is frozen, so the one parsed for a
# turn's first call is its next calls' too (~12 k instructions a call otherwise). One pair,
# replaced whole (a reader on another thread sees the old pair or the new one).
_parsed_trace: tuple[str, TraceParent] | None = None


def turn_trace(ctx: ToolContext) -> TraceParent:
    """The turn's trace: the caller's ``traceparent``, else one derived from the turn's
    invocation id, so every delegation of one turn shares a trace id without any state kept
    (a call with neither gets a trace of its own); the last valid header's parse is reused
    for the same text (``_parsed_trace``)."""
    global _parsed_trace
    header = ctx.metadata.get("traceparent")
    known = _parsed_trace
    # The same text (exactly a str: a subclass's comparison could say anything) parses alike.
    if known is not None and type(header) is str and known[0] == header:
        return known[1]
    parsed = TraceParent.parse(header)
    if parsed is not None:
        if type(header) is str:
            _parsed_trace = (header, parsed)
        return parsed
    if not ctx.invocation_id:
        return TraceParent.new()
    digest = hashlib.sha256(ctx.invocation_id.encode()).hexdigest()
    derived = TraceParent.parse(f"00-{digest[:32]}-{digest[32:48]}-01")
    return derived or TraceParent.new()  # all zeros: the spec's invalid ids


def report_usage(ctx: ToolContext, task_metadata: Mapping[str, Any]) -> None:
    """Pass the child's usage (its own plus its children's, by kind in camelCase: a child
    before the camelCase keys reported ``children_usage`` and ``input_tokens``) to the
    caller's usage sink."""
    sink = ctx.metadata.get("usage_sink")
    if sink is None:
        return
    # Its own counts, its children's added in (usually none: an empty or missing value has
    # no counts, so it is not read). Each key by ``read``'s rule, its call made only for a
    # child that did not send it (an older node's snake_case spelling).
    usage = task_metadata.get(USAGE)
    total = usage_counts(usage if usage is not None else read(task_metadata, USAGE))
    children = task_metadata.get(CHILDREN_USAGE)
    if children is None:
        children = read(task_metadata, CHILDREN_USAGE)
    if children:
        for name, value in usage_counts(children).items():
            total[name] = total.get(name, 0) + value
    if not total:
        return
    if type(sink) is list:  # a turn's (a plain list is never callable)
        sink.append(total)
    elif callable(sink):
        sink(total)
    elif isinstance(sink, list):
        sink.append(total)

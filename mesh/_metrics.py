"""Every Prometheus metric a node exposes, on one injected ``CollectorRegistry``.

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, agent="credit-bureau", version="0.1.0")
    metrics.task_done("score", "completed", seconds=0.012)

Names follow ``mesh_<what>_<unit>``; labels stay bounded (agent, skill, model, tool, peer,
outcome), never ids. Values a caller chooses are closed sets: a JSON-RPC ``method`` label is a
known A2A method (``methods``) or ``other``, a ``skill`` label a declared skill (``skills``) or
``other``, so random method names or skill ids cannot grow the exposition. The ``target`` of
``mesh_circuit_breaker_state`` is an instance URL (which whoever registers chooses): a peer has
series only for the targets of its latest resolution, at most ``MAX_BREAKER_TARGETS``, the rest
folded into one ``target="other"`` holding the worst of their states. ``NodeMetrics`` also implements the runner's observer protocol
(``on_model_call``, ``on_tool_call``, ``on_session_created``), so a ``Runner`` reports straight
into it. The delegation metrics are defined here too, for ``mesh._remote`` / ``mesh._resilience``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, Literal, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase

from mesh._types import Usage

__all__ = [
    "DURATION_BUCKETS",
    "MAX_BREAKER_TARGETS",
    "MAX_CACHED_CHILDREN",
    "MAX_DENIED_CALLERS",
    "OTHER",
    "PUSH_OUTCOMES",
    "BreakerState",
    "DelegationSeries",
    "NodeMetrics",
    "PushOutcome",
    "TaskOutcome",
    "render",
]

#: How a task's run ended; ``waiting``: it asked its caller and waits for the answer.
TaskOutcome = Literal["completed", "failed", "rejected", "canceled", "waiting"]
#: What became of a push notification (``mesh._a2a.push``): delivered (a 2xx), failed (one
#: attempt; retried later), expired (given up after the retry time), dropped (its config was
#: deleted), refused (its URL now resolves outside MESH_PUSH_NETWORKS).
PushOutcome = Literal["delivered", "failed", "expired", "dropped", "refused"]
PUSH_OUTCOMES: tuple[PushOutcome, ...] = ("delivered", "failed", "expired", "dropped", "refused")
BreakerState = Literal["closed", "half-open", "open"]
_BREAKER_VALUE = {"closed": 0, "half-open": 1, "open": 2}
#: The label value of anything outside a label's closed set.
OTHER = "other"
#: Breaker series per peer; the targets beyond are one ``other`` series (their worst state).
MAX_BREAKER_TARGETS = 32
#: Caller labels of ``mesh_calls_denied_total``; callers beyond are ``other``.
MAX_DENIED_CALLERS = 64
# Requests refused before their method is known (401, 413, 503 busy, 408 a body that did not
# arrive in time, a body that is not a JSON-RPC request).
_REFUSED = frozenset({"unauthorized", "too_large", "busy", "body_timeout", "invalid"})

# Tasks range from sub-millisecond function skills to multi-minute LLM turns.
_TASK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: The upper bounds of the task and delegation duration histograms (``mesh._stats`` reads them).
DURATION_BUCKETS = _TASK_BUCKETS
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


#: Label children each metric keeps resolved (``_Children``); label sets beyond resolve anew.
MAX_CACHED_CHILDREN = 256

M = TypeVar("M", bound=MetricWrapperBase)


class _Children(Generic[M]):
    """The children of one labelled metric, each resolved by ``labels()`` once: a node calls
    them on every task, model and tool call, and ``labels()`` builds and checks the label
    tuple under a lock each time. Values are the bounded sets the callers pass (closed sets,
    declared tools, configured models); ``MAX_CACHED_CHILDREN`` bounds the cache anyway. Not
    for a metric whose series are removed (a removed child would live on here)."""

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._cache.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if len(self._cache) < MAX_CACHED_CHILDREN:
                self._cache[values] = child
        return child

    def known(self, *values: str) -> M | None:
        """The child of ``values`` if it is resolved already (none is made: a series shows in
        the exposition from its first ``labels()``)."""
        return self._cache.get(values)


#: An ``ok`` delegation's series made already: its count and its duration, each None when not
#: (``NodeMetrics.delegation_series``).
DelegationSeries = tuple[Counter | None, Histogram | None]


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of ``registry`` and its content type, in the format ``accept`` (the
    scraper's Accept header) asks for: Prometheus text 0.0.4 by default, OpenMetrics when asked.
    CPU-bound: call it off the event loop."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


class NodeMetrics:
    """The metrics of one node (agent), registered on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        agent: str,
        *,
        version: str = "",
        skills: Iterable[str] | None = None,
        methods: Iterable[str] | None = None,
        process_collectors: bool = True,
    ) -> None:
        self.registry = registry
        self.agent = agent
        # None: any value is a label (a library user's own metrics); a node passes both.
        self._skills = None if skills is None else frozenset(skills)
        self._methods = None if methods is None else frozenset(methods) | _REFUSED
        if process_collectors:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        r = registry
        self.node_info = Gauge("mesh_node_info", "Node identity.", ["agent", "version"], registry=r)
        self.node_info.labels(agent, version).set(1)
        self.requests = Counter(
            "mesh_requests_total",
            "A2A requests by method (JSON-RPC, and HTTP+JSON as 'POST /message:send'...).",
            ["agent", "method", "outcome"],
            registry=r,
        )
        self.fastpath_sends = Counter(
            "mesh_fastpath_sends_total",
            "Blocking sends the node's gate answered on the fast path (mesh._a2a.fastroute), "
            "by A2A binding.",
            ["agent", "binding"],
            registry=r,
        )
        self._fastpath_sends = {
            b: self.fastpath_sends.labels(agent, b) for b in ("jsonrpc", "rest")
        }
        self.calls_denied = Counter(
            "mesh_calls_denied_total",
            "A2A calls the call policy (MESH_ALLOW) refused with 403, by caller and skill.",
            ["agent", "caller", "skill"],
            registry=r,
        )
        self._denied_callers: set[str] = set()
        self.tasks = Counter(
            "mesh_tasks_total", "Tasks finished.", ["agent", "skill", "outcome"], registry=r
        )
        self.task_duration = Histogram(
            "mesh_task_duration_seconds",
            "Task wall time.",
            ["agent", "skill"],
            buckets=_TASK_BUCKETS,
            registry=r,
        )
        self.tasks_in_flight = Gauge(
            "mesh_tasks_in_flight", "Tasks running now.", ["agent"], registry=r
        )
        self.model_calls = Counter(
            "mesh_model_calls_total", "Model calls.", ["agent", "model", "outcome"], registry=r
        )
        self.model_latency = Histogram(
            "mesh_model_latency_seconds",
            "Model call latency.",
            ["agent", "model"],
            buckets=_MODEL_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "mesh_tokens_total", "Model tokens.", ["agent", "model", "kind"], registry=r
        )
        self.tool_calls = Counter(
            "mesh_tool_calls_total", "Tool calls.", ["agent", "tool", "outcome"], registry=r
        )
        self.sessions_created = Counter(
            "mesh_sessions_created_total", "Sessions created.", ["agent"], registry=r
        )
        self.delegations = Counter(
            "mesh_delegations_total",
            "Delegations to peer agents.",
            ["agent", "peer", "skill", "outcome"],
            registry=r,
        )
        self.delegation_duration = Histogram(
            "mesh_delegation_duration_seconds",
            "Delegation wall time, retries included.",
            ["agent", "peer", "skill"],
            buckets=_TASK_BUCKETS,
            registry=r,
        )
        self.delegation_retries = Counter(
            "mesh_delegation_retries_total",
            "Delegation retries.",
            ["agent", "peer", "skill"],
            registry=r,
        )
        self.circuit_breaker = Gauge(
            "mesh_circuit_breaker_state",
            "Circuit breaker per peer target: 0 closed, 1 half-open, 2 open.",
            ["agent", "peer", "target"],
            registry=r,
        )
        self.push_deliveries = Counter(
            "mesh_push_deliveries_total",
            "Push notification attempts and ends, by outcome.",
            ["agent", "outcome"],
            registry=r,
        )
        self.push_pending = Gauge(
            "mesh_push_pending",
            "Push notifications waiting in the outbox (queued or being retried).",
            ["agent"],
            registry=r,
        )
        self._requests = _Children(self.requests)
        self._tasks = _Children(self.tasks)
        self._task_duration = _Children(self.task_duration)
        self._model_calls = _Children(self.model_calls)
        self._model_latency = _Children(self.model_latency)
        self._tokens = _Children(self.tokens)
        self._tool_calls = _Children(self.tool_calls)
        self._delegations = _Children(self.delegations)
        self._delegation_duration = _Children(self.delegation_duration)
        # Tasks running now, counted here and read when the gauge is scraped: its inc and dec
        # take a lock through three Python calls, ~5,000 instructions each, twice per task.
        # Counted on the node's event loop (the executor's runs); a scrape on another thread
        # reads the int.
        self._running = 0
        self.tasks_in_flight.labels(agent).set_function(self._tasks_running)
        #: ``task_done``'s series by the skill and outcome it is given (``_resolve_task_series``).
        self._task_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        #: ``request``'s counter by the method and outcome it is given.
        self._request_series: dict[tuple[str, bool], Counter] = {}
        self._sessions_created = self.sessions_created.labels(agent)
        for outcome in PUSH_OUTCOMES:
            self.push_deliveries.labels(agent, outcome)
        self.push_pending.labels(agent).set(0)
        # The targets each peer has breaker series for now.
        self._breaker_targets: dict[str, frozenset[str]] = {}

    # -- node ---------------------------------------------------------------------------------
    def request(self, method: str, ok: bool) -> None:
        """One A2A request (either binding); ``method`` outside the known methods counts as
        ``other``."""
        counter = self._request_series.get((method, ok))
        if counter is None:
            known = self._methods is None or method in self._methods
            counter = self._requests(
                self.agent, method if known else OTHER, "ok" if ok else "error"
            )
            # Kept (as _Children keeps them, at most MAX_CACHED_CHILDREN): one lookup a request
            # instead of a label resolution (~2,300 instructions). Only a known method's: the
            # name comes from the caller, and kept it would pin whatever was sent (megabytes).
            if known and len(self._request_series) < MAX_CACHED_CHILDREN:
                self._request_series[(method, ok)] = counter
        counter.inc()

    def call_denied(self, caller: str, skill: str) -> None:
        """A call the policy refused. ``caller`` is a verified agent (certified by the mesh's
        root, so the operator bounds them) or ``@token``, capped all the same at
        ``MAX_DENIED_CALLERS`` labels; ``skill`` a declared skill, ``*`` (a call naming none,
        or about tasks) or ``other``."""
        if caller not in self._denied_callers:
            if len(self._denied_callers) >= MAX_DENIED_CALLERS:
                caller = OTHER
            else:
                self._denied_callers.add(caller)
        if skill != "*" and self._skills is not None and skill not in self._skills:
            skill = OTHER
        self.calls_denied.labels(self.agent, caller, skill).inc()

    def fastpath_send(self, binding: Literal["jsonrpc", "rest"]) -> None:
        """One blocking send answered on the fast path, over ``binding``."""
        self._fastpath_sends[binding].inc()

    def task_started(self) -> None:
        self._running += 1

    def _tasks_running(self) -> float:
        return self._running

    def task_done(self, skill: str, outcome: TaskOutcome, seconds: float) -> None:
        """One finished task; ``skill`` outside the declared skills counts as ``other``."""
        self._running -= 1
        series = self._task_series.get((skill, outcome))
        if series is None:
            series = self._resolve_task_series(skill, outcome)
        series[0].inc()
        series[1].observe(seconds)

    def _resolve_task_series(self, skill: str, outcome: TaskOutcome) -> tuple[Counter, Histogram]:
        """``task_done``'s two series for ``skill`` and ``outcome``, kept (as ``_Children``
        keeps them, at most ``MAX_CACHED_CHILDREN``) under the names given, a declared skill's
        only: one lookup a task instead of two label resolutions (~2,300 instructions each)."""
        known = self._skills is None or skill in self._skills
        named = skill if known else OTHER
        series = (self._tasks(self.agent, named, outcome), self._task_duration(self.agent, named))
        if known and len(self._task_series) < MAX_CACHED_CHILDREN:  # see request()
            self._task_series[(skill, outcome)] = series
        return series

    def push_delivery(self, outcome: PushOutcome, n: int = 1) -> None:
        """``n`` push notifications (or attempts, for ``failed``) ended with ``outcome``."""
        self.push_deliveries.labels(self.agent, outcome).inc(n)

    # -- runner observer ----------------------------------------------------------------------
    def on_model_call(self, model_name: str, seconds: float, usage: Usage | None, ok: bool) -> None:
        self._model_calls(self.agent, model_name, "ok" if ok else "error").inc()
        self._model_latency(self.agent, model_name).observe(seconds)
        if usage is not None:
            for kind, value in (
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cached", usage.cached_tokens),
                ("thinking", usage.thinking_tokens),
            ):
                if value:
                    self._tokens(self.agent, model_name, kind).inc(value)

    def on_tool_call(self, tool_name: str, ok: bool) -> None:
        self._tool_calls(self.agent, tool_name, "ok" if ok else "error").inc()

    def on_session_created(self) -> None:
        self._sessions_created.inc()

    # -- delegation ---------------------------------------------------------------------------
    def delegation(
        self,
        peer: str,
        skill: str,
        outcome: str,
        seconds: float,
        series: DelegationSeries | None = None,
    ) -> None:
        """One finished delegation; outcome: ok/rejected/unavailable/deadline/failed/canceled/
        waiting (the child asks its caller). ``series``: ``delegation_series(peer, skill)``,
        asked earlier (while the peer works)."""
        ok, duration = series if series is not None else (None, None)
        if ok is None or outcome != "ok":
            ok = self._delegations(self.agent, peer, skill, outcome)
        if duration is None:
            duration = self._delegation_duration(self.agent, peer, skill)
        # Through the series' own methods: their internals (``_value``, ``_buckets``) are
        # prometheus_client's private parts, and this package allows any release >= 0.20
        # (going around the methods' checks saved ~3 k instructions: not worth a break on an
        # upgrade, on every delegation).
        ok.inc()
        duration.observe(seconds)

    def delegation_series(self, peer: str, skill: str) -> DelegationSeries:
        """The series an ``ok`` delegation of ``skill`` at ``peer`` counts in (its count and
        its duration) that are made already, for ``delegation(series=)``: looked up before
        the call ends, off the path from its answer to its caller. None for one not made yet
        (``delegation`` makes it when the call ends, as it always did: a series is not shown
        before its first call ends)."""
        return (
            self._delegations.known(self.agent, peer, skill, "ok"),
            self._delegation_duration.known(self.agent, peer, skill),
        )

    def delegation_retry(self, peer: str, skill: str) -> None:
        self.delegation_retries.labels(self.agent, peer, skill).inc()

    def breaker_states(self, peer: str, states: Mapping[str, BreakerState]) -> None:
        """The breakers of ``peer`` are ``states`` (target -> state, in resolution order) and
        only those: a target no longer listed loses its series. The first
        ``MAX_BREAKER_TARGETS`` get a series each, the rest one ``other`` (the worst state)."""
        values = {target: _BREAKER_VALUE[state] for target, state in states.items()}
        if len(values) > MAX_BREAKER_TARGETS:
            targets = list(values)
            rest = targets[MAX_BREAKER_TARGETS:]
            worst = max(values[t] for t in rest)
            values = {t: values[t] for t in targets[:MAX_BREAKER_TARGETS]}
            values[OTHER] = worst
        for gone in self._breaker_targets.get(peer, frozenset()) - values.keys():
            self.circuit_breaker.remove(self.agent, peer, gone)
        for target, value in values.items():
            self.circuit_breaker.labels(self.agent, peer, target).set(value)
        self._breaker_targets[peer] = frozenset(values)

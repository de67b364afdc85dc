"""A2A push notifications: webhook configs stored in ``node.db``, delivered by a durable outbox.

A caller that will not stay connected (a non-blocking send, a dropped stream) names a webhook,
inline (``SendMessage``'s ``configuration.taskPushNotificationConfig``) or with
``CreateTaskPushNotificationConfig``; Get / List / Delete read and remove them. The SDK's request
handler serves those methods over ``PushConfigStore`` (``mesh._a2a.push_configs``: table ``a2a_push_configs``, owner-scoped
like the tasks), and hands every event of the tasks it runs to ``PushOutbox.send_notification``.

What is delivered: each settled state a task reaches (every terminal state, INPUT_REQUIRED and
AUTH_REQUIRED: what a caller that is not connected must act on or learn the end of), as the
task itself (``{"task": {...}}``, a ``StreamResponse``, so a receiver written for the SDK's
sender reads it), without its history (the status message carries the question or the final
word, the artifacts the result; ``GetTask`` has the rest). WORKING updates and artifact chunks
are not pushed: progress is what streaming and ``SubscribeToTask`` are for, and pushing it would
cost a write and a POST per event. When a task moves on before its notification is queued, the
webhook is told the newer state: a notification says "the task is now X", latest state wins.

How it is delivered, off the task's path: ``send_notification`` (awaited inside the SDK's event
consumer) only notes the task id for a background worker, and only for a task that has a config
and an event that settles it (a set lookup; tasks without a config, and the fast path, which
takes no push config, pay nothing else). The worker, started and stopped with the node's
lifespan (``A2AService``; what it does to the outbox table is ``mesh._a2a.push_queue``):

* queues one ``a2a_push_outbox`` row per config (one transaction), the body built from the
  task's stored row; a newer state replaces a pending one. Each config remembers the last state
  queued for it, so the rule "every settled state gets queued once" holds across restarts: at
  start, and every ``SWEEP_S`` while configs are open, the worker queues what was missed (a
  crash between the task's save and its queueing, a task ended at start-up or at shutdown, a
  cancel or fast-path end that raised no event here);
* POSTs due rows (``CONCURRENCY`` at a time, each within ``timeout_s``) with the SDK's headers
  (``X-A2A-Notification-Token``, ``Authorization: <scheme> <credentials>`` from the config's
  authentication); a 2xx deletes the row, anything else retries it with exponential backoff
  (tenacity's ``wait_exponential``, ``first_retry_s`` up to ``max_retry_s``) until
  ``retry_for_s`` after it was queued. A row being sent is claimed (its ``next_at`` pushed past
  the attempt), so a kill -9 mid-POST retries it after the restart: at-least-once delivery.

Where webhooks may be: a URL is checked when a config is set (``PushUrlCheck``: the SDK's
validator's rules, with ``MESH_PUSH_NETWORKS`` as the allowed networks; default ``public``,
the SDK's own rule) and again at every connection, by ``mesh._netguard``'s guarded client, so a
name that later resolves elsewhere (DNS rebinding) reaches nothing. A refused URL is JSON-RPC
-32602 naming the field; the reply never says what the host resolved to (the log does).

Configs (with their token and credentials) are stored in clear in ``node.db``, like the tasks:
protect the data dir. The worker reads ``a2a_tasks`` (``mesh._a2a.store``) in the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from a2a.server.tasks import PushNotificationSender
from a2a.types import (
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)

from mesh._a2a.push_configs import PushConfigStore, PushUrlCheck
from mesh._a2a.push_queue import Delivery, claim, delete_sent, queue_settled, reschedule
from mesh._a2a.states import SETTLED_STATES
from mesh._metrics import NodeMetrics, PushOutcome
from mesh._netpolicy import NetworkPolicy
from mesh._sqlite import Database

if TYPE_CHECKING:
    from tenacity import AsyncRetrying

__all__ = [
    "CONCURRENCY",
    "SWEEP_S",
    "PushConfigStore",
    "PushOutbox",
    "PushParts",
    "PushUrlCheck",
]

log = logging.getLogger("mesh._a2a.push")

#: Deliveries in flight at once (all webhooks together).
CONCURRENCY = 8
#: Seconds between passes that queue settled states no event announced (while configs are open).
SWEEP_S = 5.0
#: Rows claimed per pass at most.
_CLAIM_BATCH = 64


class PushOutbox(PushNotificationSender):
    """The SDK's ``PushNotificationSender``, delivering through a durable outbox (see the
    module docstring). ``start()`` in the node's lifespan, ``aclose()`` when it ends."""

    def __init__(
        self,
        db: Database,
        policy: NetworkPolicy,
        *,
        metrics: NodeMetrics | None = None,
        first_retry_s: float = 1.0,
        max_retry_s: float = 300.0,
        retry_for_s: float = 24 * 3600.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self.policy = policy
        self._metrics = metrics
        # The waits between attempts (made at the first failure: tenacity is not imported by a
        # node that never retries a push); the attempt count lives in the outbox row.
        self._backoff = (first_retry_s, max_retry_s)
        self._retrying: AsyncRetrying | None = None
        self._retry_for_s = retry_for_s
        self._timeout_s = timeout_s
        self._clock = clock
        #: Tasks with a config not told of their end yet: the only ones an event is noted for.
        self._watched: set[str] = set()
        # Watched since the current sweep read the table (the sweep's read may predate them).
        self._recent: set[str] = set()
        # Tasks with a settled event since the last pass.
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        self._next_sweep = 0.0
        self._next_due: float | None = None
        # Replicas share the database: every one sweeps, so a config set on a replica that
        # died is still served (its tasks' states queued by another).
        self._shared = db.dialect != "sqlite"

    # -- the SDK's side: called in its event consumer -----------------------------------------
    async def send_notification(
        self, task_id: str, event: Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent
    ) -> None:
        """Note a settled state of a task that has a config; the worker does the rest."""
        if task_id not in self._watched or isinstance(event, TaskArtifactUpdateEvent):
            return
        if event.status.state in SETTLED_STATES:
            self._due.add(task_id)
            self._wake.set()

    def watch(self, task_id: str) -> None:
        """``task_id`` has a new config: note its events, and queue a state it already has."""
        self._watched.add(task_id)
        self._recent.add(task_id)
        self._due.add(task_id)
        self._wake.set()

    def count(self, outcome: PushOutcome, n: int = 1) -> None:
        if self._metrics is not None and n:
            self._metrics.push_delivery(outcome, n)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker; its first pass queues and sends whatever the previous process left
        (or never queued)."""
        if self._worker is not None:
            return
        self._worker = asyncio.create_task(self._run(), name="mesh-push-outbox")

    def _client(self) -> httpx.AsyncClient:
        """The guarded client, opened at the first delivery: most nodes never send one, and
        its transport (httpcore, h11: ~7 ms) is not loaded before (issue 19 item 5)."""
        if self._http is None:
            from mesh._netguard import create_http_client

            self._http = create_http_client(
                self.policy,
                timeout=httpx.Timeout(self._timeout_s, connect=min(5.0, self._timeout_s)),
                limits=httpx.Limits(
                    max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY
                ),
            )
        return self._http

    async def aclose(self) -> None:
        """Stop the worker and the deliveries in flight (their rows stay claimed until the
        claim ends, then are sent again: by the next process if this one is stopping)."""
        worker, self._worker = self._worker, None
        tasks = [t for t in (worker, *self._inflight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._inflight.clear()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- the worker ----------------------------------------------------------------------------
    async def _run(self) -> None:
        everything = True  # the first pass looks at every open config
        while True:
            try:
                await self._pass(everything)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A database error must not end deliveries for good: the rows wait on disk.
                log.exception("push outbox pass failed; retrying in %.0fs", SWEEP_S)
                self._next_due = self._clock() + SWEEP_S
            everything = False
            timeout = self._sleep_s()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()

    def _sleep_s(self) -> float | None:
        now = self._clock()
        wakes = [self._next_sweep] if self._watched or self._shared else []
        if self._next_due is not None:
            wakes.append(self._next_due)
        return max(0.0, min(wakes) - now) if wakes else None

    async def _pass(self, everything: bool) -> None:
        now = self._clock()
        sweep = everything or ((bool(self._watched) or self._shared) and now >= self._next_sweep)
        due, self._due = self._due, set()
        expires = now + self._retry_for_s
        if sweep:
            self._recent = set()
            self._next_sweep = now + SWEEP_S
            finished, still_open = await self._db.write(
                lambda conn: queue_settled(conn, None, now, expires)
            )
            self._watched = still_open | self._recent
        elif due:
            finished, _ = await self._db.write(lambda conn: queue_settled(conn, due, now, expires))
            self._watched -= finished - self._recent
        free = CONCURRENCY - len(self._inflight)
        if free <= 0:
            self._next_due = None  # a delivery that ends wakes the worker
            return
        # Past the attempt's own deadline: a process killed mid-POST leaves it due soon after.
        claim_until = now + self._timeout_s + 1.0
        limit = min(free, _CLAIM_BATCH)
        claimed = await self._db.write(lambda conn: claim(conn, now, limit, claim_until))
        self.count("dropped", claimed.dropped)
        self.count("expired", claimed.expired)
        if claimed.expired:
            log.warning(
                "%d push notification(s) given up after %.0fs of failed attempts",
                claimed.expired,
                self._retry_for_s,
            )
        if self._metrics is not None:
            self._metrics.push_pending.labels(self._metrics.agent).set(claimed.pending)
        self._next_due = claimed.next_at
        for delivery in claimed.deliveries:
            task = asyncio.create_task(self._deliver(delivery), name="mesh-push-delivery")
            self._inflight.add(task)
            task.add_done_callback(self._delivered)

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("push delivery crashed", exc_info=task.exception())
        self._wake.set()

    async def _deliver(self, d: Delivery) -> None:
        from mesh._netguard import AddressRefused

        http = self._client()
        config = d.config
        headers = {"Content-Type": "application/json"}
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        auth = config.authentication
        if config.HasField("authentication") and auth.scheme and auth.credentials:
            headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        error = ""
        try:
            # One deadline for the whole exchange; the answer's body is never read.
            async with asyncio.timeout(self._timeout_s):
                async with http.stream(
                    "POST", config.url, content=d.body, headers=headers
                ) as response:
                    status = response.status_code
            if 200 <= status < 300:
                await self._settle(d, delivered=True)
                self.count("delivered")
                return
            error = f"HTTP {status}"
        except TimeoutError:
            error = f"no answer within {self._timeout_s:g}s"
        except httpx.HTTPError as exc:
            if isinstance(exc.__cause__, AddressRefused):
                # Allowed when the config was set, refused now: the name resolves elsewhere.
                log.warning("push notification for task %s not sent: %s", d.task_id, exc.__cause__)
                await self._settle(d, delivered=True)
                self.count("refused")
                return
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except (httpx.InvalidURL, ValueError) as exc:  # not an HTTPError: a URL httpx refuses
            error = f"{type(exc).__name__}: {exc}"
        await self._settle(d, delivered=False, error=error)

    async def _settle(self, d: Delivery, *, delivered: bool, error: str = "") -> None:
        """Delete a row that was sent (or refused), or schedule its next attempt; either only
        if no newer state replaced its body meanwhile."""
        if delivered:
            await self._db.write(lambda conn: delete_sent(conn, d))
            return
        now = self._clock()
        from tenacity import AsyncRetrying, RetryCallState, wait_exponential

        if self._retrying is None:
            first, most = self._backoff
            self._retrying = AsyncRetrying(wait=wait_exponential(multiplier=first, max=most))
        retry = RetryCallState(self._retrying, fn=None, args=(), kwargs={})
        retry.attempt_number = d.attempts
        next_at = min(now + self._retrying.wait(retry), d.expires_at)
        log.info(
            "push notification for task %s failed (attempt %d: %s); next try in %.1fs",
            d.task_id,
            d.attempts,
            error,
            next_at - now,
        )
        await self._db.write(lambda conn: reschedule(conn, d, next_at, error))
        self.count("failed")


@dataclass(frozen=True)
class PushParts:
    """A node's push notifications: the config store, the outbox and the URL check the request
    handler is built with.

        push = await PushParts.open(db, NetworkPolicy.parse("public"), metrics=metrics)
        await push.outbox.start()      # in the lifespan ...
        await push.outbox.aclose()     # ... and at its end
    """

    configs: PushConfigStore
    outbox: PushOutbox
    check: PushUrlCheck

    @classmethod
    async def open(
        cls,
        db: Database,
        policy: NetworkPolicy,
        *,
        metrics: NodeMetrics | None = None,
        **outbox_options: Any,
    ) -> PushParts:
        """Create the tables (``Database.migrate``, component ``push``) and the parts; the
        outbox is not started."""
        outbox = PushOutbox(db, policy, metrics=metrics, **outbox_options)
        configs = PushConfigStore(db, outbox)
        await configs.initialize()
        return cls(configs, outbox, PushUrlCheck(policy))

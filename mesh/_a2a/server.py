"""``A2AService``: the A2A side of a node (card route, JSON-RPC route, handler, task store).

Built inside the node's lifespan, because the store needs the open database:

    service = await A2AService.create(agent, url=..., db=db, runner=runner, metrics=metrics)
    service.mount(app)                 # GET /.well-known/agent-card.json, POST / (JSON-RPC)
    ...
    await service.drain(20)    # wait for in-flight tasks; past 20 s they end FAILED (shutdown)
    await service.aclose()

``create`` first ends the tasks the previous process left unfinished (FAILED, reason
``interrupted``: it crashed or was killed while they ran), before any request is served. With the
SQLite store it also serves A2A push notifications (``mesh._a2a.push``): the card says
``capabilities.pushNotifications``, and the outbox's worker runs from ``create`` to ``aclose``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from a2a.server.routes import (
    add_a2a_routes_to_fastapi,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import AgentCard

from mesh._a2a.card import CARD_CACHE_CONTROL, build_card
from mesh._a2a.dispatcher import SkillDispatcher, TurnRunner
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.fastroute import FastRoute
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.push import PushParts
from mesh._a2a.store import Recovery, SqliteTaskStore
from mesh._a2a.waits import WaitStore
from mesh._agent import Agent
from mesh._metrics import NodeMetrics
from mesh._netpolicy import NetworkPolicy
from mesh._settings import NodeSettings
from mesh._sqlite import Database

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["METHODS", "SEND_METHODS", "STOP_WAIT_S", "A2AService"]

log = logging.getLogger("mesh._a2a")

#: Every JSON-RPC method the SDK's route answers: the closed set of the request metrics' method
#: label (mesh._gate).
METHODS = frozenset(JsonRpcDispatcher.METHOD_TO_MODEL)
#: JSON-RPC methods that start work (refused while a node drains).
SEND_METHODS = frozenset({"SendMessage", "SendStreamingMessage"})
#: How long a drain waits, once the grace ran out, for the cut tasks to write their end.
STOP_WAIT_S = 5.0


class A2AService:
    """Handler, executor and stores of one node. ``store`` is its SQLite task store (None for
    the in-memory benchmark baseline, ``create(store="memory")``)."""

    def __init__(
        self,
        agent: Agent,
        url: str,
        executor: MeshExecutor,
        handler: MeshRequestHandler,
        card: AgentCard,
        *,
        store: SqliteTaskStore | None = None,
        push: PushParts | None = None,
    ) -> None:
        self.agent = agent
        self.url = url
        self.executor = executor
        self.handler = handler
        self.card = card
        self.store = store
        #: Push notification configs and their outbox (None with the in-memory store).
        self.push = push
        #: The gate's way to the fast path for a body it parsed (see mesh._a2a.fastroute); None
        #: when the handler has no fast path.
        self.fastroute: FastRoute | None = None
        if handler.fastpath is not None:
            self.fastroute = FastRoute(handler, handler.fastpath)

    @classmethod
    async def create(
        cls,
        agent: Agent,
        *,
        url: str,
        db: Database,
        runner: TurnRunner | None = None,
        skill_runners: dict[str, TurnRunner] | None = None,
        metrics: NodeMetrics | None = None,
        store: str = "sqlite",
        bearer: bool = False,
        fastpath: bool = True,
        max_text_bytes: int = NodeSettings.max_text_bytes,
        push_networks: NetworkPolicy | None = None,
    ) -> A2AService:
        """``push_networks``: where push notification webhooks may be (None: public addresses
        only, a2a-sdk's rule; ``NodeSettings.push_policy``)."""
        task_store: TaskStore
        sqlite_store: SqliteTaskStore | None = None
        if store == "memory":
            # Benchmark baseline only: tasks and idempotency keys die with the process.
            task_store = InMemoryTaskStore()
            keys = IdempotencyKeys(None)
        else:
            sqlite_store = SqliteTaskStore(db)
            await sqlite_store.initialize()
            task_store = sqlite_store
            keys = IdempotencyKeys(db, store=sqlite_store)
        await keys.initialize()
        recovery = None
        if sqlite_store is not None:
            # The one recovery rule (docs/node.md): interrupted, deadline, waiting, run again.
            recovery = await sqlite_store.recover(then=IdempotencyKeys.release_ended)
            if recovery.ended:
                log.warning(
                    "%d task(s) were still running when this node last stopped: ended FAILED "
                    "(interrupted); sending their message again runs them",
                    len(recovery.ended),
                )
        executor = MeshExecutor(
            SkillDispatcher(agent, runner, skill_runners),
            keys=keys,
            metrics=metrics,
            max_text_bytes=max_text_bytes,
            waits=WaitStore(db) if sqlite_store is not None else None,
        )
        card = build_card(agent, url, bearer=bearer)
        push: PushParts | None = None
        if sqlite_store is not None:
            # Configs and deliveries are durable only with a durable store.
            push = await PushParts.open(
                db, push_networks or NetworkPolicy.parse("public"), metrics=metrics
            )
            card.capabilities.push_notifications = True
        handler = MeshRequestHandler(
            executor=executor,
            task_store=task_store,
            agent_card=card,
            keys=keys,
            fastpath=fastpath,
            push=push,
        )
        if push is not None:
            await push.outbox.start()
        if recovery is not None:
            _pick_up(recovery, handler)
        return cls(agent, url, executor, handler, card, store=sqlite_store, push=push)

    def mount(self, app: FastAPI) -> None:
        add_a2a_routes_to_fastapi(
            app,
            agent_card_routes=create_agent_card_routes(self.card, cache_control=CARD_CACHE_CONTROL),
            jsonrpc_routes=create_jsonrpc_routes(self.handler, rpc_url="/"),
        )

    @property
    def in_flight(self) -> int:
        return self.executor.in_flight

    async def drain(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for running tasks to finish. Past that, end the ones left
        FAILED (reason ``shutdown``): their callers get that answer, and their end is saved
        (waits up to ``STOP_WAIT_S`` more for it). True when every task finished."""
        if await self.executor.wait_idle(seconds):
            return True
        cut = self.executor.stop()
        log.warning("grace period over: ending %d task(s) FAILED (shutdown)", cut)
        if not await self.executor.wait_idle(STOP_WAIT_S):
            log.warning("%d task(s) did not stop in time", self.executor.in_flight)
        return False

    async def aclose(self) -> None:
        """Stop the handler (cancels whatever still runs), then write any task still in
        flight FAILED (reason ``shutdown``); stop the push outbox (what it has not delivered
        stays queued on disk for the next start)."""
        if self.push is not None:
            await self.push.outbox.aclose()
        await self.handler.aclose()
        if self.store is not None:
            ended = await self.store.end_in_flight(then=IdempotencyKeys.release_ended)
            if ended:
                log.warning("%d unfinished task(s) saved as FAILED (shutdown)", len(ended))


def _pick_up(recovery: Recovery, handler: MeshRequestHandler) -> None:
    """Arm the deadlines of the tasks still waiting, and run again the ones that were resuming
    (in the background, owned by the handler's clock)."""
    clock = handler.executor.clock
    for owner, task_id, context_id, deadline in recovery.waiting:
        clock.arm(owner, task_id, context_id, deadline)
    for owner, task_id, context_id in recovery.resume:
        clock.spawn(
            handler.resume(owner, task_id, context_id, "restart"), name=f"mesh-resume-{task_id}"
        )
    for turn in recovery.expired_turns:  # rule 2: their children are canceled too
        clock.spawn(handler.executor.cancel_children(turn), name="mesh-cancel-children")
    if recovery.expired:
        log.warning(
            "%d waiting task(s) passed their deadline while this node was stopped: ended FAILED "
            "(deadline)",
            len(recovery.expired),
        )
    if recovery.resume:
        log.info(
            "%d task(s) were resuming when this node stopped: running them again",
            len(recovery.resume),
        )

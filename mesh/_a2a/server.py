"""``A2AService``: the A2A side of a node (card route, JSON-RPC route, handler, task store).

Built inside the node's lifespan, because the store needs the open database:

    service = await A2AService.create(agent, url=..., db=db, runner=runner, metrics=metrics)
    service.mount(app)    # GET /.well-known/agent-card.json, POST / (JSON-RPC), /a2a/rest/...
    ...
    await service.drain(20)    # wait for in-flight tasks; past 20 s they end FAILED (shutdown)
    await service.aclose()

``create`` first ends the tasks the previous process left unfinished (FAILED, reason
``interrupted``: it crashed or was killed while they ran), before any request is served. With the
SQLite store it also serves A2A push notifications (``mesh._a2a.push``): the card says
``capabilities.pushNotifications``, and the outbox's worker runs from ``create`` to ``aclose``.

Two A2A bindings on the same handler: JSON-RPC at ``POST /`` and HTTP+JSON (REST) under
``REST_PREFIX`` (``/a2a/rest/message:send``, ``/a2a/rest/tasks/{id}``...), both in the card's
``supportedInterfaces``, JSON-RPC first. The SDK's REST routes come without their ``/{tenant}``
mount (a node serves one agent, no tenants; the mount would catch every ``/x/...`` path), and a
path under the prefix that is no REST method gets the binding's ``MethodNotFoundError`` (404,
``METHOD_NOT_FOUND``) instead of Starlette's plain 404/405. The card is served per origin
(``mesh._a2a.card_route``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, cast

from a2a.server.routes import (
    add_a2a_routes_to_fastapi,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import AgentCard
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import InvalidParamsError, InvalidRequestError, MethodNotFoundError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from mesh._a2a.card import REST_PREFIX, build_card
from mesh._a2a.card_route import CardRoute
from mesh._a2a.dispatcher import SkillDispatcher, TurnRunner
from mesh._a2a.executor import LOGGED_FAILURE, MeshExecutor
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
    # With keys only: a node without them never imports PyJWT (tests/test_import_cost.py).
    from fastapi import FastAPI

    from mesh._a2a.signing import CardSigner

__all__ = [
    "METHODS",
    "REST_METHODS",
    "REST_PREFIX",
    "SEND_METHODS",
    "STOP_WAIT_S",
    "A2AService",
    "rest_invalid",
    "rest_method",
]

log = logging.getLogger("mesh._a2a")

#: The SDK's loggers of the error a route answers with (JSON-RPC's stream, REST's send and
#: stream): each logs it once more, a line of its own.
_ROUTE_LOGGERS = ("a2a.server.routes.jsonrpc_dispatcher", "a2a.utils.error_handlers")


class _LoggedOnce(logging.Filter):
    """Drops a route's line for a direct reply's failure that this request logged already
    with its traceback (``LOGGED_FAILURE``, set in the request's task): a failure is logged
    once, by mesh. Every other record of those loggers goes through."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = LOGGED_FAILURE.get()
        return (
            text is None
            or record.levelno != logging.ERROR
            or not isinstance(record.args, tuple)
            or text not in record.args
        )


_LOGGED_ONCE = _LoggedOnce()


def _log_failures_once() -> None:
    """Put ``_LoggedOnce`` on the route loggers (once per process: several nodes may mount)."""
    for name in _ROUTE_LOGGERS:
        logger = logging.getLogger(name)
        if _LOGGED_ONCE not in logger.filters:
            logger.addFilter(_LOGGED_ONCE)


#: Every JSON-RPC method the SDK's route answers: the closed set of the request metrics' method
#: label (mesh._gate).
METHODS = frozenset(JsonRpcDispatcher.METHOD_TO_MODEL)
#: The REST methods, as the request metrics' method label names them: the HTTP method and the
#: path template under ``REST_PREFIX`` (``POST /message:send``), in the SDK's route order (a
#: path matches the first template whose method fits, as Starlette routes it).
_REST_TEMPLATES = (
    ("POST", "/message:send"),
    ("POST", "/message:stream"),
    ("POST", "/tasks/{id}:cancel"),
    ("GET", "/tasks/{id}:subscribe"),
    ("POST", "/tasks/{id}:subscribe"),
    ("GET", "/tasks/{id}"),
    ("GET", "/tasks/{id}/pushNotificationConfigs/{push_id}"),
    ("DELETE", "/tasks/{id}/pushNotificationConfigs/{push_id}"),
    ("POST", "/tasks/{id}/pushNotificationConfigs"),
    ("GET", "/tasks/{id}/pushNotificationConfigs"),
    ("GET", "/tasks"),
    ("GET", "/extendedAgentCard"),
)
_REST_PATTERNS = tuple(
    (
        verb,
        re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template)) + "$"),
        f"{verb} {template}",
    )
    for verb, template in _REST_TEMPLATES
)
REST_METHODS = frozenset(label for _, _, label in _REST_PATTERNS)
#: Methods that start work (refused while a node drains), on either binding.
SEND_METHODS = frozenset(
    {"SendMessage", "SendStreamingMessage", "POST /message:send", "POST /message:stream"}
)
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
        metrics: NodeMetrics | None = None,
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
            self.fastroute = FastRoute(handler, handler.fastpath, metrics)

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
        service = cls(
            agent, url, executor, handler, card, store=sqlite_store, push=push, metrics=metrics
        )
        if sqlite_store is not None and sqlite_store.shared:
            # Replicas on one PostgreSQL: live progress to and from the others.
            from mesh._a2a.task_feed import TaskFeed

            feed = await TaskFeed.open(db, cast(Any, db)._url)  # a PgDatabase's
            feed.live_state = sqlite_store.live_state
            sqlite_store.feed = feed
            executor.followers.remote = feed
        return service

    def mount(
        self, app: FastAPI, *, fixed_url: bool = False, signer: CardSigner | None = None
    ) -> None:
        """Add the card, JSON-RPC and REST routes to ``app``, after the routes it has (they
        keep winning). ``fixed_url``: the card always names ``url`` (``MESH_PUBLIC_URL`` is
        set) instead of following the caller's loopback origin. ``signer``: the card is
        signed (the node has keys)."""
        route = CardRoute(self.card, self.url, fixed=fixed_url, signer=signer)
        app.router.routes.append(route.route())
        _log_failures_once()
        rest = [
            r
            for r in create_rest_routes(self.handler, path_prefix=REST_PREFIX)
            if not isinstance(r, Mount)  # the /{tenant} mount: no tenants here
        ]
        add_a2a_routes_to_fastapi(
            app,
            jsonrpc_routes=create_jsonrpc_routes(self.handler, rpc_url="/"),
            rest_routes=rest,
        )
        app.router.routes.append(
            Route(REST_PREFIX + "/{path:path}", _no_such_rest_method, methods=_EVERY_VERB)
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
            if self.store.feed is not None:
                await self.store.feed.aclose()


_EVERY_VERB = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def rest_method(verb: str, path: str) -> str | None:
    """The REST method (a ``REST_METHODS`` label) a request for ``path`` (under
    ``REST_PREFIX``) with HTTP method ``verb`` calls, or None when it calls none."""
    if verb == "HEAD":
        verb = "GET"
    for method, pattern, label in _REST_PATTERNS:
        if method == verb and pattern.match(path):
            return label
    return None


def rest_invalid(message: str, *, params: bool) -> bytes:
    """The HTTP+JSON binding's 400 body for a request body refused as ``message``, with the A2A
    reason (``INVALID_PARAMS`` when ``params``, else ``INVALID_REQUEST``) a client maps to its
    error, as for the SDK's own refusals."""
    error = InvalidParamsError(message) if params else InvalidRequestError(message)
    return json.dumps(build_rest_error_payload(error)).encode()


async def _no_such_rest_method(request: Request) -> Response:
    """The HTTP+JSON binding's answer for a path or HTTP method it does not define."""
    path = request.url.path.removeprefix(REST_PREFIX)
    error = MethodNotFoundError(
        message=f"no A2A method is '{request.method} {path}' on the HTTP+JSON binding; the "
        f"methods are {', '.join(label for _, _, label in _REST_PATTERNS)} (under {REST_PREFIX})"
    )
    payload = build_rest_error_payload(error)
    return JSONResponse(payload, status_code=int(payload["error"]["code"]))


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

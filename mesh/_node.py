"""``Node``: one agent, one process: the FastAPI app, its lifespan, and its drain.

    node = Node(agent, settings)
    app = node.app          # serve with uvicorn; `mesh serve` does this

Routes: ``/.well-known/agent-card.json``, ``POST /`` (A2A JSON-RPC) and ``/a2a/rest/...`` (A2A
HTTP+JSON), from ``mesh._a2a``,
``/health``, ``/metrics``, ``/introspect``, ``/v1/traces/{trace_id}/tasks`` (the tasks of one trace
on this node: ``mesh._a2a.traces``). Everything holding a connection (the database, the
runner's model, the registrar) is opened in the lifespan and closed when it ends.

Stopping (``drain``, run on SIGTERM by ``mesh serve``): the node deregisters, answers new
``SendMessage`` calls with 503, waits up to ``settings.grace_seconds`` for in-flight tasks;
past that, the tasks still running end FAILED (reason ``shutdown``) and their callers get that
answer; then the server stops and the lifespan closes the stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from mesh import __version__
from mesh._a2a.server import A2AService
from mesh._agent import Agent
from mesh._errors import ConfigError
from mesh._gate import METHODS, GatedApp, RequestGate
from mesh._health import Health
from mesh._inflight import InFlight
from mesh._introspect import introspect
from mesh._keys import AgentKeys
from mesh._metrics import NodeMetrics, render
from mesh._models import check_model_choice
from mesh._models.base import Model
from mesh._settings import DEFAULT_REGISTRY_URL, NodeSettings
from mesh._sqlite import Database
from mesh._stats import NodeStats
from mesh._trust import PLAIN_HTTP_NETWORKS, PeerTrust

__all__ = ["Node", "create_app"]

log = logging.getLogger("mesh._node")

#: Seconds a drain waits, once every task has ended, for their answers to be sent.
ANSWER_WAIT_S = 5.0

#: Connections of the node's shared peer HTTP client (all peers together), see _bind_toolsets.
PEER_CONNECTIONS = 16


class Node:
    """One agent served over A2A. Build it, then serve ``node.app``."""

    def __init__(
        self,
        agent: Agent,
        settings: NodeSettings,
        *,
        registry: CollectorRegistry | None = None,
        model: Model | None = None,
    ) -> None:
        self.agent = agent
        self.settings = settings
        # A node beyond loopback (or one told MESH_REQUIRE_MODEL=1) runs a named model for
        # real or not at all: refused here, before it listens, not found out from its answers.
        self.models = settings.models.model_copy(update={"require": settings.model_required})
        if agent.is_llm and model is None:
            check_model_choice(agent, self.models)
        # Signed cards (MESH_KEYS): read and checked before the node listens, a bad folder
        # stops the start saying what to fix. Only the private key object lives here, never
        # in a log, a card, /introspect or a metric.
        self.keys = AgentKeys.load(settings.keys, agent.name) if settings.keys else None
        # The call policy's rules for this agent (MESH_ALLOW): a rule naming a skill it does
        # not have stops the start (a typo would refuse every call it meant to allow).
        self.policy = settings.policy.for_agent(agent.name) if settings.policy else None
        if self.policy is not None:
            self.policy.check(agent.name, (s.id for s in agent.all_skills))
        self.registry = registry or CollectorRegistry()
        # Label values are closed sets: callers choose methods and skill ids (see mesh._metrics).
        self.metrics = NodeMetrics(
            self.registry,
            agent.name,
            version=agent.version,
            skills=[s.id for s in agent.all_skills],
            methods=METHODS,
        )
        # The window figures the registry gathers with its probe (/health?stats=1).
        self.stats = NodeStats(self.metrics, prices=self.models.prices)
        self.instance_id = f"{agent.name}-{uuid.uuid4().hex[:8]}"
        self.health = Health(agent.name, agent.version, self.instance_id)
        self.draining = False
        #: A2A exchanges (POST /) whose answer is not sent yet (counted by the request gate).
        self.exchanges = InFlight()
        self._drain: asyncio.Future[bool] | None = None
        self.model: Model | None = model
        self.service: A2AService | None = None
        self._db: Database | None = None
        self._registrar: Any = None
        self._retention: Any = None  # mesh._retention.Sweeper, in the lifespan
        # (httpx client, DiscoveryClient) shared by the agent's remote toolsets.
        self._shared: tuple[Any, Any] | None = None
        self.app = self._build_app()

    # -- lifecycle ------------------------------------------------------------------------
    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # A drain and its waits belong to one run (one event loop).
        self._drain = None
        self.exchanges = InFlight()
        db = await _open_store(self.settings, self.registry, self.agent.name)
        self._db = db
        sweeper: asyncio.Task[None] | None = None
        runner: Any = None
        skill_runners: dict[str, Any] = {}
        try:
            self.health.add_check("database", lambda: _db_check(db))
            await self._bind_toolsets()  # before the runners: they run the node's own copies
            if self.agent.is_llm:
                runner, skill_runners = self._build_runners(db)
                self.model = runner.model
            self.health.add_check("model", self._model_check)
            self.service = await A2AService.create(
                self.agent,
                url=self.settings.url,
                db=db,
                runner=runner,
                skill_runners=skill_runners,
                metrics=self.metrics,
                store=self.settings.store,
                bearer=self.settings.token is not None,
                fastpath=self.settings.fastpath,
                max_text_bytes=self.settings.max_text_bytes,
                push_networks=self.settings.push_policy,
            )
            # After the node's own routes (they keep winning over the A2A ones).
            signer = None
            if self.keys is not None:
                from mesh._a2a.signing import CardSigner

                signer = CardSigner(self.keys)
                log.info(
                    "card signed with key %s, certified by the mesh root %s",
                    self.keys.kid,
                    self.keys.root.kid,
                )
            self.service.mount(app, fixed_url=bool(self.settings.public_url), signer=signer)
            if self.settings.store_url is not None and self.service.store is not None:
                sweeper = await self._start_sweeper(self.service.store)
            self._retention = self._start_retention(db, runner)
            await self._start_registrar()
            self.health.phase = "ready"
            log.info(
                "%s %s serving at %s (data %s, store %s)",
                self.agent.name,
                self.agent.version,
                self.settings.url,
                self.settings.data_dir,
                self.settings.store,
            )
            yield
        finally:
            await self.drain()
            if self._retention is not None:
                await self._retention.aclose()
                self._retention = None
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            if self.service is not None:
                await self.service.aclose()
            if runner is not None:
                await runner.aclose()
            await self._close_toolsets()
            self._db = None
            await db.aclose()
            log.info("%s stopped", self.agent.name)

    async def _start_sweeper(self, store: Any) -> asyncio.Task[None]:
        """Replicas on one database: this one's heartbeat, the end of the tasks of a replica
        not seen for a lease (``SqliteTaskStore.sweep``), and the waiting tasks past their
        deadline and resuming tasks such a replica left (``take_over``), every third of it."""
        from mesh._a2a.idempotency import IdempotencyKeys
        from mesh._a2a.server import _pick_up

        store.runner = self.instance_id
        lease = self.settings.replica_lease_s
        await store.sweep(lease, IdempotencyKeys.release_ended)  # before any task runs here

        async def sweep_forever() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                try:
                    ended = await store.sweep(lease, IdempotencyKeys.release_ended)
                    # What a dead replica left waiting past its deadline, or resuming.
                    taken = await store.take_over(lease)
                except Exception as exc:  # the database away for a moment: next round
                    log.warning("replica sweep failed: %s", exc)
                    continue
                if self.service is not None and (taken.waiting or taken.resume):
                    _pick_up(taken, self.service.handler)
                if ended:
                    log.warning(
                        "ended %d task(s) FAILED interrupted: their replica was not seen for "
                        "%.0f s",
                        len(ended),
                        lease,
                    )

        return asyncio.get_running_loop().create_task(sweep_forever(), name="mesh-replica-sweep")

    def _start_retention(self, db: Database, runner: Any) -> Any:
        """The retention sweeper (``mesh._retention``): old terminal tasks and idle sessions
        leave ``node.db``, in small writes between the requests' own."""
        from mesh._retention import RetentionPolicy, Sweeper

        assert self.service is not None
        sweeper = Sweeper(
            RetentionPolicy.from_settings(self.settings),
            db,
            tasks=self.service.store,
            sessions=runner.sessions if runner is not None else None,
            in_use=runner.locks.busy if runner is not None else None,
            registry=self.registry,
            agent=self.agent.name,
        )
        sweeper.start()
        return sweeper

    def _build_runners(self, db: Database) -> tuple[Any, dict[str, Any]]:
        """The chat runner, and one runner per LLM typed skill (same model, same sessions)."""
        from mesh._a2a.dispatcher import skill_agent
        from mesh._runner import Runner, SessionLocks
        from mesh._sessions.sqlite import SqliteSessionStore

        sessions = SqliteSessionStore(db)
        # One lock set: a chat turn and a typed-skill turn on the same context (session) wait
        # for each other instead of interleaving their events.
        locks = SessionLocks()
        runner = Runner(
            self.agent,
            sessions=sessions,
            model=self.model,
            observer=self.metrics,
            env=self.models,
            locks=locks,
        )
        per_skill = {
            s.id: Runner(
                skill_agent(self.agent, s),
                sessions=sessions,
                model=runner.model,
                observer=self.metrics,
                env=self.models,
                locks=locks,
            )
            for s in self.agent.skills
            if s.typed and s.llm
        }
        return runner, per_skill

    async def _start_registrar(self) -> None:
        if not (self.settings.consul or self.settings.registry):
            return
        location, token = self._discovery_location()
        from mesh._discovery import create_backend
        from mesh._discovery.base import Registration
        from mesh._discovery.registrar import Registrar

        backend = create_backend(location, token=token, consul_tls=self.settings.consul_tls)
        registration = Registration(
            instance_id=self.instance_id,
            agent=self.agent.name,
            url=self.settings.url,
            version=self.agent.version,
            skills=tuple(s.id for s in self.agent.all_skills),
            tags=tuple(self.agent.tags),
        )

        def use_instance_id(instance_id: str) -> None:
            # Our id was taken while we were away: /health, /introspect and the registry's
            # check that the process at our URL is the one registering all go by the new one.
            self.instance_id = instance_id
            self.health.instance_id = instance_id

        registrar = Registrar(backend, registration, on_new_instance_id=use_instance_id)
        self._registrar = (registrar, backend)
        await registrar.start()

    def _discovery_location(self) -> tuple[str, str | None]:
        """Where this node registers, and where its remote tools look peers up."""
        if self.settings.consul:
            return self.settings.consul, self.settings.consul_token
        return self.settings.registry or DEFAULT_REGISTRY_URL, self.settings.registry_token

    async def _bind_toolsets(self) -> None:
        """Run the node's own copies of the agent's remote toolsets (the ``Agent`` it was given
        stays configuration: ``self.agent`` becomes a copy holding them), bound to the node's
        shared HTTP client, discovery client, metrics and peer checks, so every peer call shares
        one connection pool, is counted, and carries the mesh token only to verified members of
        the mesh (``mesh._trust``)."""
        if not any(hasattr(t, "bind") for t in self.agent.tools):
            return
        import dataclasses

        import httpx

        from mesh._discovery import create_backend
        from mesh._discovery.client import DiscoveryClient
        from mesh._netguard import create_http_client

        tools = [t.copy() if hasattr(t, "bind") else t for t in self.agent.tools]
        self.agent = dataclasses.replace(self.agent, tools=tools)
        bindable = [t for t in tools if hasattr(t, "bind")]
        location, token = self._discovery_location()
        longest = max(float(getattr(t, "deadline_s", 30.0)) for t in bindable)
        # One token per mesh: the node presents the token it requires of its own callers.
        networks = self.settings.peer_policy
        verifier = identity = None
        if self.keys is not None:
            from mesh._a2a.signing import verify_card
            from mesh._identity import CallerIdentity

            root = self.keys.root

            def verifier(card: Any) -> str:
                return verify_card(card, root)

            # Verified peers get this node's own call token, not the shared mesh token.
            identity = CallerIdentity(self.keys).token
        trust = PeerTrust(
            token=self.settings.token, networks=networks, verifier=verifier, identity=identity
        )
        # Connections only to addresses PeerTrust would admit, checked as each one is made:
        # its verdict lasts ttl_s, a DNS answer may not. Bounded pool, every connection kept
        # alive: httpcore scans each pooled connection on every request (O(pool) per call),
        # so past what a peer can serve in parallel more connections only cost CPU; a call
        # beyond the cap waits for a free connection. No token here: a peer gets it per
        # call, once verified.
        http = create_http_client(
            networks,
            timeout=httpx.Timeout(longest + 5.0, connect=2.0),
            limits=httpx.Limits(
                max_connections=PEER_CONNECTIONS, max_keepalive_connections=PEER_CONNECTIONS
            ),
            plain_http=PLAIN_HTTP_NETWORKS if self.settings.token or self.keys else None,
        )
        discovery = DiscoveryClient(
            create_backend(location, token=token, consul_tls=self.settings.consul_tls)
        )
        self._shared = (http, discovery)
        for toolset in bindable:
            toolset.bind(
                discovery=discovery,
                http=http,
                metrics=self.metrics,
                caller=self.agent.name,
                trust=trust,
                max_answer_bytes=self.settings.max_answer_bytes,
            )

    async def _close_toolsets(self) -> None:
        """Close the node's copies (``_bind_toolsets``), then the clients they shared."""
        for toolset in self.agent.tools:
            if hasattr(toolset, "bind") and hasattr(toolset, "aclose"):
                await toolset.aclose()
        if self._shared is not None:
            http, discovery = self._shared
            self._shared = None
            await discovery.aclose()
            await http.aclose()

    async def _stop_registrar(self) -> None:
        if self._registrar is None:
            return
        registrar, backend = self._registrar
        self._registrar = None
        await registrar.aclose()
        await backend.aclose()

    async def drain(self) -> bool:
        """Stop taking tasks, deregister, wait for in-flight ones (bounded); past the grace
        they end FAILED (shutdown). Runs once: a second call waits for the first one."""
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_once())
        return await asyncio.shield(self._drain)

    async def _drain_once(self) -> bool:
        self.draining = True
        self.health.phase = "stopping"
        await self._stop_registrar()
        if self.service is None:
            return True
        if self.service.in_flight:
            log.info(
                "draining: waiting up to %.0fs for %d task(s)",
                self.settings.grace_seconds,
                self.service.in_flight,
            )
        idle = await self.service.drain(self.settings.grace_seconds)
        # Every task has ended; let their answers (a blocking reply, a stream's final event)
        # reach the callers before the server is told to exit, which cuts open streams.
        if not await self.exchanges.wait_idle(ANSWER_WAIT_S):
            log.warning("%d answer(s) still unsent when stopping", self.exchanges.count)
        return idle

    # -- routes ---------------------------------------------------------------------------
    async def _model_check(self) -> tuple[bool, str]:
        if not self.agent.is_llm:
            return True, "no model (function skills only)"
        if self.model is None:
            return False, "model not configured"
        from mesh._models.scripted import ScriptedModel  # LLM nodes only: typed ones skip it

        if isinstance(self.model, ScriptedModel):
            # Canned answers: fine when chosen or on loopback, never when a real model was
            # required (the start refuses that; this keeps /health honest regardless).
            return not self.models.require or self.models.offline, "scripted (offline)"
        described = self.model.describe()
        return True, f"{described.get('kind', 'model')} {described.get('name', '')}".strip()

    def _runtime(self) -> dict[str, Any]:
        return {
            "mesh_version": __version__,
            "uptime_s": self.health.uptime_s,
            "url": self.settings.url,
            "data_dir": str(self.settings.data_dir),
            "store": self.settings.store,
            "instance_id": self.instance_id,
            "in_flight": self.service.in_flight if self.service else 0,
            "draining": self.draining,
            "retention": self._retention.describe() if self._retention is not None else None,
        }

    def _build_app(self) -> FastAPI:
        app = GatedApp(
            title=f"mesh node: {self.agent.name}",
            version=self.agent.version,
            lifespan=self._lifespan,
            docs_url=None,
            redoc_url=None,
        )

        @app.get("/health")
        async def health(request: Request) -> JSONResponse:
            status, body = await self.health.report()
            # Read by hand, never validated: a health check must not fail on its query.
            if request.query_params.get("stats") == "1":
                body["stats"] = self.stats.report(
                    peers=[str(t.peer) for t in self.agent.tools if hasattr(t, "bind")],
                    in_flight=self.service.in_flight if self.service else 0,
                )
            return JSONResponse(body, status_code=status)

        @app.get("/metrics")
        async def metrics(request: Request) -> Response:
            # Off the event loop: rendering is CPU work that grows with the series.
            body, content_type = await run_in_threadpool(
                render, self.registry, request.headers.get("accept")
            )
            return Response(body, headers={"Content-Type": content_type})

        # The id read from the path by hand: a typed parameter makes FastAPI import pydantic.v1
        # to check its annotation (~15 ms of the node's start, issue 19 item 5).
        @app.get("/v1/traces/{trace_id}/tasks")
        async def trace_tasks(request: Request) -> Response:
            return await self._trace_tasks(request.path_params["trace_id"], request)

        @app.get("/introspect")
        async def introspect_route() -> JSONResponse:
            return JSONResponse(
                introspect(
                    self.agent,
                    self.model,
                    self._runtime(),
                    show_instruction=self.settings.introspect_instruction,
                    policy=self.policy,
                )
            )

        app.gate = RequestGate(app.behind_gate, node=self)
        return app

    async def _trace_tasks(self, trace_id: str, request: Request) -> Response:
        """This node's tasks of one trace (``mesh._a2a.traces``): the mesh token like A2A
        calls, since the rows show arguments."""
        import hmac

        from mesh._a2a.traces import TRACE_ID, tasks_of_trace
        from mesh._asgi import bearer

        token = self.settings.token
        if token is not None:
            given = bearer(request.scope)
            if given is None or not hmac.compare_digest(given, token.encode()):
                return JSONResponse(
                    {"error": "this node needs 'Authorization: Bearer <token>' (MESH_TOKEN)"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="mesh"'},
                )
        if not TRACE_ID.match(trace_id):
            return JSONResponse(
                {"error": "trace_id: 32 lowercase hex digits (a traceparent's trace id)"},
                status_code=400,
            )
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 500:
            return JSONResponse({"error": "limit: a whole number from 1 to 500"}, status_code=400)
        service = self.service
        if service is None or service.store is None or self._db is None:
            return JSONResponse(
                {"error": "this node keeps no tasks (store=memory): serve it with SQLite"},
                status_code=404,
            )
        answer = await tasks_of_trace(
            service.store, self._db, self.agent.name, trace_id, limit=int(raw)
        )
        return Response(answer.model_dump_json(), media_type="application/json")


async def _open_store(settings: NodeSettings, registry: CollectorRegistry, agent: str) -> Database:
    """The node's database: its SQLite file, or the PostgreSQL its replicas share (its reader
    pool's state on ``registry``)."""
    if settings.store_url is None:
        return await Database.open(settings.db_path)
    try:
        from mesh._pg import PgDatabase
    except ImportError as exc:
        raise ConfigError(
            "--store postgresql://... needs the PostgreSQL driver: "
            "pip install 'mesh-agents[postgres]'"
        ) from exc
    return await PgDatabase.open(
        settings.store_url,
        pool_min=settings.pg_pool_min,
        pool_max=settings.pg_pool_max,
        metrics=(registry, agent),
    )


async def _db_check(db: Database) -> tuple[bool, str]:
    await db.ping()
    return True, db.path


def create_app(agent: Agent, settings: NodeSettings, **kwargs: Any) -> FastAPI:
    """The ASGI app of ``agent`` (see ``Node`` for the options)."""
    return Node(agent, settings, **kwargs).app

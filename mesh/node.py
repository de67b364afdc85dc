"""``Node``: one agent, one process: the FastAPI app, its lifespan, and its drain.

    node = Node(agent, settings)
    app = node.app          # serve with uvicorn; `mesh serve` does this

Routes: ``/.well-known/agent-card.json`` and ``POST /`` (A2A JSON-RPC, from ``mesh.a2a``),
``/health``, ``/metrics``, ``/introspect``. Everything holding a connection (the database, the
runner's model, the registrar) is opened in the lifespan and closed when it ends.

Stopping (``drain``, run on SIGTERM by ``mesh serve``): the node deregisters, answers new
``SendMessage`` calls with 503, waits up to ``settings.grace_seconds`` for in-flight tasks,
then the server stops and the lifespan closes the stores.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mesh import __version__
from mesh.a2a.client import auth_headers
from mesh.a2a.server import SEND_METHODS, A2AService
from mesh.agent import Agent
from mesh.health import Health
from mesh.introspect import introspect
from mesh.metrics import CONTENT_TYPE_LATEST, NodeMetrics, render
from mesh.models.base import Model
from mesh.settings import DEFAULT_REGISTRY, NodeSettings
from mesh.sqlite import Database

__all__ = ["Node", "create_app"]

log = logging.getLogger("mesh.node")

#: Connections of the node's shared peer HTTP client (all peers together), see _bind_toolsets.
PEER_CONNECTIONS = 16


def _json_error(status: int, message: str) -> bytes:
    return json.dumps({"error": message, "status": status}).encode()


class _Gate:
    """Pure-ASGI middleware on the JSON-RPC route (``POST /``): body size limit, 503 for new
    sends while draining, and ``mesh_requests_total`` per method. Pure ASGI so SSE streams pass
    through unbuffered."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        token = self.node.settings.token
        if token is not None and not _authorized(scope, token):
            self.node.metrics.request("unauthorized", ok=False)
            await self._reply(
                send,
                401,
                "this node needs 'Authorization: Bearer <token>' on A2A calls "
                "(the mesh token, MESH_TOKEN)",
                headers=[(b"www-authenticate", b'Bearer realm="mesh"')],
            )
            return
        limit = self.node.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._reply(send, 413, f"request body over {limit} bytes")
                return
            chunks.append(body)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        parsed = _rpc_body(body)
        method = _rpc_method(parsed)
        if self.node.draining and method in SEND_METHODS:
            self.node.metrics.request(method, ok=False)
            await self._reply(
                send, 503, f"{self.node.agent.name} is shutting down; try another instance"
            )
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status = 200
        is_json = False
        first_chunk = b""

        async def watch(message: Message) -> None:
            nonlocal status, is_json, first_chunk
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = dict(message.get("headers", []))
                is_json = headers.get(b"content-type", b"").startswith(b"application/json")
            elif message["type"] == "http.response.body" and not first_chunk:
                first_chunk = bytes(message.get("body", b""))[:16]
            await send(message)

        service = self.node.service
        fast = service.fastpath if service is not None and method == "SendMessage" else None
        try:
            if fast is None or not await fast.serve(parsed, scope, replay, watch):
                await self.app(scope, replay, watch)
        finally:
            # JSON-RPC errors are HTTP 200 with {"error": ...} (the SDK writes "error" first).
            ok = status < 400 and not (is_json and first_chunk.startswith(b'{"error"'))
            self.node.metrics.request(method or "invalid", ok=ok)

    @staticmethod
    async def _reply(
        send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])],
            }
        )
        await send({"type": "http.response.body", "body": _json_error(status, message)})


def _authorized(scope: Scope, token: str) -> bool:
    expected = f"Bearer {token}".encode()
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            # Constant time: the comparison must not leak how much of the token matched.
            return hmac.compare_digest(value, expected)
    return False


def _rpc_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _rpc_method(data: Any) -> str | None:
    method = data.get("method") if isinstance(data, dict) else None
    return method if isinstance(method, str) and len(method) < 64 else None


class Node:
    """One agent served over A2A. Build it, then serve ``node.app``."""

    def __init__(
        self,
        agent: Agent,
        settings: NodeSettings,
        *,
        registry: CollectorRegistry | None = None,
        env: Mapping[str, str] | None = None,
        model: Model | None = None,
    ) -> None:
        self.agent = agent
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.registry = registry or CollectorRegistry()
        self.metrics = NodeMetrics(self.registry, agent.name, version=agent.version)
        self.instance_id = f"{agent.name}-{uuid.uuid4().hex[:8]}"
        self.health = Health(agent.name, agent.version, self.instance_id)
        self.draining = False
        self.model: Model | None = model
        self.service: A2AService | None = None
        self._registrar: Any = None
        # (httpx client, DiscoveryClient) shared by the agent's remote toolsets.
        self._shared: tuple[Any, Any] | None = None
        self.app = self._build_app()

    # -- lifecycle ------------------------------------------------------------------------
    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        db = await Database.open(self.settings.db_path)
        runner: Any = None
        skill_runners: dict[str, Any] = {}
        try:
            self.health.add_check("database", lambda: _db_check(db))
            if self.agent.is_llm:
                runner, skill_runners = self._build_runners(db)
                self.model = runner.model
            self.health.add_check("model", self._model_check)
            await self._bind_toolsets()
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
            )
            self.service.mount(app)
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
            if self.service is not None:
                await self.service.aclose()
            if runner is not None:
                await runner.aclose()
            await self._close_toolsets()
            await db.aclose()
            log.info("%s stopped", self.agent.name)

    def _build_runners(self, db: Database) -> tuple[Any, dict[str, Any]]:
        """The chat runner, and one runner per LLM typed skill (same model, same sessions)."""
        from mesh.a2a.dispatcher import skill_agent
        from mesh.runner import Runner, SessionLocks
        from mesh.sessions.sqlite import SqliteSessionStore

        sessions = SqliteSessionStore(db)
        # One lock set: a chat turn and a typed-skill turn on the same context (session) wait
        # for each other instead of interleaving their events.
        locks = SessionLocks()
        runner = Runner(
            self.agent,
            sessions=sessions,
            model=self.model,
            observer=self.metrics,
            env=self.env,
            locks=locks,
        )
        per_skill = {
            s.id: Runner(
                skill_agent(self.agent, s),
                sessions=sessions,
                model=runner.model,
                observer=self.metrics,
                env=self.env,
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
        from mesh.discovery import create_backend
        from mesh.discovery.base import Registration
        from mesh.discovery.registrar import Registrar

        backend = create_backend(location, token=token)
        registration = Registration(
            instance_id=self.instance_id,
            agent=self.agent.name,
            url=self.settings.url,
            version=self.agent.version,
            skills=tuple(s.id for s in self.agent.all_skills),
            tags=tuple(self.agent.tags),
        )
        self._registrar = (Registrar(backend, registration), backend)
        await self._registrar[0].start()

    def _discovery_location(self) -> tuple[str, str | None]:
        """Where this node registers, and where its remote tools look peers up."""
        if self.settings.consul:
            return self.settings.consul, self.settings.consul_token
        return self.settings.registry or DEFAULT_REGISTRY, self.settings.registry_token

    async def _bind_toolsets(self) -> None:
        """Give remote toolsets the node's shared HTTP client, discovery client and metrics,
        so every peer call shares one connection pool and is counted."""
        bindable = [t for t in self.agent.tools if hasattr(t, "bind")]
        if not bindable:
            return
        import httpx

        from mesh.discovery import create_backend
        from mesh.discovery.client import DiscoveryClient

        location, token = self._discovery_location()
        longest = max(float(getattr(t, "deadline_s", 30.0)) for t in bindable)
        # Bounded pool, every connection kept alive: httpcore scans each pooled connection on
        # every request (O(pool) per call), so past what a peer can serve in parallel more
        # connections only cost CPU; a call beyond the cap waits for a free connection.
        http = httpx.AsyncClient(
            timeout=httpx.Timeout(longest + 5.0, connect=2.0),
            limits=httpx.Limits(
                max_connections=PEER_CONNECTIONS, max_keepalive_connections=PEER_CONNECTIONS
            ),
            # One token per mesh: the node presents the token it requires of its own callers.
            headers=auth_headers(self.settings.token),
            trust_env=False,
        )
        discovery = DiscoveryClient(create_backend(location, token=token))
        self._shared = (http, discovery)
        for toolset in bindable:
            toolset.bind(
                discovery=discovery, http=http, metrics=self.metrics, caller=self.agent.name
            )

    async def _close_toolsets(self) -> None:
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
        """Stop taking tasks, deregister, wait for in-flight ones (bounded). Idempotent."""
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
        if not idle:
            log.warning("grace period over: %d task(s) will be canceled", self.service.in_flight)
        return idle

    # -- routes ---------------------------------------------------------------------------
    async def _model_check(self) -> tuple[bool, str]:
        if not self.agent.is_llm:
            return True, "no model (function skills only)"
        if self.model is None:
            return False, "model not configured"
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
        }

    def _build_app(self) -> FastAPI:
        app = FastAPI(
            title=f"mesh node: {self.agent.name}",
            version=self.agent.version,
            lifespan=self._lifespan,
            docs_url=None,
            redoc_url=None,
        )

        @app.get("/health")
        async def health() -> JSONResponse:
            status, body = await self.health.report()
            return JSONResponse(body, status_code=status)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(render(self.registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/introspect")
        async def introspect_route() -> JSONResponse:
            return JSONResponse(
                introspect(
                    self.agent,
                    self.model,
                    self._runtime(),
                    show_instruction=self.settings.introspect_instruction,
                )
            )

        app.add_middleware(_Gate, node=self)
        return app


async def _db_check(db: Database) -> tuple[bool, str]:
    await db.ping()
    return True, db.path


def create_app(agent: Agent, settings: NodeSettings, **kwargs: Any) -> FastAPI:
    """The ASGI app of ``agent`` (see ``Node`` for the options)."""
    return Node(agent, settings, **kwargs).app

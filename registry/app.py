"""``create_app(settings)``: the registry's FastAPI app.

The lifespan owns everything holding a connection: the SQLite store, the HTTP client used for
cards and probes, and the prober task. Routes: the JSON API under ``/v1`` (``registry.api``),
the operator page and console (``registry.page``), ``/health``, ``/metrics`` and
``/introspect`` (``registry.introspect``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from mesh._errors import StoreError
from mesh._netguard import create_http_client
from registry import api, chat, console, page
from registry.card import MAX_CONCURRENT_CARD_FETCHES
from registry.catalog import Catalog
from registry.fast_routes import FastRoutes
from registry.gate import Gate
from registry.introspect import introspect
from registry.metrics import CountRequests, RegistryMetrics
from registry.operator import Sessions
from registry.prober import MAX_CONCURRENT_PROBES, Prober
from registry.reach import Reach
from registry.recent import RecentTasks
from registry.settings import FLEET_LIMIT, RegistrySettings
from registry.sqlite_store import REFRESH_S, SqliteRegistryStore
from registry.state import RegistryState
from registry.store import RegistryStore

__all__ = ["create_app"]

log = logging.getLogger("registry")


def _error(status: int, code: str, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status)


def _field_errors(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    fields = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            # Its loc is ("body", <character offset>), which is not a field name.
            detail = (err.get("ctx") or {}).get("error", "")
            fields.append({"field": "body", "message": f"not valid JSON ({detail})"})
            continue
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        fields.append({"field": ".".join(loc) or "body", "message": str(err.get("msg", ""))})
    text = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return text or "invalid request", fields


# Why json.loads gave up on a body, when not for its syntax (FastAPI answers those 400).
_UNPARSABLE: dict[type[BaseException], str] = {
    UnicodeDecodeError: "not UTF-8 text",
    RecursionError: "nested too deeply",
}

_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    # Starlette's Allow names only the first route on the path (POST /v1/instances would hide
    # GET), and FastAPI nests included routers: ask every route, once per method.
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]


class RegistryApp(FastAPI):
    """The registry's FastAPI app behind its ``front``: the gate (``registry.gate``), the
    request counter and the fast routes (``registry.fast_routes``), which every HTTP request
    passes before FastAPI's own machinery (its per-request telemetry check, error middleware
    and routing), so that the fleet's heartbeats and lookups skip all of it."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is not None and scope["type"] == "http":
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def behind_front(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI itself: where the front passes on what it does not answer."""
        await super().__call__(scope, receive, send)


def create_app(
    settings: RegistrySettings,
    *,
    store: RegistryStore | None = None,
    metrics: RegistryMetrics | None = None,
    fast_routes: bool = True,
) -> FastAPI:
    """The registry app. ``store`` defaults to SQLite under ``settings.data_dir``.
    ``fast_routes=False`` leaves the lookup and the heartbeat to FastAPI too (a test compares
    both; ``registry.fast_routes``)."""
    metrics = metrics or RegistryMetrics.create()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned_store = store or await _open_store(settings)
        # Room for every probe and every registration fetch allowed at once: the rest wait in
        # a semaphore, never in the pool's queue (see registry.prober).
        limits = httpx.Limits(
            max_connections=MAX_CONCURRENT_PROBES + MAX_CONCURRENT_CARD_FETCHES,
            max_keepalive_connections=20,
        )
        http = create_http_client(
            settings.network_policy, timeout=settings.card_timeout_s, limits=limits
        )
        prober = Prober(
            owned_store,
            http,
            interval_s=settings.probe_interval_s,
            timeout_s=settings.probe_timeout_s,
            ttl_s=settings.ttl_s,
            remove_after_s=settings.remove_after_s,
            concurrency=settings.probe_concurrency,
            budget=settings.probe_budget,
            warn_at=settings.warn_at,
            holds=min(settings.max_instances, FLEET_LIMIT),
            metrics=metrics,
        )
        started_at = time.time()
        reach = Reach(settings, started_at=started_at)
        app.state.registry = RegistryState(
            settings=settings,
            store=owned_store,
            catalog=Catalog(owned_store),
            http=http,
            prober=prober,
            metrics=metrics,
            fetch_slots=asyncio.Semaphore(MAX_CONCURRENT_CARD_FETCHES),
            reach=reach,
            sessions=Sessions(settings.token),
            recent=RecentTasks(),
            started_at=started_at,
        )
        await prober.start()
        log.info(
            "registry on %s (data %s, writes %s)",
            settings.url,
            settings.db_path,
            "need a token" if settings.token else "open",
        )
        if settings.backend:
            log.info("instances and health come from %s", settings.backend)
        elif settings.max_instances > FLEET_LIMIT:
            log.warning(
                "--max-instances %d: one registry process holds about %d instances at the "
                "default intervals; beyond, run the mesh on Consul (--backend consul://HOST:8500; "
                "docs/production.md)",
                settings.max_instances,
                FLEET_LIMIT,
            )
        try:
            yield
        finally:
            await prober.aclose()
            await reach.aclose()
            await http.aclose()
            if store is None:
                await owned_store.aclose()

    app = RegistryApp(
        title="mesh registry",
        version="1",
        description="Where mesh agents register and find each other.",
        lifespan=lifespan,
    )

    @app.exception_handler(api.ApiError)
    async def _api_error(request: Request, exc: api.ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, fields = _field_errors(exc)
        return _error(422, "invalid_request", message, fields=fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI's "There was an error parsing the body": a JSON body that json.loads
            # failed on other than by a syntax error. Like any invalid field, a 422 naming it.
            why = _UNPARSABLE.get(type(exc.__cause__), "it could not be parsed")
            detail = f"not valid JSON ({why})"
            return _error(
                422,
                "invalid_request",
                f"body: {detail}",
                fields=[{"field": "body", "message": detail}],
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = _error(exc.status_code, code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(_allowed_methods(request))
        return response

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        return api.store_unavailable(request.method, request.url.path, exc)

    @app.get("/health", tags=["registry"])
    async def health(request: Request) -> JSONResponse:
        """200 ``{"status": "ok"}`` when the store answers, 503 otherwise. ``behind`` is true
        while the registry is overloaded (``why_behind`` says how): it demotes no instance on
        a probe until it has caught up."""
        state: RegistryState = request.app.state.registry
        try:
            await state.store.ping()
        except StoreError as exc:
            return JSONResponse(
                {"status": "failing", "store": str(exc), "pid": os.getpid()}, status_code=503
            )
        # The pid says which process answered (`mesh up` checks it is the one it started).
        why = state.prober.behind()
        return JSONResponse(
            {
                "status": "ok",
                "store": "ok",
                "pid": os.getpid(),
                "behind": bool(why),
                **({"why_behind": why} if why else {}),
            }
        )

    @app.get(
        "/metrics",
        tags=["registry"],
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "the Prometheus text exposition format",
                "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            }
        },
    )
    async def prometheus_metrics() -> Response:
        """The registry's own metrics, in the Prometheus text format."""
        return Response(generate_latest(metrics.collector), media_type=CONTENT_TYPE_LATEST)

    @app.get("/introspect", tags=["registry"])
    async def introspect_route(request: Request) -> JSONResponse:
        """What this registry is and how it is doing: store, instance counts, the prober and
        the gathering of the nodes' stats, its settings (never a secret)."""
        return JSONResponse(await introspect(request.app.state.registry))

    app.include_router(api.router)
    app.include_router(page.router)
    app.include_router(console.router)
    app.include_router(chat.router)

    def state() -> RegistryState:
        registry: RegistryState = app.state.registry
        return registry

    inner: ASGIApp = app.behind_front
    if fast_routes:
        inner = FastRoutes(
            inner,
            state=state,
            lookup=_route(api.router, "/v1/instances", "GET"),
            heartbeat=_route(api.router, "/v1/instances/{instance_id}/heartbeat", "PUT"),
        )
    # The token and the body limit come before anything reads a body.
    app.front = Gate(
        CountRequests(inner, metrics=metrics),
        token=settings.token,
        max_body_bytes=settings.max_body_bytes,
        metrics=metrics,
    )
    return app


def _route(router: APIRouter, path: str, method: str) -> APIRoute:
    # The router's own routes: FastAPI nests an included router's (app.router.routes has one
    # entry for it), and counts a request under the route itself, as this one does.
    return next(
        r
        for r in router.routes
        if isinstance(r, APIRoute) and r.path == path and method in (r.methods or ())
    )


async def _open_store(settings: RegistrySettings) -> RegistryStore:
    """SQLite under the data dir by default; Consul when ``settings.backend`` names it."""
    if settings.backend:
        # Imported here: only Consul deployments need py-consul loaded.
        from registry.consul_store import ConsulRegistryStore

        return ConsulRegistryStore.from_url(
            settings.backend,
            token=settings.consul_token,
            tls=settings.consul_tls,
            card_timeout_s=settings.card_timeout_s,
            policy=settings.network_policy,
        )
    if settings.store_url:
        # The view's full reload brings heartbeat times (no notification carries them), well
        # inside the TTL the prober reads them against.
        refresh_s = min(REFRESH_S, settings.ttl_s / 3)
        return await SqliteRegistryStore.open_postgres(settings.store_url, refresh_s=refresh_s)
    return await SqliteRegistryStore.open(settings.db_path)

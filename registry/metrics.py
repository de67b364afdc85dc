"""The registry's own metrics, on an injected ``CollectorRegistry``."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CountRequests", "RegistryMetrics"]


@dataclass(frozen=True)
class RegistryMetrics:
    collector: CollectorRegistry
    instances: Gauge
    requests: Counter
    # The prober's view of the registry's own load (``registry.prober``).
    behind: Gauge
    loop_lag: Gauge
    probe_round: Gauge
    probes: Counter

    @classmethod
    def create(cls, collector: CollectorRegistry | None = None) -> RegistryMetrics:
        collector = collector or CollectorRegistry()
        return cls(
            collector=collector,
            instances=Gauge(
                "mesh_registry_instances",
                "Registered instances by agent and health status.",
                ["agent", "status"],
                registry=collector,
            ),
            requests=Counter(
                "mesh_registry_requests_total",
                "Registry HTTP requests by route template and status code.",
                ["route", "status"],
                registry=collector,
            ),
            behind=Gauge(
                "mesh_registry_behind",
                "1 while the registry is behind (its event loop late, or probe rounds over the "
                "interval): no probe demotes an instance meanwhile.",
                registry=collector,
            ),
            loop_lag=Gauge(
                "mesh_registry_event_loop_lag_seconds",
                "How late the registry's event loop last ran a 0.1 s timer.",
                registry=collector,
            ),
            probe_round=Gauge(
                "mesh_registry_probe_round_seconds",
                "How long the last probe round over every instance took.",
                registry=collector,
            ),
            probes=Counter(
                "mesh_registry_probes_total",
                "Probe outcomes: passing, warning, critical, or unknown (out of time while the "
                "instance's heartbeats were fresh: its status kept).",
                ["outcome"],
                registry=collector,
            ),
        )


class CountRequests:
    """Counts every HTTP response in ``mesh_registry_requests_total`` by route template (never
    the raw path: labels stay bounded) and status. Pure ASGI: Starlette's ``BaseHTTPMiddleware``
    costs each request a task and a stream, which a fleet's heartbeats pay thousands of times
    a second."""

    def __init__(self, app: ASGIApp, *, metrics: RegistryMetrics) -> None:
        self._app = app
        self._requests = metrics.requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        status = 500

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, counted)
        finally:
            # The router records the matched route in the scope it was given (this one).
            label = getattr(scope.get("route"), "path", None) or "unmatched"
            self._requests.labels(route=label, status=str(status)).inc()

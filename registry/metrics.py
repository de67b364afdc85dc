"""The registry's own metrics, on an injected ``CollectorRegistry``."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["RegistryMetrics"]


@dataclass(frozen=True)
class RegistryMetrics:
    collector: CollectorRegistry
    instances: Gauge
    requests: Counter

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
        )

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

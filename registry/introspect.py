"""The registry's own ``/introspect``, like every node's: what it is and how it is doing.

    {"registry": {mesh_version, python, pid, uptime_s, url},
     "store": {"kind": "sqlite", "path": ...} | {"kind": "consul", "address": ...},
     "agents": n, "instances": {"total", "passing", "warning", "critical"},
     "prober": {interval_s, timeout_s, ttl_s, remove_after_s, concurrency, path, last_round,
                behind: [why], loop_lag_s},
     "gathering": {instances_heard, instances_with_stats, answers, unreadable_stats, ...},
     "settings": {...}}

No secrets: the write token and the Consul token are said to be set or not, never shown, and a
backend address loses any user:password it carries.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mesh import __version__
from registry.prober import HEALTH_PATH
from registry.state import RegistryState

__all__ = ["introspect"]


def _without_credentials(address: str) -> str:
    parts = urlsplit(address)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


async def introspect(state: RegistryState) -> dict[str, Any]:
    """The document (module docstring)."""
    s, prober = state.settings, state.prober
    instances = await state.store.instances()
    by_status = {"passing": 0, "warning": 0, "critical": 0}
    for inst in instances:
        by_status[inst.status] = by_status.get(inst.status, 0) + 1
    store: dict[str, Any] = (
        {"kind": "consul", "address": _without_credentials(s.backend)}
        if s.backend
        else {"kind": "sqlite", "path": str(s.db_path)}
    )
    return {
        "registry": {
            "mesh_version": __version__,
            "python": platform.python_version(),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - state.started_at, 3),
            "url": s.url,
        },
        "store": store,
        "agents": len(await state.store.agents()),
        "instances": {"total": len(instances), **by_status},
        "prober": {
            "interval_s": prober.interval_s,
            "timeout_s": s.probe_timeout_s,
            "ttl_s": s.ttl_s,
            "remove_after_s": s.remove_after_s,
            "concurrency": prober.concurrency,
            "path": HEALTH_PATH,
            "last_round": asdict(prober.last_round),
            "behind": prober.behind(),
            "loop_lag_s": round(prober.loop_lag_s, 4),
        },
        "gathering": prober.traffic.state(),
        "settings": {
            "host": s.host,
            "port": s.port,
            "data_dir": str(s.data_dir),
            "writes": "need the token" if s.token else "open",
            "consul_token": "set" if s.consul_token else "unset",
            "mesh_token": "set" if s.mesh_token else "unset",
            "allow_networks": s.network_policy.spec,
            "card_timeout_s": s.card_timeout_s,
            "max_body_bytes": s.max_body_bytes,
            "max_instances": s.max_instances,
        },
    }

"""``Health``: the node's readiness, served at ``/health``.

    {"status": "ok" | "starting" | "failing" | "stopping", "agent", "version", "instance_id",
     "pid", "uptime_s", "checks": {"database": {"ok": true, "detail": "..."}, "model": {...}}}

200 only when ``status == "ok"``; 503 otherwise, so a registry probe, a load balancer or
``mesh up`` can wait on it. Checks are async callables returning ``(ok, detail)``.

``instance_id`` and ``pid`` say WHO answered: a registry probe or a supervisor that finds another
id (or pid) at an address knows it reached a different process than the one it registered or
started (a restarted node, a second mesh on the same ports).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

__all__ = ["Check", "Health", "HealthStatus"]

HealthStatus = Literal["ok", "starting", "failing", "stopping"]
Check = Callable[[], Awaitable[tuple[bool, str]]]

_CHECK_TIMEOUT_S = 2.0


class Health:
    """Readiness of one node: a phase (starting / ready / stopping) plus named checks."""

    def __init__(self, agent: str, version: str, instance_id: str = "") -> None:
        self.agent = agent
        self.version = version
        self.instance_id = instance_id
        self.started_at = time.monotonic()
        self.phase: Literal["starting", "ready", "stopping"] = "starting"
        self._checks: dict[str, Check] = {}

    def add_check(self, name: str, check: Check) -> None:
        self._checks[name] = check

    @property
    def uptime_s(self) -> float:
        return round(time.monotonic() - self.started_at, 3)

    async def _run(self, check: Check) -> dict[str, Any]:
        try:
            async with asyncio.timeout(_CHECK_TIMEOUT_S):
                ok, detail = await check()
        except TimeoutError:
            ok, detail = False, f"no answer within {_CHECK_TIMEOUT_S}s"
        except Exception as exc:  # a failing check is a report, never a 500
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        return {"ok": ok, "detail": detail}

    async def report(self) -> tuple[int, dict[str, Any]]:
        """``(http_status, body)`` of the current state."""
        names = list(self._checks)
        results = await asyncio.gather(*(self._run(self._checks[n]) for n in names))
        checks = dict(zip(names, results, strict=True))
        status: HealthStatus
        if self.phase == "starting":
            status = "starting"
        elif self.phase == "stopping":
            status = "stopping"
        elif all(c["ok"] for c in checks.values()):
            status = "ok"
        else:
            status = "failing"
        body = {
            "status": status,
            "agent": self.agent,
            "version": self.version,
            "instance_id": self.instance_id,
            "pid": os.getpid(),
            "uptime_s": self.uptime_s,
            "checks": checks,
        }
        return (200 if status == "ok" else 503), body

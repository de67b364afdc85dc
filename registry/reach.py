"""``Reach``: which instances the registry may ask for their tasks, and with what credential.

The console's views of tasks (one request's path, an agent's recent tasks, the approval inbox)
ask the nodes themselves. Those routes take the mesh token (``MESH_TOKEN``) like A2A calls do,
and the registry holds it only to send it to the mesh's own nodes. A URL in the registry was
chosen by whoever registered it, so the token goes to an instance only when the registry has
reason to trust that registration:

1. the registry has a write token (``MESH_REGISTRY_TOKEN``): every registration and heartbeat
   it accepts presented it, so whoever registered holds the operator's credential. An open
   registry (no write token) accepts anybody's URL: no instance gets the mesh token;
2. the instance registered or heartbeated since this process started: a row kept in
   ``registry.db`` from a run without a token (or with another one) is not vouched for until it
   heartbeats with the current one (nodes heartbeat every 5 s);
3. the registry keeps its instances itself (SQLite): in Consul, nodes register without the
   registry, which cannot tell who did;
4. the instance is not critical (it is not the process that registered, or not there at all).

The calls go through a client of their own (``http``), built like the node's delegation client:
only to the registry's allowed networks, and plain ``http`` only to loopback and private
addresses (``mesh._trust.PLAIN_HTTP_NETWORKS``), so the token never crosses a network in clear.

Without a mesh token the nodes ask for none: every live instance is asked, with nothing secret
sent (what they answer is shown as theirs). An instance refused is never asked; the views name
it and why (``Refusal``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from mesh._netguard import create_http_client
from mesh._trust import PLAIN_HTTP_NETWORKS
from registry.settings import RegistrySettings
from registry.store import InstanceRecord

__all__ = ["PARALLEL", "VIEW_DEADLINE_S", "Reach", "Refusal"]

#: Nodes asked at once by one view, each within its own deadline and byte cap.
PARALLEL = 8
#: A view's whole asking: the nodes not done by then are named, the others' answers shown (a
#: mesh of many slow nodes costs one view this long, not nodes / PARALLEL deadlines).
VIEW_DEADLINE_S = 15.0


@dataclass(frozen=True)
class Refusal:
    """An instance the registry did not ask, and why (a fixed text)."""

    agent: str
    instance_id: str
    url: str
    why: str


class Reach:
    """The trust rule of the module docstring, and the client the asks go through."""

    def __init__(self, settings: RegistrySettings, *, started_at: float) -> None:
        self.settings = settings
        self.started_at = started_at
        self.mesh_token = settings.mesh_token
        self.http: httpx.AsyncClient = create_http_client(
            settings.network_policy,
            timeout=settings.card_timeout_s,
            limits=httpx.Limits(max_connections=PARALLEL * 2, max_keepalive_connections=PARALLEL),
            plain_http=PLAIN_HTTP_NETWORKS if self.mesh_token else None,
        )

    @property
    def headers(self) -> dict[str, str]:
        """What goes with a call to an instance ``refusal`` let through."""
        return {"Authorization": f"Bearer {self.mesh_token}"} if self.mesh_token else {}

    @property
    def can_write(self) -> bool:
        """Whether the console may answer tasks: it needs the operator's credential to check
        (the write token), and the nodes need to accept what it sends."""
        return self.settings.token is not None

    def refusal(self, inst: InstanceRecord) -> str | None:
        """Why ``inst`` is not asked (a fixed text), or None when it may be."""
        if inst.status == "critical":
            return "critical: not asked"
        if not self.mesh_token:
            return None
        if self.settings.backend:
            return (
                "not sent the mesh token: instances in Consul register without the registry, "
                "which cannot tell who registered them"
            )
        if self.settings.token is None:
            return (
                "not sent the mesh token: this registry's writes are open (anyone could have "
                "registered this URL); start it with MESH_REGISTRY_TOKEN"
            )
        if inst.last_heartbeat_at < self.started_at:
            return (
                "not sent the mesh token: no registration or heartbeat with the write token "
                "since the registry started"
            )
        return None

    def split(
        self, instances: Iterable[InstanceRecord]
    ) -> tuple[list[InstanceRecord], list[Refusal]]:
        """(the instances that may be asked, one per URL; the others with why)."""
        asked: dict[str, InstanceRecord] = {}
        refused: list[Refusal] = []
        for inst in instances:
            why = self.refusal(inst)
            if why is None:
                asked.setdefault(inst.url.rstrip("/"), inst)
            else:
                refused.append(Refusal(inst.agent, inst.instance_id, inst.url, why))
        return list(asked.values()), refused

    async def aclose(self) -> None:
        await self.http.aclose()

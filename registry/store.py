"""``RegistryStore``: where the registry keeps agents and their instances.

The interface is small and async so a store over another backend (Consul's KV, say) is a page of
code. Filtering, health policy and JSON shapes live above it (``registry.catalog``,
``registry.prober``); a store only persists records.

An agent exists while it has at least one instance: a store drops the agent record when its last
instance goes (deregistered, or removed after being critical too long).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from mesh.discovery.base import Status

__all__ = ["AgentRecord", "InstanceRecord", "RegistryStore", "SkillRecord"]


@dataclass(frozen=True)
class SkillRecord:
    """One skill of an agent, as its card describes it (schemas only for typed skills)."""

    id: str
    name: str
    description: str
    tags: tuple[str, ...] = ()
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class AgentRecord:
    """An agent: its validated card (as served, camelCase JSON) and what we derived from it."""

    name: str
    description: str
    version: str
    card: dict[str, Any]
    skills: tuple[SkillRecord, ...] = ()
    updated_at: float = 0.0
    # The agent's own tags (``Agent(tags=...)``, from the card's mesh extension).
    agent_tags: tuple[str, ...] = ()

    @property
    def tags(self) -> tuple[str, ...]:
        """The agent's tags and every skill tag, sorted, without duplicates."""
        return tuple(sorted({*self.agent_tags, *(t for s in self.skills for t in s.tags)}))

    def skill(self, skill_id: str) -> SkillRecord | None:
        return next((s for s in self.skills if s.id == skill_id), None)


@dataclass(frozen=True)
class InstanceRecord:
    """One running replica of an agent, with the registry's view of its health."""

    instance_id: str
    agent: str
    url: str
    version: str
    status: Status = "passing"
    status_reason: str = "registered"
    status_changed_at: float = 0.0
    last_heartbeat_at: float = 0.0
    registered_at: float = 0.0

    def replace(self, **changes: Any) -> InstanceRecord:
        return dataclasses.replace(self, **changes)


class RegistryStore(Protocol):
    """Persistence of agents and instances. Every method is atomic on its own."""

    async def put(self, agent: AgentRecord, instance: InstanceRecord) -> InstanceRecord:
        """Register (or re-register) ``instance`` and replace its agent's card with ``agent``.

        Re-registering a known instance id keeps its ``registered_at``; returns what is stored.
        """
        ...

    async def heartbeat(self, instance_id: str, at: float) -> InstanceRecord | None:
        """Record a heartbeat; ``None`` when the instance is unknown."""
        ...

    async def set_status(self, instance_id: str, status: Status, reason: str, at: float) -> None:
        """Change an instance's status (no-op for an unknown instance)."""
        ...

    async def remove(self, instance_id: str) -> InstanceRecord | None:
        """Forget an instance (and its agent if it was the last); ``None`` if it was unknown."""
        ...

    async def instances(self, agent: str | None = None) -> list[InstanceRecord]:
        """All instances (of ``agent``), ordered by agent then URL."""
        ...

    async def agents(self) -> list[AgentRecord]:
        """All agents, ordered by name."""
        ...

    async def agent(self, name: str) -> AgentRecord | None: ...

    async def ping(self) -> None:
        """Raise ``StoreError`` when the store cannot answer (the registry's ``/health``)."""
        ...

    async def aclose(self) -> None: ...

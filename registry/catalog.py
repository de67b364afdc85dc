"""``Catalog``: the read side of the registry (filters and joins), shared by the JSON API, the
operator page and Prometheus service discovery. Stores stay dumb; the policy is here."""

from __future__ import annotations

from dataclasses import dataclass

from registry.store import AgentRecord, InstanceRecord, RegistryStore

__all__ = ["AgentView", "Catalog", "matches"]


@dataclass(frozen=True)
class AgentView:
    """An agent with its instances."""

    agent: AgentRecord
    instances: tuple[InstanceRecord, ...]

    @property
    def passing(self) -> int:
        return sum(1 for i in self.instances if i.status == "passing")


def matches(agent: AgentRecord, text: str) -> bool:
    """Free-text match (case-insensitive) on name, description, skills and tags."""
    needle = text.strip().lower()
    if not needle:
        return True
    haystack = [agent.name, agent.description, *agent.tags]
    for s in agent.skills:
        haystack += [s.id, s.name, s.description]
    return any(needle in h.lower() for h in haystack)


class Catalog:
    def __init__(self, store: RegistryStore) -> None:
        self._store = store

    async def agents(
        self, *, skill: str | None = None, tag: str | None = None, q: str | None = None
    ) -> list[AgentView]:
        """Agents offering ``skill`` (id), carrying ``tag`` and matching ``q``, by name."""
        by_agent: dict[str, list[InstanceRecord]] = {}
        for inst in await self._store.instances():
            by_agent.setdefault(inst.agent, []).append(inst)
        views = []
        for agent in await self._store.agents():
            if skill and agent.skill(skill) is None:
                continue
            if tag and tag not in agent.tags:
                continue
            if q and not matches(agent, q):
                continue
            views.append(AgentView(agent, tuple(by_agent.get(agent.name, ()))))
        return views

    async def agent(self, name: str) -> AgentView | None:
        agent = await self._store.agent(name)
        if agent is None:
            return None
        return AgentView(agent, tuple(await self._store.instances(agent=name)))

    async def instances(
        self, *, agent: str | None = None, skill: str | None = None, status: str = "passing"
    ) -> list[tuple[InstanceRecord, AgentRecord | None]]:
        """Instances (with their agent) filtered by agent, skill and status (``any``: all)."""
        if agent is not None:
            # A lookup of one agent (every delegation's discovery) needs its record only.
            record = await self._store.agent(agent)
            agents = {agent: record} if record is not None else {}
        else:
            agents = {a.name: a for a in await self._store.agents()}
        out = []
        for inst in await self._store.instances(agent=agent):
            record = agents.get(inst.agent)
            if skill and (record is None or record.skill(skill) is None):
                continue
            if status != "any" and inst.status != status:
                continue
            out.append((inst, record))
        return out

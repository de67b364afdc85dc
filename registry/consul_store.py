"""``ConsulRegistryStore``: the registry's records read from (and written to) Consul.

With ``mesh registry --backend consul://host:8500`` the registry holds no database of its own:
nodes running with ``MESH_DISCOVERY=consul://...`` register straight into Consul, and the
registry serves its page, ``mesh ls`` and Prometheus targets from what Consul knows. Nodes that
still register through the registry API land in Consul too.

Consul is the health authority here: an instance's status is its Consul checks' status, and a
node's Consul check is its heartbeat. So ``set_status`` (the registry's prober) changes nothing,
and ``last_heartbeat_at`` is the time of Consul's latest answer. Consul stores no agent cards,
so the store reads each agent's card from one of its instances (``url`` + ``card_path`` from the
service meta) and keeps it until the agent's version changes; an agent whose card cannot be
read is still listed, with the skills its Consul tags name.

Ownership (``registry.store``) holds here too: an instance registered through the registry API
keeps its secret's hash in its service meta (``secret_hash``), and re-registering,
heartbeating or deregistering it through the API must present the secret. A node that
registered straight into Consul has no hash there, so the API can change nothing of it (Consul's
ACLs guard that path). Unlike SQLite, the check and the write are two Consul calls, not one
transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable

import httpx

from mesh._discovery.base import CARD_PATH, Instance, Registration, Status, UnknownInstance
from mesh._discovery.consul import ConsulBackend, service_registration
from mesh._errors import ConfigError, DiscoveryError, StoreError
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._settings import ConsulTLS
from registry.card import CardRejected, agent_record, fetch_card
from registry.store import (
    AgentRecord,
    InstanceRecord,
    Registered,
    SkillRecord,
    Unstorable,
    check_owner,
    check_room,
    check_supersede,
)

__all__ = ["CardCache", "ConsulRegistryStore", "fallback_agent", "instance_record"]

log = logging.getLogger("registry.consul")

# The service meta key holding the hash of an instance's secret.
OWNER_META = "secret_hash"


def _check_owner(inst: Instance, presented: str | None, *, agent: str | None = None) -> None:
    check_owner(inst.instance_id, inst.agent, inst.meta.get(OWNER_META, ""), presented, agent=agent)


def instance_record(
    inst: Instance, *, registered_at: float, status_changed_at: float, now: float
) -> InstanceRecord:
    """A Consul ``Instance`` as the registry's record (times are the registry's observations)."""
    return InstanceRecord(
        instance_id=inst.instance_id,
        agent=inst.agent,
        url=inst.url,
        version=inst.version,
        status=inst.status,
        status_reason=f"Consul health checks: {inst.status}",
        status_changed_at=status_changed_at,
        last_heartbeat_at=now,
        registered_at=registered_at,
    )


def fallback_agent(name: str, instances: Iterable[Instance], *, now: float) -> AgentRecord:
    """What Consul alone says about an agent: name, version and skill ids (its tags)."""
    instances = list(instances)
    version = max((i.version for i in instances), default="")
    skill_ids = sorted({s for i in instances for s in i.skills})
    return AgentRecord(
        name=name,
        description="",
        version=version,
        card={},
        skills=tuple(SkillRecord(id=s, name=s, description="") for s in skill_ids),
        updated_at=now,
    )


class CardCache:
    """Agent cards read from live instances, one per agent, kept while its version holds."""

    def __init__(self, http: httpx.AsyncClient, *, clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._clock = clock
        self._records: dict[str, AgentRecord] = {}

    def put(self, record: AgentRecord) -> None:
        self._records[record.name] = record

    async def get(self, name: str, instances: list[Instance]) -> AgentRecord:
        """The agent's record from its card; ``fallback_agent`` if no instance serves one."""
        version = max((i.version for i in instances), default="")
        cached = self._records.get(name)
        if cached is not None and cached.card and cached.version == version:
            return cached
        # Passing instances first: they are the ones most likely to answer.
        for inst in sorted(instances, key=lambda i: i.status != "passing"):
            card_path = inst.meta.get("card_path", CARD_PATH)
            try:
                data = await fetch_card(self._http, inst.url, card_path)
                record = agent_record(data, expected_name=name, now=self._clock())
            except CardRejected as exc:
                log.info("no card for %s from %s: %s", name, inst.url, exc)
                continue
            self._records[name] = record
            return record
        return cached if cached is not None else fallback_agent(name, instances, now=self._clock())

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the cards of agents that have no instance any more."""
        for name in set(self._records) - set(keep):
            del self._records[name]


class ConsulRegistryStore:
    """``RegistryStore`` over Consul (through ``mesh._discovery.consul.ConsulBackend``)."""

    def __init__(
        self,
        backend: ConsulBackend,
        http: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._http = http
        self._clock = clock
        self._cards = CardCache(http, clock=clock)
        # What Consul does not record: when this registry first saw an instance, and when it
        # saw its status change.
        self._seen: dict[str, tuple[float, Status, float]] = {}
        # Instances the prober could not remove (another agent holds them), said once each.
        self._held_elsewhere: set[str] = set()

    @classmethod
    def from_url(
        cls,
        address: str,
        *,
        token: str | None = None,
        tls: ConsulTLS | None = None,
        card_timeout_s: float = 5.0,
        policy: NetworkPolicy | None = None,
    ) -> ConsulRegistryStore:
        """A store on the Consul agent at ``consul://host:8500`` (``token``: ACL token,
        ``tls``: CA and client certificate for ``consul+https://``); cards are read only from
        instances on ``policy``'s networks (default: loopback)."""
        http = create_http_client(policy or NetworkPolicy.parse("loopback"), timeout=card_timeout_s)
        return cls(ConsulBackend(address, token=token, tls=tls), http)

    async def _find(self, agent: str | None = None) -> list[Instance]:
        try:
            return await self._backend.find(agent=agent, passing_only=False)
        except DiscoveryError as exc:
            raise StoreError(str(exc)) from exc

    def _record(self, inst: Instance, now: float) -> InstanceRecord:
        first, status, changed = self._seen.get(inst.instance_id, (now, inst.status, now))
        if status != inst.status:
            status, changed = inst.status, now
        self._seen[inst.instance_id] = (first, status, changed)
        return instance_record(inst, registered_at=first, status_changed_at=changed, now=now)

    async def _known(self, instance_id: str) -> Instance | None:
        return next((i for i in await self._find() if i.instance_id == instance_id), None)

    async def _owned(self, instance_id: str, presented: str | None) -> Instance | None:
        """The instance if ``presented`` owns it, None if unknown, else ``NotOwner``."""
        known = await self._known(instance_id)
        if known is not None:
            _check_owner(known, presented)
        return known

    async def put(
        self,
        agent: AgentRecord,
        instance: InstanceRecord,
        *,
        secret_hash: str,
        presented: str | None,
        supersede: Collection[str] = (),
        max_instances: int | None = None,
    ) -> Registered:
        everyone = await self._find()
        known = next((i for i in everyone if i.instance_id == instance.instance_id), None)
        if known is not None:
            _check_owner(known, presented, agent=agent.name)
            secret_hash = known.meta[OWNER_META]
        now = self._clock()
        # One instance per (agent, URL), as in the SQLite store.
        superseded = [
            i
            for i in everyone
            if i.agent == agent.name
            and i.url == instance.url
            and i.instance_id != instance.instance_id
        ]
        check_supersede((self._record(i, now) for i in superseded), supersede)
        if known is None:
            check_room(len(everyone), len(superseded), max_instances)
        registration = Registration(
            instance_id=instance.instance_id,
            agent=agent.name,
            url=instance.url,
            version=instance.version,
            skills=tuple(s.id for s in agent.skills),
            tags=agent.tags,
            meta={OWNER_META: secret_hash},
        )
        try:
            service_registration(registration)  # what Consul would refuse, before any write
        except ConfigError as exc:
            raise Unstorable(str(exc)) from exc
        try:
            for ghost in superseded:
                await self._backend.deregister(ghost.instance_id)
            await self._backend.register(registration)
        except DiscoveryError as exc:
            raise StoreError(str(exc)) from exc
        self._cards.put(agent)
        first = self._seen.get(instance.instance_id, (instance.registered_at,))[0]
        # Consul's check starts critical and turns passing on its first success.
        self._seen[instance.instance_id] = (first, "critical", instance.status_changed_at)
        stored = instance.replace(
            registered_at=first, status="critical", status_reason="registered in Consul"
        )
        return Registered(
            stored,
            created=known is None,
            superseded=tuple(self._record(i, now) for i in superseded),
        )

    async def heartbeat(
        self, instance_id: str, at: float, *, presented: str | None
    ) -> InstanceRecord | None:
        if await self._owned(instance_id, presented) is None:
            return None  # not (yet) in the catalog: register again
        try:
            await self._backend.heartbeat(instance_id)
        except UnknownInstance:
            return None
        except DiscoveryError as exc:
            raise StoreError(str(exc)) from exc
        for record in await self.instances():
            if record.instance_id == instance_id:
                return record
        return None

    async def deregister(self, instance_id: str, *, presented: str | None) -> InstanceRecord | None:
        """``StoreError`` when the instance is registered through another Consul agent: only
        that agent can remove it, and reporting success would be a lie."""
        if await self._owned(instance_id, presented) is None:
            return None
        return await self._remove(instance_id, strict=True)

    async def set_status(self, instance_id: str, status: Status, reason: str, at: float) -> None:
        """Consul's checks decide an instance's status; the registry's opinion is not stored."""

    async def remove(self, instance_id: str) -> InstanceRecord | None:
        """The prober's removal: None (nothing removed) for an instance another Consul agent
        holds, said once in the log; Consul reaps it after its check's
        ``DeregisterCriticalServiceAfter``."""
        return await self._remove(instance_id, strict=False)

    async def _remove(self, instance_id: str, *, strict: bool) -> InstanceRecord | None:
        found = [r for r in await self.instances() if r.instance_id == instance_id]
        try:
            await self._backend.remove(instance_id)
        except UnknownInstance as exc:
            if found and strict:
                raise StoreError(f"cannot deregister {instance_id!r}: {exc}") from exc
            if found and instance_id not in self._held_elsewhere:
                self._held_elsewhere.add(instance_id)
                log.warning(
                    "not removing %s: %s; Consul removes it after its check's "
                    "DeregisterCriticalServiceAfter",
                    instance_id,
                    exc,
                )
            return None
        except DiscoveryError as exc:
            raise StoreError(str(exc)) from exc
        self._seen.pop(instance_id, None)
        return found[0] if found else None

    async def instances(self, agent: str | None = None) -> list[InstanceRecord]:
        now = self._clock()
        records = [self._record(i, now) for i in await self._find(agent)]
        if agent is None:
            live = {r.instance_id for r in records}
            for gone in set(self._seen) - live:
                del self._seen[gone]
            self._held_elsewhere &= live
        return sorted(records, key=lambda r: (r.agent, r.url))

    async def agents(self) -> list[AgentRecord]:
        by_agent: dict[str, list[Instance]] = {}
        for inst in await self._find():
            by_agent.setdefault(inst.agent, []).append(inst)
        self._cards.forget(by_agent)
        names = sorted(by_agent)
        records = await asyncio.gather(*(self._cards.get(n, by_agent[n]) for n in names))
        return list(records)

    async def agent(self, name: str) -> AgentRecord | None:
        instances = await self._find(name)
        if not instances:
            return None
        return await self._cards.get(name, instances)

    async def ping(self) -> None:
        try:
            await self._backend.ping()
        except DiscoveryError as exc:
            raise StoreError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._backend.aclose()
        await self._http.aclose()

"""``RegistryStore``: where the registry keeps agents and their instances.

The interface is small and async so a store over another backend (Consul's KV, say) is a page of
code. Filtering, health policy and JSON shapes live above it (``registry.catalog``,
``registry.prober``); a store only persists records.

An agent exists while it has at least one instance: a store drops the agent record when its last
instance goes (deregistered, or removed after being critical too long).

Ownership: an instance belongs to whoever registered it. Registration stores the hash of a
fresh secret (``secret_hash``); re-registering, heartbeating and deregistering that instance id
must present the same secret (as ``presented``, its hash), else ``NotOwner``, and an id can
never move to another agent (``InstanceTaken``). Nor does a URL: another instance of the same
agent at the URL of a registration is superseded only when the caller proved that the process
there is the one registering (``supersede``, see ``registry.api``), else ``UrlTaken``. And a
store holds at most ``max_instances`` (``RegistryFull``). A store checks all of these inside the
same write that changes the record. ``remove`` is the registry's own decision (the prober's)
and checks nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from mesh._discovery.base import Status

__all__ = [
    "AgentRecord",
    "InstanceRecord",
    "InstanceTaken",
    "NotOwner",
    "Registered",
    "RegistryFull",
    "RegistryStore",
    "SkillRecord",
    "Unstorable",
    "UrlTaken",
    "check_owner",
    "check_room",
    "check_supersede",
    "secret_hash",
]


class InstanceTaken(Exception):
    """The instance id is registered to another agent (``agent``): never replaced."""

    def __init__(self, instance_id: str, agent: str) -> None:
        super().__init__(f"instance {instance_id!r} is registered to agent {agent!r}")
        self.instance_id = instance_id
        self.agent = agent


class NotOwner(Exception):
    """The secret presented (or its absence) does not own the instance."""


class UrlTaken(Exception):
    """Another instance of the agent (``instance``) is at the registration's URL, and the caller
    did not prove that the process there is the one registering: never superseded."""

    def __init__(self, instance: InstanceRecord) -> None:
        super().__init__(f"instance {instance.instance_id!r} is at {instance.url}")
        self.instance = instance


class Unstorable(Exception):
    """The backend cannot keep the registration as given (Consul: a URL or tag list over the 512
    characters of a service meta value). The message names the field and what to do."""


class RegistryFull(Exception):
    """A new instance beyond the store's ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the registry holds its maximum of {limit} instances")
        self.limit = limit


def secret_hash(secret: str) -> str:
    """What a store keeps of an instance secret. The secret is 256 random bits, so a plain
    SHA-256 is as good as a slow KDF here, and cheap enough for every heartbeat."""
    return hashlib.sha256(secret.encode()).hexdigest()


def check_owner(
    instance_id: str,
    stored_agent: str,
    stored_hash: str,
    presented: str | None,
    *,
    agent: str | None = None,
) -> None:
    """Refuse a write to the stored instance (``stored_agent``, ``stored_hash``) that its
    writer may not make: ``InstanceTaken`` when a registration's ``agent`` is another agent,
    ``NotOwner`` when ``presented`` (a ``secret_hash``, or None) is not the stored hash.
    Constant-time; a record without a hash is owned by nobody. Every store calls it inside the
    write that changes the record."""
    if agent is not None and agent != stored_agent:
        raise InstanceTaken(instance_id, stored_agent)
    if not (stored_hash and presented is not None and hmac.compare_digest(stored_hash, presented)):
        raise NotOwner(instance_id)


def check_supersede(others: Iterable[InstanceRecord], supersede: Collection[str]) -> None:
    """Refuse a registration that would supersede an instance (one of ``others``: the same
    agent, the same URL, another id) whose id is not in ``supersede``: ``UrlTaken``."""
    for other in others:
        if other.instance_id not in supersede:
            raise UrlTaken(other)


def check_room(stored: int, superseded: int, max_instances: int | None) -> None:
    """Refuse a new instance when ``stored`` instances, less the ``superseded`` ones it
    replaces, already reach ``max_instances``: ``RegistryFull``."""
    if max_instances is not None and stored - superseded >= max_instances:
        raise RegistryFull(max_instances)


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


@dataclass(frozen=True)
class Registered:
    """What ``RegistryStore.put`` did: the stored instance, whether the id is new (then the
    secret whose hash was given owns it), and the instances it superseded (same agent, same
    URL, other ids: the node behind that URL restarted, so they are gone)."""

    instance: InstanceRecord
    created: bool
    superseded: tuple[InstanceRecord, ...] = ()


class RegistryStore(Protocol):
    """Persistence of agents and instances. Every method is atomic on its own."""

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
        """Register (or re-register) ``instance`` and replace its agent's card with ``agent``.

        A new id is stored with ``secret_hash`` as its owner, unless the store already holds
        ``max_instances`` (``RegistryFull``). A known id must belong to the same agent (else
        ``InstanceTaken``) and ``presented`` must own it (else ``NotOwner``); it keeps its
        owner and ``registered_at``. The other instances of the same agent at the same URL are
        superseded (removed) if their ids are all in ``supersede``, else ``UrlTaken``. A
        registration the backend cannot hold is ``Unstorable``, before anything is written.
        """
        ...

    async def heartbeat(
        self, instance_id: str, at: float, *, presented: str | None
    ) -> InstanceRecord | None:
        """Record a heartbeat; ``None`` when the instance is unknown, ``NotOwner`` when
        ``presented`` does not own it."""
        ...

    async def deregister(self, instance_id: str, *, presented: str | None) -> InstanceRecord | None:
        """An owner's ``remove``: ``NotOwner`` when ``presented`` does not own the instance."""
        ...

    async def set_status(self, instance_id: str, status: Status, reason: str, at: float) -> None:
        """Change an instance's status (no-op for an unknown instance)."""
        ...

    async def remove(self, instance_id: str) -> InstanceRecord | None:
        """Forget an instance (and its agent if it was the last); ``None`` if it was unknown.
        The registry's own decision (expired, ghost): no ownership check."""
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

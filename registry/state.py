"""``RegistryState``: what the app's lifespan opens and the routes use (``app.state.registry``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
from starlette.requests import Request

from registry.catalog import Catalog
from registry.chats import Chats
from registry.metrics import RegistryMetrics
from registry.operator import Sessions
from registry.prober import Prober
from registry.reach import Reach
from registry.recent import RecentTasks
from registry.settings import RegistrySettings
from registry.store import AgentRecord, InstanceRecord, RegistryStore
from registry.wire import InstanceOut

__all__ = ["InstanceJson", "RegistryState", "get_state"]

_to_json = InstanceOut.__pydantic_serializer__.to_json


class InstanceJson:
    """Each instance's ``InstanceOut`` JSON as last answered, kept while its records are the
    same objects: a store's view (``registry.sqlite_store``) keeps one object per instance
    until it changes, so a lookup re-encodes only what changed since (a store that makes new
    records on each read, like Consul's, gets a fresh encoding each time). Cleared whole past
    ``limit`` entries, so instances that are gone do not pile up."""

    def __init__(self, limit: int = 20_000) -> None:
        self._limit = limit
        self._parts: dict[str, tuple[InstanceRecord, AgentRecord | None, bytes]] = {}

    def of(self, inst: InstanceRecord, agent: AgentRecord | None) -> bytes:
        known = self._parts.get(inst.instance_id)
        if known is not None and known[0] is inst and known[1] is agent:
            return known[2]
        data = _to_json(InstanceOut.of(inst, agent))
        if len(self._parts) >= self._limit:
            self._parts.clear()
        self._parts[inst.instance_id] = (inst, agent, data)
        return data


@dataclass
class RegistryState:
    settings: RegistrySettings
    store: RegistryStore
    catalog: Catalog
    http: httpx.AsyncClient
    prober: Prober
    metrics: RegistryMetrics
    # Registrations whose fetches (card, /health) may run at once (``registry.api``).
    fetch_slots: asyncio.Semaphore
    # Which instances the console may ask for tasks, and the client it asks through.
    reach: Reach
    # The operator's sessions on the console (its writes: ``registry.operator``).
    sessions: Sessions
    # Agents' recent tasks, asked while their page is open (``registry.recent``).
    recent: RecentTasks
    started_at: float = field(default_factory=time.time)
    # The console's chat turns and streams (``registry.chat``).
    chats: Chats = field(default_factory=Chats)
    # Lookups' answers, encoded once per change of an instance (``registry.api``).
    instance_json: InstanceJson = field(default_factory=InstanceJson)


async def get_state(request: Request) -> RegistryState:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
    # request (a third of a heartbeat's CPU at fleet scale).
    state: RegistryState = request.app.state.registry
    return state

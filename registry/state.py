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
from registry.store import RegistryStore

__all__ = ["RegistryState", "get_state"]


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


async def get_state(request: Request) -> RegistryState:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
    # request (a third of a heartbeat's CPU at fleet scale).
    state: RegistryState = request.app.state.registry
    return state

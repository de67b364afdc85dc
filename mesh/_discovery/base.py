"""Discovery contracts, shared by the embedded-registry backend and the Consul backend.

A *node* announces itself with a ``Registration``; a *caller* finds ``Instance``s of an agent
(or of whoever offers a skill). Backends implement ``DiscoveryBackend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from mesh._errors import DiscoveryUnreachable, InstanceIdTaken, UnknownInstance

__all__ = [
    "CARD_PATH",
    "DiscoveryBackend",
    "DiscoveryUnreachable",
    "Instance",
    "InstanceIdTaken",
    "Registration",
    "Status",
    "UnknownInstance",
]

CARD_PATH = "/.well-known/agent-card.json"
Status = Literal["passing", "warning", "critical"]


@dataclass(frozen=True)
class Registration:
    """What a node announces about itself."""

    instance_id: str
    agent: str
    url: str  # base URL, e.g. http://127.0.0.1:8017
    version: str
    skills: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    card_path: str = CARD_PATH
    # Extra key/values a backend stores with the registration (Consul: service meta), e.g. the
    # registry's ownership hash. A backend's own keys (version, url, ...) take precedence.
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Instance:
    """One running replica of an agent, as discovery reports it."""

    instance_id: str
    agent: str
    url: str
    version: str = ""
    status: Status = "passing"
    skills: tuple[str, ...] = ()
    meta: dict[str, str] = field(default_factory=dict)


class DiscoveryBackend(Protocol):
    """Register nodes and find instances. Implementations translate their errors to
    ``DiscoveryError`` (``UnknownInstance`` for a heartbeat the backend does not recognise,
    ``DiscoveryUnreachable`` when nothing answered)."""

    async def register(self, registration: Registration) -> None: ...

    async def heartbeat(self, instance_id: str) -> None: ...

    async def deregister(self, instance_id: str) -> None: ...

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]: ...

    async def aclose(self) -> None: ...

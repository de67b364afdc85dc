"""Settings: everything mesh reads from the environment, read ONCE, at the edge.

``MeshSettings`` (every variable, typed and checked together), ``ModelSettings`` (what decides an
agent's model), ``NodeSettings`` (how one node runs) and ``environment()`` live in
``mesh._settings.settings``; see its docstring. They load lazily: pydantic-settings costs ~0.1 s
to import, and every ``mesh`` command needs ``DEFAULT_REGISTRY_URL`` but only some need settings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mesh._settings.settings import (
        ConsulTLS,
        MeshSettings,
        ModelSettings,
        NodeSettings,
        StoreKind,
        environment,
    )

__all__ = [
    "CONSUL_SCHEMES",
    "DEFAULT_REGISTRY_URL",
    "ConsulTLS",
    "MeshSettings",
    "ModelSettings",
    "NodeSettings",
    "StoreKind",
    "environment",
]

#: Where nodes and the CLI find the registry unless told otherwise (the one spelling of it).
DEFAULT_REGISTRY_URL = "http://127.0.0.1:8400"
#: The discovery locations that mean Consul (``mesh._discovery.consul.parse_consul_url``).
CONSUL_SCHEMES = ("consul://", "consul+http://", "consul+https://")

_LAZY = frozenset(__all__) - {"DEFAULT_REGISTRY_URL", "CONSUL_SCHEMES"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'mesh._settings' has no attribute {name!r}")
    return getattr(importlib.import_module("mesh._settings.settings"), name)

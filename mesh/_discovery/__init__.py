"""Discovery: how nodes announce themselves and callers find them.

    backend = create_backend("http://127.0.0.1:8400", token=None)   # or "consul://127.0.0.1:8500"
    registrar = Registrar(backend, Registration(...))               # node side
    client = DiscoveryClient(backend)                               # caller side

Public names load lazily so ``import mesh._discovery`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mesh._errors import ConfigError
from mesh._settings import CONSUL_SCHEMES

if TYPE_CHECKING:
    from mesh._discovery.base import DiscoveryBackend, Instance, Registration, UnknownInstance
    from mesh._discovery.client import DiscoveryClient
    from mesh._discovery.registrar import Registrar
    from mesh._discovery.registry_client import RegistryBackend
    from mesh._settings import DEFAULT_REGISTRY_URL, ConsulTLS

__all__ = [
    "DEFAULT_REGISTRY_URL",
    "DiscoveryBackend",
    "DiscoveryClient",
    "Instance",
    "Registrar",
    "Registration",
    "RegistryBackend",
    "UnknownInstance",
    "create_backend",
]

_EXPORTS = {
    "DEFAULT_REGISTRY_URL": "mesh._settings",
    "DiscoveryBackend": "mesh._discovery.base",
    "DiscoveryClient": "mesh._discovery.client",
    "Instance": "mesh._discovery.base",
    "Registrar": "mesh._discovery.registrar",
    "Registration": "mesh._discovery.base",
    "RegistryBackend": "mesh._discovery.registry_client",
    "UnknownInstance": "mesh._discovery.base",
}


def create_backend(
    url_or_consul_uri: str, token: str | None = None, *, consul_tls: ConsulTLS | None = None
) -> DiscoveryBackend:
    """The backend for a location: ``http(s)://...`` -> the mesh registry,
    ``consul://host:port`` (``consul+https://host:8501``) -> Consul. ``token`` is the registry
    token or the Consul ACL token; ``consul_tls`` the CA and client certificate for Consul
    (``MeshSettings.consul_tls``), unused for the registry."""
    location = url_or_consul_uri.strip()
    if location.startswith(("http://", "https://")):
        from mesh._discovery.registry_client import RegistryBackend

        return RegistryBackend(location, token=token)
    if location.startswith(CONSUL_SCHEMES):
        # Imported only here: python-consul is needed only by deployments that use Consul.
        from mesh._discovery.consul import ConsulBackend

        backend: DiscoveryBackend = ConsulBackend(location, token=token, tls=consul_tls)
        return backend
    raise ConfigError(
        f"discovery location {url_or_consul_uri!r} is not understood: use the registry URL "
        "(http://127.0.0.1:8400), consul://host:8500 or consul+https://host:8501"
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mesh._discovery' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

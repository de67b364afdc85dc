"""``RegistrySettings``: how one registry process runs (built by the CLI, read once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mesh._netpolicy import NetworkPolicy

__all__ = ["RegistrySettings"]


@dataclass(frozen=True)
class RegistrySettings:
    host: str = "127.0.0.1"
    port: int = 8400
    data_dir: Path = Path(".mesh/registry")
    # When set, writes (register, heartbeat, deregister) need ``Authorization: Bearer <token>``.
    token: str | None = None
    # How often each instance's /health is probed, and how long one probe may take.
    probe_interval_s: float = 5.0
    probe_timeout_s: float = 2.0
    # An instance with no heartbeat for this long is critical (nodes heartbeat every 5 s).
    ttl_s: float = 30.0
    # A critical instance is removed after this long.
    remove_after_s: float = 300.0
    # Timeout for fetching a registering instance's card.
    card_timeout_s: float = 5.0
    # Networks the registry may connect to for cards and probes (``--allow-networks``), checked
    # after DNS resolution on every connection. None: ``NetworkPolicy.default_for(host)``.
    allow_networks: NetworkPolicy | None = None
    # ``consul://host:8500``: keep instances in Consul instead of SQLite (None: SQLite).
    backend: str | None = None
    consul_token: str | None = None
    # Largest request body read; a registration is a few hundred bytes (``registry.gate``).
    max_body_bytes: int = 64 * 1024
    # Instances held at most (``--max-instances``): a new one beyond is 503 ``registry_full``.
    # It bounds the store, the page and every metric label set.
    max_instances: int = 10_000

    @property
    def network_policy(self) -> NetworkPolicy:
        """``allow_networks``, else loopback for a registry on loopback, else loopback and
        private ranges (link-local is refused whatever the policy says)."""
        return self.allow_networks or NetworkPolicy.default_for(self.host)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "registry.db"

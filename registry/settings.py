"""How one registry process runs: ``RegistrySettings`` (built once by ``registry.cli``, passed
down) and ``RegistryEnvironment`` (the variables the registry reads, each checked where it is
read; the flags given on the command line override them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mesh._errors import ConfigError
from mesh._keys import TrustRoot
from mesh._netpolicy import NetworkPolicy
from mesh._settings import ConsulTLS
from mesh._tls import ServerTLS

__all__ = ["FLEET_LIMIT", "RegistryEnvironment", "RegistrySettings", "token_problem"]

# The instances one embedded registry process holds at the default intervals (5 s heartbeats and
# probes) with headroom on one core, as measured by tests.bench.registry_scale (docs/performance.md,
# "The registry at fleet scale"); past it, Consul (docs/production.md). The registry warns at
# WARN_SHARE of it, or of --max-instances when that is lower.
FLEET_LIMIT = 10_000
WARN_SHARE = 0.8


def token_problem(token: str | None) -> str | None:
    """Why no node could present this write token (blank, or spaces at either end: a bearer
    value is trimmed, so every write would be refused), else None."""
    if token is None or (token.strip() and token == token.strip()):
        return None
    what = "is blank" if not token.strip() else "has spaces at either end"
    return (
        f"the write token {what}: no node could present it, so every write would be refused; "
        "set a secret without spaces, e.g. `export MESH_REGISTRY_TOKEN=$(openssl rand -hex 16)`, "
        "or unset it (open writes, loopback only)"
    )


def _network_policy(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return NetworkPolicy.parse(value)
    except ConfigError as exc:
        # pydantic collects ValueErrors (every bad value in one error); a ConfigError would stop
        # at the first.
        raise ValueError(str(exc)) from None


class RegistryEnvironment(BaseSettings):
    """``MESH_REGISTRY_TOKEN``, ``MESH_REGISTRY_ALLOW_NETWORKS``, ``CONSUL_HTTP_TOKEN`` and
    ``MESH_TOKEN``, read
    from the environment by pydantic-settings; keyword arguments (the flags) win over them. An
    empty variable counts as unset. A bad value is a ``pydantic.ValidationError`` listing every
    one, located by the variable's name (by the field's name for a keyword)."""

    model_config = SettingsConfigDict(
        case_sensitive=True,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        validate_by_name=True,
        validate_by_alias=True,
        arbitrary_types_allowed=True,
    )

    token: SecretStr | None = Field(default=None, validation_alias="MESH_REGISTRY_TOKEN")
    # NoDecode: a list of networks, not JSON (pydantic-settings decodes "complex" fields).
    allow_networks: Annotated[NetworkPolicy | None, NoDecode, BeforeValidator(_network_policy)] = (
        Field(default=None, validation_alias="MESH_REGISTRY_ALLOW_NETWORKS")
    )
    consul_token: SecretStr | None = Field(default=None, validation_alias="CONSUL_HTTP_TOKEN")
    # The nodes' token, sent only to the instances ``registry.reach`` trusts (the console's
    # views of tasks ask the nodes with it).
    mesh_token: SecretStr | None = Field(default=None, validation_alias="MESH_TOKEN")
    # TLS to Consul (consul+https://), as Consul's CLI reads it.
    consul_cacert: Path | None = Field(default=None, validation_alias="CONSUL_CACERT")
    consul_client_cert: Path | None = Field(default=None, validation_alias="CONSUL_CLIENT_CERT")
    consul_client_key: Path | None = Field(default=None, validation_alias="CONSUL_CLIENT_KEY")
    # The mesh's keys (``mesh keys``): the registry reads only the trust root (root.jwk) there.
    keys: Path | None = Field(default=None, validation_alias="MESH_KEYS")
    # HTTPS (``mesh._tls``): the certificate and key served, the CA bundle probes, card fetches
    # and the console's gathering verify the nodes with.
    tls_cert: Path | None = Field(default=None, validation_alias="MESH_TLS_CERT")
    tls_key: Path | None = Field(default=None, validation_alias="MESH_TLS_KEY")
    tls_ca: Path | None = Field(default=None, validation_alias="MESH_TLS_CA")

    @field_validator(
        "consul_cacert", "consul_client_cert", "consul_client_key", "tls_cert", "tls_key", "tls_ca"
    )
    @classmethod
    def _file(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError("no such file: name the PEM file, or unset it")
        return path

    @field_validator("token")
    @classmethod
    def _presentable(cls, token: SecretStr | None) -> SecretStr | None:
        problem = token_problem(token.get_secret_value() if token else None)
        if problem:
            raise ValueError(problem)
        return token


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
    # Probes in flight at once (``--probe-concurrency``); the rest wait in a semaphore.
    probe_concurrency: int = 64
    # Probes per round at most (``--probe-budget``); past it instances are probed in turn.
    probe_budget: int = 1000
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
    # ``postgresql://...``: keep instances in PostgreSQL, shared by registry replicas (None:
    # SQLite or Consul). Never shown: the URL may hold a password.
    store_url: str | None = field(default=None, repr=False)
    consul_token: str | None = None
    consul_tls: ConsulTLS | None = None
    # Largest request body read; a registration is a few hundred bytes (``registry.gate``).
    max_body_bytes: int = 64 * 1024
    # Instances held at most (``--max-instances``): a new one beyond is 503 ``registry_full``.
    # It bounds the store, the page and every metric label set.
    max_instances: int = 10_000
    # The nodes' ``MESH_TOKEN``: the console asks trusted instances for tasks with it
    # (``registry.reach``).
    mesh_token: str | None = None
    # The mesh's trust root (``MESH_KEYS`` / ``--keys``): a registering card must be signed by a
    # key it certifies for the agent the card names (``registry.card.check_signature``).
    trust_root: TrustRoot | None = None
    # HTTPS: the certificate and key served (``--tls-cert``/``MESH_TLS_CERT``); None: HTTP.
    tls: ServerTLS | None = None
    # The CA bundle the registry verifies HTTPS nodes with (``MESH_TLS_CA``); None: the
    # system's trust store (``mesh._tls.trust``).
    tls_ca: Path | None = None

    @property
    def url(self) -> str:
        """Where the registry listens (its own scheme, host and port)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def network_policy(self) -> NetworkPolicy:
        """``allow_networks``, else loopback for a registry on loopback, else loopback and
        private ranges (link-local is refused whatever the policy says)."""
        return self.allow_networks or NetworkPolicy.default_for(self.host)

    @property
    def warn_at(self) -> int | None:
        """How many instances make the registry warn that it nears what it should hold; None
        on Consul (Consul holds the instances and runs the checks)."""
        if self.backend:
            return None
        return max(1, int(WARN_SHARE * min(self.max_instances, FLEET_LIMIT)))

    @property
    def db_path(self) -> Path:
        return self.data_dir / "registry.db"

"""Settings: everything mesh reads from the environment, read ONCE, at the edge.

``MeshSettings`` is every variable mesh reads (``MESH_*``, the model keys, ``CONSUL_HTTP_TOKEN``)
as a typed field, validated by pydantic-settings: a bad environment is ONE ``ConfigError`` naming
every bad variable and what to do. Secrets are ``SecretStr`` (never in a repr or a log).

Entry points build it (``mesh serve``, ``mesh up``, ``mesh call``, ``mesh chat``:
``MeshSettings.from_environment()``) and the rest of mesh receives what it needs. A script (a
``Runner``, or a ``remote()`` toolset used outside a node) is its own edge: ``environment()`` reads
the variables when one of them first needs them (a Runner when it is built, a toolset when it
opens its clients).

``NodeSettings`` is how one node runs: flags over ``MESH_*`` variables over defaults.

A ``.env`` file is read only when ``MESH_ENV_FILE`` names one (variables set in the environment
win over the file); a ``.env`` in the working directory is never picked up by surprise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mesh._errors import ConfigError
from mesh._netpolicy import NetworkPolicy
from mesh._policy import CallPolicy
from mesh._settings import CONSUL_SCHEMES, DEFAULT_REGISTRY_URL
from mesh._tls import ServerTLS

__all__ = [
    "ConsulTLS",
    "MeshSettings",
    "ModelSettings",
    "NodeSettings",
    "StoreKind",
    "environment",
]

StoreKind = Literal["sqlite", "memory", "postgresql"]
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_MIB = 1024 * 1024


def _var(name: str, default: Any = None) -> Any:
    """A field read from the variable ``name`` (exactly: variables are case-sensitive)."""
    return Field(default, validation_alias=name)


class ModelSettings(BaseModel):
    """What decides the model an LLM agent runs on (``mesh._models.resolve_model``)."""

    model_config = ConfigDict(frozen=True)

    #: ``GOOGLE_API_KEY`` (or ``GEMINI_API_KEY``).
    api_key: SecretStr | None = None
    #: ``GOOGLE_GENAI_USE_VERTEXAI``: Vertex AI (``project``/``location`` with ADC credentials,
    #: or an express-mode ``api_key``).
    vertex: bool = False
    project: str | None = None
    location: str | None = None
    #: ``GOOGLE_GEMINI_BASE_URL``: another Gemini endpoint (a proxy, a recorded server).
    base_url: str | None = None
    #: ``MESH_MODEL=scripted`` (``mesh serve --offline``): run on the offline scripted model,
    #: on purpose, wherever the node listens.
    offline: bool = False
    #: ``MESH_REQUIRE_MODEL=1``: a model name without a key is an error, not the scripted model
    #: (always so for a node listening beyond loopback, unless ``offline``).
    require: bool = False
    #: ``MESH_MODEL_PRICES``: model name -> (input, output) price per 1M tokens, for the cost
    #: the registry's console shows (a model without a price shows no cost).
    prices: dict[str, tuple[float, float]] = {}

    @property
    def gemini(self) -> bool:
        """Whether Gemini is configured (a key, or Vertex AI)."""
        return self.api_key is not None or self.vertex


@dataclass(frozen=True)
class ConsulTLS:
    """How mesh talks TLS to Consul (``consul+https://``): the variables Consul's own CLI reads
    (``CONSUL_CACERT``, ``CONSUL_CAPATH``, ``CONSUL_CLIENT_CERT``, ``CONSUL_CLIENT_KEY``,
    ``CONSUL_HTTP_SSL_VERIFY``), passed to py-consul's ``verify`` and ``cert``."""

    ca_file: Path | None = None
    ca_path: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = field(default=None, repr=False)
    verify: bool = True

    @property
    def verify_arg(self) -> bool | str:
        """requests' ``verify``: the CA file or directory to trust, else the system's (True),
        or False (``CONSUL_HTTP_SSL_VERIFY=false``: never in production)."""
        if not self.verify:
            return False
        ca = self.ca_file or self.ca_path
        return str(ca) if ca is not None else True

    @property
    def cert_arg(self) -> str | tuple[str, str] | None:
        """requests' ``cert``: the client certificate (and its key) Consul may require
        (``verify_incoming``)."""
        if self.cert_file is None:
            return None
        return (str(self.cert_file), str(self.key_file)) if self.key_file else str(self.cert_file)


class MeshSettings(BaseSettings):
    """Every environment variable mesh reads, typed. ``from_environment()`` reads the process
    environment (and ``MESH_ENV_FILE``); ``from_env(mapping)`` reads a mapping (tests)."""

    model_config = SettingsConfigDict(
        case_sensitive=True,
        extra="ignore",
        frozen=True,
        env_ignore_empty=True,
        arbitrary_types_allowed=True,
    )

    log_level: str = _var("MESH_LOG_LEVEL", "INFO")
    data_dir: Path | None = _var("MESH_DATA_DIR")
    #: Where a node keeps tasks and sessions: ``sqlite`` (default), or a ``postgresql://`` URL
    #: its replicas share (``mesh._pg``). A secret: the URL may hold a password.
    store: SecretStr | None = _var("MESH_STORE")
    #: Seconds a replica on a shared store may go unseen before its running tasks are ended.
    replica_lease_s: float = _var("MESH_REPLICA_LEASE", 15.0)
    #: On a shared store: the reader connections kept open and opened at most (``mesh._pg``:
    #: reads go to them, writes to one writer connection); MAX 0: reads queue with the writes.
    pg_pool_min: int = _var("MESH_PG_POOL_MIN", 1)
    pg_pool_max: int = _var("MESH_PG_POOL_MAX", 4)
    #: ``consul://host:port`` (or ``consul+https://``); None: the registry.
    discovery: str | None = _var("MESH_DISCOVERY")
    registry: str | None = _var("MESH_REGISTRY")
    registry_token: SecretStr | None = _var("MESH_REGISTRY_TOKEN")
    public_url: str | None = _var("MESH_PUBLIC_URL")
    token: SecretStr | None = _var("MESH_TOKEN")
    #: The agent's key folder (``mesh keys issue``) or the mesh's: signed cards (``mesh._keys``).
    keys: Path | None = _var("MESH_KEYS")
    fastpath: bool = _var("MESH_FASTPATH", True)
    introspect_instruction: bool = _var("MESH_INTROSPECT_INSTRUCTION", False)
    max_body_bytes: int = _var("MESH_MAX_BODY_BYTES", 10 * _MIB)
    max_inflight_bytes: int = _var("MESH_MAX_INFLIGHT_BYTES", 16 * _MIB)
    max_text_bytes: int = _var("MESH_MAX_TEXT_BYTES", 64 * 1024)
    max_answer_bytes: int = _var("MESH_MAX_ANSWER_BYTES", 32 * _MIB)
    body_timeout_s: float = _var("MESH_BODY_TIMEOUT", 30.0)
    # NoDecode: a list of networks, not JSON.
    peer_networks: Annotated[NetworkPolicy | None, NoDecode] = _var("MESH_PEER_NETWORKS")
    push_networks: Annotated[NetworkPolicy | None, NoDecode] = _var("MESH_PUSH_NETWORKS")
    #: Which callers may call which skills (``mesh._policy``); unset: every admitted call.
    allow: Annotated[CallPolicy | None, NoDecode] = _var("MESH_ALLOW")
    consul_token: SecretStr | None = _var("CONSUL_HTTP_TOKEN")
    consul_cacert: Path | None = _var("CONSUL_CACERT")
    consul_capath: Path | None = _var("CONSUL_CAPATH")
    consul_client_cert: Path | None = _var("CONSUL_CLIENT_CERT")
    consul_client_key: Path | None = _var("CONSUL_CLIENT_KEY")
    consul_ssl_verify: bool = _var("CONSUL_HTTP_SSL_VERIFY", True)
    #: HTTPS (``mesh._tls``): the certificate and key this process serves with, and the CA
    #: bundle it verifies the servers it calls with (unset: the system's trust store).
    tls_cert: Path | None = _var("MESH_TLS_CERT")
    tls_key: Path | None = _var("MESH_TLS_KEY")
    tls_ca: Path | None = _var("MESH_TLS_CA")
    google_api_key: SecretStr | None = _var("GOOGLE_API_KEY")
    gemini_api_key: SecretStr | None = _var("GEMINI_API_KEY")
    use_vertex: bool = _var("GOOGLE_GENAI_USE_VERTEXAI", False)
    cloud_project: str | None = _var("GOOGLE_CLOUD_PROJECT")
    cloud_location: str | None = _var("GOOGLE_CLOUD_LOCATION")
    gemini_base_url: str | None = _var("GOOGLE_GEMINI_BASE_URL")
    model: Literal["scripted"] | None = _var("MESH_MODEL")
    require_model: bool = _var("MESH_REQUIRE_MODEL", False)
    # NoDecode: "model=in/out,...", not JSON.
    model_prices: Annotated[dict[str, tuple[float, float]], NoDecode] = _var(
        "MESH_MODEL_PRICES", {}
    )
    #: Retention of ``node.db`` (``mesh._retention``, docs/node.md "Retention"): terminal tasks
    #: kept this long (seconds; "7d", "12h", "30m" too) and at most this many, sessions idle
    #: this long, a sweep this often. "off" turns one limit off.
    retain_tasks_for_s: float | None = _var("MESH_RETAIN_TASKS_FOR", 7 * 86400.0)
    retain_tasks_max: int | None = _var("MESH_RETAIN_TASKS_MAX", 100_000)
    retain_sessions_for_s: float | None = _var("MESH_RETAIN_SESSIONS_FOR", 30 * 86400.0)
    retention_interval_s: float = _var("MESH_RETENTION_INTERVAL", 60.0)

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MeshSettings:
        """Settings from ``env`` alone (the process environment is not read). An empty value
        is an unset variable. ``ConfigError`` names every bad variable."""
        given = {k: v for k, v in env.items() if v != ""}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    @classmethod
    def from_environment(cls, env_file: str | Path | None = None) -> MeshSettings:
        """Settings from the process environment, over ``env_file`` (or the file
        ``MESH_ENV_FILE`` names) when one is given. ``ConfigError`` names every bad variable."""
        path = env_file or os.environ.get("MESH_ENV_FILE") or None
        if path is not None and not Path(path).is_file():
            raise ConfigError(
                f"MESH_ENV_FILE={str(path)!r}: no such file; name an existing .env file or unset it"
            )
        try:
            return cls(_env_file=path)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    # -- validation -------------------------------------------------------------------------
    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> Any:
        level = str(value).strip().upper()
        if level not in _LEVELS:
            raise ValueError(f"use one of {', '.join(_LEVELS)}")
        return level

    @field_validator("discovery", mode="before")
    @classmethod
    def _discovery(cls, value: Any) -> Any:
        if value is None:
            return None
        where = str(value).strip()
        if where in ("", "registry"):
            return None
        if not where.startswith(CONSUL_SCHEMES):
            raise ValueError(
                "use 'registry' (the default), consul://host:8500 or consul+https://host:8501"
            )
        return where

    @field_validator(
        "consul_cacert",
        "consul_client_cert",
        "consul_client_key",
        "tls_cert",
        "tls_key",
        "tls_ca",
        mode="after",
    )
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError("no such file: name the PEM file, or unset it")
        return value

    @field_validator("keys", mode="after")
    @classmethod
    def _keys_folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(
                "no such folder: give the folder `mesh keys issue DIR AGENT` wrote, or unset it"
            )
        return value

    @field_validator("consul_capath", mode="after")
    @classmethod
    def _directory(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError("no such directory: name the directory of CA certificates")
        return value

    @field_validator("token", "registry_token", mode="before")
    @classmethod
    def _bearer(cls, value: Any) -> Any:
        if value is None:
            return None
        # A token with spaces at either end can never match what a caller sends (the bearer
        # value is trimmed), and one with other characters cannot go in an HTTP header (the
        # node presents it to its peers): either way every call would be refused.
        raw = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        if not (raw.isascii() and raw.isprintable()) or " " in raw:
            what = (
                "only spaces" if not raw.strip() else "spaces or characters outside visible ASCII"
            )
            raise ValueError(
                f"has {what}: no caller could present it; use visible ASCII characters "
                "(e.g. the output of `openssl rand -hex 16`), or unset it"
            )
        return value

    @field_validator(
        "max_body_bytes", "max_inflight_bytes", "max_text_bytes", "max_answer_bytes", mode="before"
    )
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        raw = str(value).strip()
        if not raw.isdigit() or int(raw) <= 0:
            raise ValueError("give a positive number of bytes, e.g. 1048576")
        return int(raw)

    @field_validator("body_timeout_s", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError("give a positive number of seconds, e.g. 30")
        return seconds

    @field_validator("peer_networks", "push_networks", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> Any:
        if value is None or isinstance(value, NetworkPolicy):
            return value
        try:
            return NetworkPolicy.parse(str(value))
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: Any) -> Any:
        if value is None or isinstance(value, CallPolicy):
            return value
        try:
            return CallPolicy.parse(str(value))
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc

    @field_validator("model_prices", mode="before")
    @classmethod
    def _prices(cls, value: Any) -> Any:
        return parse_prices(value) if isinstance(value, str) else value

    @field_validator("retain_tasks_for_s", "retain_sessions_for_s", mode="before")
    @classmethod
    def _retain_for(cls, value: Any) -> Any:
        if value is None or isinstance(value, (int, float)):
            return value
        if str(value).strip().lower() == "off":
            return None
        return parse_duration(str(value), what=' or "off"')

    @field_validator("retention_interval_s", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> Any:
        return value if isinstance(value, (int, float)) else parse_duration(str(value))

    @field_validator("retain_tasks_max", mode="before")
    @classmethod
    def _retain_max(cls, value: Any) -> Any:
        if value is None or isinstance(value, int):
            return value
        raw = str(value).strip().replace("_", "")
        if raw.lower() == "off":
            return None
        if not raw.isdigit() or int(raw) <= 0:
            raise ValueError('give a positive number of tasks, e.g. 100000, or "off"')
        return int(raw)

    # -- views ------------------------------------------------------------------------------
    @property
    def models(self) -> ModelSettings:
        """The model part (``GOOGLE_*``, ``GEMINI_API_KEY``, ``MESH_MODEL``,
        ``MESH_REQUIRE_MODEL``)."""
        return ModelSettings(
            api_key=self.google_api_key or self.gemini_api_key,
            vertex=self.use_vertex,
            project=self.cloud_project,
            location=self.cloud_location,
            base_url=self.gemini_base_url,
            offline=self.model == "scripted",
            require=self.require_model,
            prices=self.model_prices,
        )

    @property
    def registry_url(self) -> str:
        """The registry the CLI and nodes use: ``MESH_REGISTRY``, else the default."""
        return (self.registry or DEFAULT_REGISTRY_URL).rstrip("/")

    @property
    def discovery_location(self) -> str:
        """``consul://...`` (``MESH_DISCOVERY``), else the registry's URL."""
        return self.discovery or self.registry_url

    @property
    def discovery_token(self) -> str | None:
        """The token for the discovery in use: ``CONSUL_HTTP_TOKEN`` or ``MESH_REGISTRY_TOKEN``."""
        return _reveal(self.consul_token if self.discovery else self.registry_token)

    @property
    def consul_tls(self) -> ConsulTLS:
        """TLS to Consul (``CONSUL_CACERT`` ...), for ``consul+https://``."""
        return ConsulTLS(
            ca_file=self.consul_cacert,
            ca_path=self.consul_capath,
            cert_file=self.consul_client_cert,
            key_file=self.consul_client_key,
            verify=self.consul_ssl_verify,
        )

    def server_tls(
        self, cert: str | Path | None = None, key: str | Path | None = None
    ) -> ServerTLS | None:
        """What this process serves HTTPS with: the flags given (``--tls-cert``/``--tls-key``)
        over ``MESH_TLS_CERT``/``MESH_TLS_KEY``; None: plain HTTP. ``ConfigError`` when only one
        is given or they do not make a pair."""
        return ServerTLS.of(
            cert or self.tls_cert,
            key or self.tls_key,
            names=("--tls-cert / MESH_TLS_CERT", "--tls-key / MESH_TLS_KEY"),
        )

    @property
    def mesh_token(self) -> str | None:
        """``MESH_TOKEN``, to send as a bearer token."""
        return _reveal(self.token)


_SECRET_FIELDS = frozenset(
    name for name, f in MeshSettings.model_fields.items() if "SecretStr" in str(f.annotation)
)
_ADVICE = {
    "bool_parsing": "use 1 (on) or 0 (off)",
    "literal_error": "the only value is 'scripted' (the offline model, on purpose); unset it "
    "for the agent's own model",
}


def parse_prices(text: str) -> dict[str, tuple[float, float]]:
    """``"gemini-2.5-flash=0.30/2.50,other=1/4"``: per model, the price of 1M input tokens and
    of 1M output tokens. ``ValueError`` naming the entry that is not one."""
    prices: dict[str, tuple[float, float]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        model, _, pair = entry.rpartition("=")
        first, _, second = pair.partition("/")
        try:
            price = (float(first), float(second))
        except ValueError:
            price = (-1.0, -1.0)
        if not model.strip() or not all(0 <= p < float("inf") for p in price):
            raise ValueError(
                f"{entry!r} is not MODEL=INPUT/OUTPUT (prices per 1M tokens), "
                "e.g. gemini-2.5-flash=0.30/2.50"
            )
        prices[model.strip()] = price
    return prices


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, *, what: str = "") -> float:
    """Seconds from ``"90"``, ``"90s"``, ``"30m"``, ``"12h"`` or ``"7d"``; positive."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:])
    number = raw[:-1] if unit is not None else raw
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"give a positive duration: seconds, or with s, m, h or d (e.g. 7d){what}")
    return seconds


def _describe(exc: ValidationError) -> str:
    """One message naming every bad variable and what to do, without a secret's value."""
    aliases = {f.validation_alias: name for name, f in MeshSettings.model_fields.items()}
    problems = []
    for error in exc.errors():
        variable = str(error["loc"][0]) if error["loc"] else "?"
        if error["type"] == "value_error":
            advice = str(error["ctx"]["error"]) if "ctx" in error else error["msg"]
        else:
            advice = _ADVICE.get(error["type"], error["msg"])
        if aliases.get(variable) in _SECRET_FIELDS:
            # Never the value: a near-miss of a secret is still most of the secret.
            problems.append(f"{variable} {advice}")
        else:
            problems.append(f"{variable}={error['input']!r}: {advice}")
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} bad settings:\n  " + "\n  ".join(problems)


def _reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


def environment() -> MeshSettings:
    """The process environment's settings, for the parts of a script that need them when they
    first do (a ``Runner`` built without settings resolves its model; a ``remote()`` toolset
    outside a node opens its clients): the script is its own edge. A node never calls this."""
    return MeshSettings.from_environment()


@dataclass(frozen=True)
class NodeSettings:
    """How one node runs. ``data_dir`` holds ``node.db`` (tasks, sessions, idempotency keys)."""

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path(".mesh/node")
    # The URL other agents use (the card and the registry advertise it).
    public_url: str | None = None
    # Registry to announce the node to; None: do not register (``--no-register``).
    registry: str | None = None
    # Secrets stay out of the repr (a logged or printed settings object).
    registry_token: str | None = field(default=None, repr=False)
    # ``consul://host:port`` (or ``consul+https://``) to register with Consul instead of the
    # registry; ``consul_tls``: its CA and client certificate.
    consul: str | None = None
    consul_token: str | None = field(default=None, repr=False)
    consul_tls: ConsulTLS = field(default_factory=ConsulTLS)
    # HTTPS: the certificate and key served (``--tls-cert``/``MESH_TLS_CERT``); None: HTTP.
    tls: ServerTLS | None = None
    # When set, A2A calls (POST /) need ``Authorization: Bearer <token>``, and the node sends it
    # to its peers. The card, /health, /metrics and /introspect stay public.
    token: str | None = field(default=None, repr=False)
    # The agent's key material (``MESH_KEYS`` / ``--keys``): a node with keys signs its card and
    # verifies its peers' cards against the mesh root (``mesh._keys``). A path, never the keys.
    keys: Path | None = None
    store: StoreKind = "sqlite"
    # With store "postgresql": the database URL (``--store`` / ``MESH_STORE``), never shown.
    store_url: str | None = field(default=None, repr=False)
    # Replicas on store_url: one unseen this long has its running tasks ended (interrupted).
    replica_lease_s: float = 15.0
    # With store_url: reader connections, at least and at most (``MESH_PG_POOL_MIN``/``_MAX``).
    pg_pool_min: int = 1
    pg_pool_max: int = 4
    # Serve typed function skills' blocking sends without the SDK's task machinery
    # (mesh._a2a.fastpath); MESH_FASTPATH=0 sends everything through the SDK.
    fastpath: bool = True
    log_level: str = "INFO"
    introspect_instruction: bool = False
    # Seconds in-flight tasks get to finish after SIGTERM.
    grace_seconds: float = 20.0
    # Largest accepted request body (JSON-RPC), bytes.
    max_body_bytes: int = 10 * _MIB
    # Request bodies held at once (being read or being worked on), bytes: past it a new request
    # gets 503 "busy, retry" (one request alone is always let in, up to max_body_bytes).
    max_inflight_bytes: int = 16 * _MIB
    # Seconds a request body may take to arrive, from the end of its headers: past it 408 and
    # the connection closed (uvicorn has no such timeout; an idle client held its request).
    body_timeout_s: float = 30.0
    # Largest answer (or stream event) read from a peer this node delegates to, bytes: a bigger
    # one is not an A2A answer, and the call fails over to the next instance.
    max_answer_bytes: int = 32 * _MIB
    # Largest text turn (a chat message, an LLM skill's input), UTF-8 bytes: a longer one is
    # REJECTED before any model work.
    max_text_bytes: int = 64 * 1024
    # Networks the peers this node delegates to may be on (checked after DNS resolution);
    # None: ``NetworkPolicy.default_for(host)``. See ``peer_policy``.
    peer_networks: NetworkPolicy | None = None
    # Networks push notification webhooks may be on (checked when a config is set and again
    # at every connection); None: public addresses only, a2a-sdk's rule. See ``push_policy``.
    push_networks: NetworkPolicy | None = None
    # Which callers may call which skills (``MESH_ALLOW``, ``mesh._policy``); None: any caller
    # the credential check admits.
    policy: CallPolicy | None = None
    # The model keys and choices (no key by default: a named model runs offline on loopback).
    models: ModelSettings = field(default_factory=ModelSettings)
    # Retention of node.db (``mesh._retention``): terminal tasks kept this long (seconds) and
    # at most this many, sessions idle this long; None: that limit is off. Swept this often.
    retain_tasks_for_s: float | None = 7 * 86400.0
    retain_tasks_max: int | None = 100_000
    retain_sessions_for_s: float | None = 30 * 86400.0
    retention_interval_s: float = 60.0

    @property
    def url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def exposed(self) -> bool:
        """Bound to an address other machines can reach (not loopback)."""
        return self.host not in {"127.0.0.1", "localhost", "::1"}

    @property
    def db_path(self) -> Path:
        return self.data_dir / "node.db"

    @property
    def peer_policy(self) -> NetworkPolicy:
        """Where peers may be: ``MESH_PEER_NETWORKS``, else loopback for a node bound to
        loopback, loopback and private ranges for one bound beyond it."""
        return self.peer_networks or NetworkPolicy.default_for(self.host)

    @property
    def push_policy(self) -> NetworkPolicy:
        """Where push notification webhooks may be: ``MESH_PUSH_NETWORKS``, else public
        addresses only (what a2a-sdk's ``validate_push_notification_url`` accepts)."""
        return self.push_networks or NetworkPolicy.parse("public")

    @property
    def model_required(self) -> bool:
        """Whether a named model must run for real (a key must be there): the operator said
        so (``MESH_REQUIRE_MODEL=1``), or the node listens beyond loopback; unless the offline
        model was chosen (``MESH_MODEL=scripted``)."""
        return not self.models.offline and (self.models.require or self.exposed)

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        agent_name: str,
        host: str | None = None,
        port: int | None = None,
        data_dir: str | Path | None = None,
        registry: str | None = None,
        no_register: bool = False,
        store: str | None = None,
        grace_seconds: float | None = None,
    ) -> NodeSettings:
        """Settings from flags (given values) over the variables in ``env`` over defaults."""
        return cls.build(
            MeshSettings.from_env(env),
            agent_name=agent_name,
            host=host,
            port=port,
            data_dir=data_dir,
            registry=registry,
            no_register=no_register,
            store=store,
            grace_seconds=grace_seconds,
        )

    @classmethod
    def build(
        cls,
        mesh: MeshSettings,
        *,
        agent_name: str,
        host: str | None = None,
        port: int | None = None,
        data_dir: str | Path | None = None,
        registry: str | None = None,
        no_register: bool = False,
        store: str | None = None,
        grace_seconds: float | None = None,
        offline: bool = False,
        keys: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> NodeSettings:
        """Settings from flags (given values) over ``mesh`` (the variables) over defaults."""
        problems = []
        store_kind = store or _reveal(mesh.store) or "sqlite"
        store_url = None
        if store_kind.startswith(("postgresql://", "postgres://")):
            store_kind, store_url = "postgresql", store_kind
        elif store_kind not in ("sqlite", "memory"):
            shown = repr(store_kind) if "@" not in store_kind else "(a URL, not shown)"
            problems.append(
                f"--store / MESH_STORE {shown}: use 'sqlite' or a postgresql://user@host/db URL"
            )
        if mesh.replica_lease_s <= 0:
            problems.append(f"MESH_REPLICA_LEASE={mesh.replica_lease_s}: give seconds above 0")
        low, high = mesh.pg_pool_min, mesh.pg_pool_max
        if (high and not 1 <= low <= high) or not 0 <= high <= 100:
            problems.append(
                f"MESH_PG_POOL_MIN={low} MESH_PG_POOL_MAX={high}: give 1 <= MIN <= MAX <= 100 "
                "(or MAX=0: no reader pool)"
            )
        chosen_port = 8000 if port is None else port
        if not 0 < chosen_port < 65536:
            problems.append(f"--port {chosen_port}: use a port between 1 and 65535")
        models = mesh.models
        if offline:
            models = models.model_copy(update={"offline": True})
        if keys is not None and not Path(keys).is_dir():
            problems.append(f"--keys {str(keys)!r}: no such folder (see `mesh keys issue`)")
        if models.offline and models.require:
            problems.append(
                "MESH_REQUIRE_MODEL=1 and the offline model (MESH_MODEL=scripted or --offline) "
                "contradict each other: unset one"
            )
        tls = None
        try:
            tls = mesh.server_tls(tls_cert, tls_key)
        except ConfigError as exc:
            problems.append(str(exc))
        if problems:
            raise ConfigError("\n  ".join(problems))
        consul = None if no_register else mesh.discovery
        reg: str | None = None
        if not no_register and consul is None:
            # Like the CLI, a node finds the registry at the default address unless told
            # otherwise; while none answers it keeps serving and retries in the background.
            reg = registry or mesh.registry or DEFAULT_REGISTRY_URL
        return cls(
            host=host or "127.0.0.1",
            port=chosen_port,
            data_dir=Path(data_dir or mesh.data_dir or Path(".mesh") / agent_name),
            public_url=mesh.public_url,
            tls=tls,
            registry=reg,
            registry_token=_reveal(mesh.registry_token),
            token=mesh.mesh_token,
            keys=Path(keys) if keys is not None else mesh.keys,
            fastpath=mesh.fastpath,
            consul=consul,
            consul_token=_reveal(mesh.consul_token),
            consul_tls=mesh.consul_tls,
            store=store_kind,  # type: ignore[arg-type]
            store_url=store_url,
            replica_lease_s=mesh.replica_lease_s,
            pg_pool_min=mesh.pg_pool_min,
            pg_pool_max=mesh.pg_pool_max,
            log_level=mesh.log_level,
            introspect_instruction=mesh.introspect_instruction,
            grace_seconds=20.0 if grace_seconds is None else grace_seconds,
            max_body_bytes=mesh.max_body_bytes,
            max_inflight_bytes=mesh.max_inflight_bytes,
            max_text_bytes=mesh.max_text_bytes,
            body_timeout_s=mesh.body_timeout_s,
            max_answer_bytes=mesh.max_answer_bytes,
            peer_networks=mesh.peer_networks,
            push_networks=mesh.push_networks,
            policy=mesh.allow,
            models=models,
            retain_tasks_for_s=mesh.retain_tasks_for_s,
            retain_tasks_max=mesh.retain_tasks_max,
            retain_sessions_for_s=mesh.retain_sessions_for_s,
            retention_interval_s=mesh.retention_interval_s,
        )

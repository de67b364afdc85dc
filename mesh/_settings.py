"""``NodeSettings``: everything a node reads from flags and the environment, read ONCE.

Only entry points (``mesh serve``) build settings; the rest of mesh receives them. Flags win
over ``MESH_*`` variables, which win over defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mesh._errors import ConfigError
from mesh._netpolicy import NetworkPolicy

__all__ = ["DEFAULT_REGISTRY", "NodeSettings", "StoreKind"]

DEFAULT_REGISTRY = "http://127.0.0.1:8400"
StoreKind = Literal["sqlite", "memory"]
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR"}


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
    registry_token: str | None = None
    # ``consul://host:port`` to register with Consul instead of the registry.
    consul: str | None = None
    consul_token: str | None = None
    # When set, A2A calls (POST /) need ``Authorization: Bearer <token>``, and the node sends it
    # to its peers. The card, /health, /metrics and /introspect stay public.
    token: str | None = None
    store: StoreKind = "sqlite"
    # Serve typed function skills' blocking sends without the SDK's task machinery
    # (mesh._a2a.fastpath); MESH_FASTPATH=0 sends everything through the SDK.
    fastpath: bool = True
    log_level: str = "INFO"
    introspect_instruction: bool = False
    # Seconds in-flight tasks get to finish after SIGTERM.
    grace_seconds: float = 20.0
    # Largest accepted request body (JSON-RPC), bytes.
    max_body_bytes: int = 10 * 1024 * 1024
    # Request bodies held at once (being read or being worked on), bytes: past it a new request
    # gets 503 "busy, retry" (one request alone is always let in, up to max_body_bytes).
    max_inflight_bytes: int = 16 * 1024 * 1024
    # Seconds a request body may take to arrive, from the end of its headers: past it 408 and
    # the connection closed (uvicorn has no such timeout; an idle client held its request).
    body_timeout_s: float = 30.0
    # Largest answer (or stream event) read from a peer this node delegates to, bytes: a bigger
    # one is not an A2A answer, and the call fails over to the next instance.
    max_answer_bytes: int = 32 * 1024 * 1024
    # Largest text turn (a chat message, an LLM skill's input), UTF-8 bytes: a longer one is
    # REJECTED before any model work.
    max_text_bytes: int = 64 * 1024
    # Networks the peers this node delegates to may be on (checked after DNS resolution);
    # None: ``NetworkPolicy.default_for(host)``. See ``peer_policy``.
    peer_networks: NetworkPolicy | None = None

    @property
    def url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::", ""} else self.host
        return f"http://{host}:{self.port}"

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
        """Settings from flags (given values) over ``MESH_*`` variables over defaults."""
        level = env.get("MESH_LOG_LEVEL", "INFO").upper()
        if level not in _LEVELS:
            raise ConfigError(f"MESH_LOG_LEVEL={level!r}: use one of {sorted(_LEVELS)}")
        store_kind = store or "sqlite"
        if store_kind not in ("sqlite", "memory"):
            raise ConfigError(f"--store {store_kind!r}: use 'sqlite' or 'memory'")
        chosen_port = 8000 if port is None else port
        if not 0 < chosen_port < 65536:
            raise ConfigError(f"--port {chosen_port}: use a port between 1 and 65535")
        base = data_dir or env.get("MESH_DATA_DIR") or Path(".mesh") / agent_name
        discovery = env.get("MESH_DISCOVERY", "").strip()
        if discovery and discovery != "registry" and not discovery.startswith("consul://"):
            raise ConfigError(
                f"MESH_DISCOVERY={discovery!r}: use 'registry' (the default) or consul://host:8500"
            )
        consul = discovery if discovery.startswith("consul://") else None
        peer_networks = NetworkPolicy.from_env(env, "MESH_PEER_NETWORKS")
        reg: str | None = None
        if not no_register and consul is None:
            # Like the CLI, a node finds the registry at the default address unless told
            # otherwise; while none answers it keeps serving and retries in the background.
            reg = registry or env.get("MESH_REGISTRY") or DEFAULT_REGISTRY
        return cls(
            host=host or "127.0.0.1",
            port=chosen_port,
            data_dir=Path(base),
            public_url=env.get("MESH_PUBLIC_URL") or None,
            registry=reg,
            registry_token=env.get("MESH_REGISTRY_TOKEN") or None,
            token=_token(env, "MESH_TOKEN"),
            fastpath=env.get("MESH_FASTPATH", "1") != "0",
            consul=None if no_register else consul,
            consul_token=env.get("CONSUL_HTTP_TOKEN") or None,
            store=store_kind,  # type: ignore[arg-type]
            log_level=level,
            introspect_instruction=env.get("MESH_INTROSPECT_INSTRUCTION") == "1",
            grace_seconds=20.0 if grace_seconds is None else grace_seconds,
            max_body_bytes=_bytes(env, "MESH_MAX_BODY_BYTES", cls.max_body_bytes),
            max_inflight_bytes=_bytes(env, "MESH_MAX_INFLIGHT_BYTES", cls.max_inflight_bytes),
            max_text_bytes=_bytes(env, "MESH_MAX_TEXT_BYTES", cls.max_text_bytes),
            body_timeout_s=_seconds(env, "MESH_BODY_TIMEOUT", cls.body_timeout_s),
            max_answer_bytes=_bytes(env, "MESH_MAX_ANSWER_BYTES", cls.max_answer_bytes),
            peer_networks=peer_networks,
        )


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive byte count from ``env[name]`` (ConfigError naming the variable)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise ConfigError(f"{name}={raw!r}: give a positive number of bytes, e.g. {default}")
    return int(raw)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive, finite number of seconds from ``env[name]`` (ConfigError naming it)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={raw!r}: give a positive number of seconds, e.g. {default:g}")
    return value


def _token(env: Mapping[str, str], name: str) -> str | None:
    """A bearer token from ``env[name]`` (unset or empty: none). Visible ASCII only: a token
    with spaces at either end can never match what a caller sends (the bearer value is trimmed),
    and one with other characters cannot go in an HTTP header (the node presents it to its
    peers); either way every call would be refused."""
    raw = env.get(name, "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isprintable()) or " " in raw:
        what = "only spaces" if not raw.strip() else "spaces or characters outside visible ASCII"
        raise ConfigError(
            f"{name} has {what}: no caller could present it; use visible ASCII characters, "
            "e.g. `export MESH_TOKEN=$(openssl rand -hex 16)`, or unset it"
        )
    return raw

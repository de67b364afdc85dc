"""Run the registry: ``run(settings)`` serves it with uvicorn until interrupted."""

from __future__ import annotations

import logging

import uvicorn

from mesh._errors import ConfigError
from mesh._listener import bind_listener, http_protocol
from mesh._netpolicy import is_loopback_host
from registry.app import create_app
from registry.settings import RegistrySettings, token_problem

__all__ = ["KEEP_ALIVE_S", "RegistrySettings", "check_exposure", "check_token", "run"]

# Longer than a node's heartbeat interval (5 s): with uvicorn's default of 5 s a heartbeat
# could go out on a pooled connection the server was just closing.
KEEP_ALIVE_S = 65


def check_token(settings: RegistrySettings) -> None:
    """A write token no node could present is a ``ConfigError``: blank, or with spaces at
    either end (a bearer value is trimmed), every write would be refused, by nobody's fault."""
    problem = token_problem(settings.token)
    if problem:
        raise ConfigError(f"MESH_REGISTRY_TOKEN (or --token): {problem}")


def check_exposure(settings: RegistrySettings) -> None:
    """A registry reachable beyond loopback must not take anonymous writes: ``ConfigError``."""
    if settings.token is None and not is_loopback_host(settings.host):
        raise ConfigError(
            f"the registry listens on {settings.host} (beyond loopback) without a write token: "
            "set MESH_REGISTRY_TOKEN (or --token) to a secret the nodes share, e.g. "
            "`export MESH_REGISTRY_TOKEN=$(openssl rand -hex 16)`"
        )


def run(settings: RegistrySettings, *, log_level: str = "info") -> int:
    """Serve the registry (blocks). Returns the process exit code."""
    check_token(settings)
    check_exposure(settings)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per probe and card fetch would bury the health changes worth reading.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        # As `mesh serve`: a refused body's connection closed only once the client has stopped
        # sending it, so the client reads the 413 / 401 instead of a reset (mesh/_listener.py).
        http=http_protocol(),
        log_level=log_level,
        # No config of uvicorn's own: its loggers propagate to the root handler above, so the
        # whole log has one line format.
        log_config=None,
        # Per-request access lines would drown the health-change lines that matter here.
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        ssl_certfile=settings.tls.cert_file if settings.tls else None,
        ssl_keyfile=settings.tls.key_file if settings.tls else None,
    )
    # Bound here, not by uvicorn: a busy port is one ConfigError line (exit code EX_CONFIG,
    # which `mesh up` does not restart) instead of uvicorn's log and exit 1.
    sock = bind_listener(settings.host, settings.port)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0

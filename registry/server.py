"""Run the registry: ``run(settings)`` serves it with uvicorn until interrupted."""

from __future__ import annotations

import logging

import uvicorn

from registry.app import create_app
from registry.settings import RegistrySettings

__all__ = ["RegistrySettings", "run"]


def run(settings: RegistrySettings, *, log_level: str = "info") -> int:
    """Serve the registry (blocks). Returns the process exit code."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per probe and card fetch would bury the health changes worth reading.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    if settings.host not in {"127.0.0.1", "localhost", "::1"} and settings.token is None:
        logging.getLogger("registry").warning(
            "listening on %s without a token: anyone who can reach it can register instances; "
            "set MESH_REGISTRY_TOKEN",
            settings.host,
        )
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # Per-request access lines would drown the health-change lines that matter here.
        access_log=False,
        lifespan="on",
    )
    uvicorn.Server(config).run()
    return 0

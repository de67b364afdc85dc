"""The registry's command: ``mesh-registry``, ``python -m registry`` (and ``mesh registry``, an
alias that runs ``python -m registry`` in its own process).

    mesh-registry --port 8400 --data-dir .mesh/registry

Flags win over the environment (``MESH_REGISTRY_TOKEN``, ``MESH_REGISTRY_ALLOW_NETWORKS``,
``CONSUL_HTTP_TOKEN``, ``MESH_TOKEN``: ``RegistryEnvironment``), which wins over the defaults. Exit codes:

    0    stopped
    2    a flag argparse refused (usage on stderr)
    78   EX_CONFIG: could not start as configured (every bad setting in one ``mesh: error:``
         line: a bad variable or flag, a busy port, no token beyond loopback); ``mesh up`` does
         not restart a process that exits with it, since the same start would fail the same way
    130  interrupted
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from mesh._errors import ConfigError, MeshError
from mesh._keys import TrustRoot
from mesh._settings import CONSUL_SCHEMES, ConsulTLS
from mesh._tls import ServerTLS, trust
from registry.settings import RegistryEnvironment, RegistrySettings

__all__ = ["EX_CONFIG", "build_parser", "main", "settings_from"]

EX_CONFIG = os.EX_CONFIG  # 78, sysexits.h

# Where a setting came from, to name it in an error: the flag when one was given.
_FLAGS = {
    "token": "--token",
    "allow_networks": "--allow-networks",
    "consul_token": "CONSUL_HTTP_TOKEN",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
}


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The registry's flags (``--help`` lists them with their defaults)."""
    p = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="Run the mesh registry: nodes register here; the operator page is at /.",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8400, help="port (default 8400)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".mesh/registry"),
        help="where registry.db lives (default .mesh/registry)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="bearer token required for writes (default: $MESH_REGISTRY_TOKEN; unset: open, "
        "allowed only on loopback)",
    )
    p.add_argument(
        "--probe-interval", type=float, default=5.0, help="seconds between /health probes"
    )
    p.add_argument("--probe-timeout", type=float, default=2.0, help="seconds one probe may take")
    p.add_argument(
        "--probe-concurrency",
        type=int,
        default=64,
        metavar="N",
        help="probes in flight at once (default 64; at most 64: the HTTP client's room)",
    )
    p.add_argument(
        "--probe-budget",
        type=int,
        default=1000,
        metavar="N",
        help="probes per round at most (default 1000); with more instances each is probed in "
        "turn, every few rounds, and its heartbeats speak for it in between",
    )
    p.add_argument("--ttl", type=float, default=30.0, help="seconds without heartbeat -> critical")
    p.add_argument(
        "--remove-after", type=float, default=300.0, help="seconds critical before removal"
    )
    p.add_argument(
        "--backend",
        default=None,
        metavar="URL",
        help="keep instances in Consul (consul://HOST:PORT; token: $CONSUL_HTTP_TOKEN) or in a "
        "PostgreSQL database registry replicas share (postgresql://user@host/db; password: "
        "$PGPASSWORD) instead of SQLite",
    )
    p.add_argument(
        "--allow-networks",
        default=None,
        metavar="NETS",
        help="networks registered URLs may be on, e.g. 'loopback,private,10.1.0.0/16' or 'any' "
        "(default: $MESH_REGISTRY_ALLOW_NETWORKS, else loopback for a registry on loopback, "
        "loopback and private ranges otherwise; link-local is always refused)",
    )
    p.add_argument(
        "--max-instances",
        type=int,
        default=10_000,
        metavar="N",
        help="instances held at most; a new one beyond is refused with 503 registry_full "
        "(default 10000): bounds the store, the page and every metric label set",
    )
    p.add_argument(
        "--keys",
        default=None,
        metavar="DIR",
        help="the mesh's key folder (`mesh keys init`) or any folder holding its root.jwk: "
        "registered cards must be signed under that root (default: $MESH_KEYS)",
    )
    p.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help="serve HTTPS with this certificate (chain); needs --tls-key (default $MESH_TLS_CERT); "
        "nodes are verified against $MESH_TLS_CA (else the system's trust store)",
    )
    p.add_argument(
        "--tls-key",
        default=None,
        metavar="PEM",
        help="the private key of --tls-cert (default $MESH_TLS_KEY)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _prog() -> str:
    # `mesh registry` runs `python -m registry`: its usage lines keep saying `mesh registry`.
    return "mesh-registry" if Path(sys.argv[0]).name == "mesh-registry" else "mesh registry"


def settings_from(args: argparse.Namespace) -> RegistrySettings:
    """The settings of parsed flags over the environment. Every bad value, of a flag or a
    variable, is in the one ``ConfigError`` raised, named as the operator wrote it."""
    flags = {
        name: value
        for name, value in (
            ("token", args.token),
            ("allow_networks", args.allow_networks),
            ("keys", args.keys),
            ("tls_cert", args.tls_cert),
            ("tls_key", args.tls_key),
        )
        if value is not None
    }
    problems: list[str] = []
    env: RegistryEnvironment | None = None
    try:
        env = RegistryEnvironment(**flags)
    except ValidationError as exc:
        problems += [_problem(error) for error in exc.errors()]
    store_url = None
    if args.backend is not None and args.backend.startswith(("postgresql://", "postgres://")):
        store_url, args.backend = args.backend, None
    elif args.backend is not None and not args.backend.startswith(CONSUL_SCHEMES):
        shown = repr(args.backend) if "@" not in args.backend else "(a URL, not shown)"
        problems.append(
            f"--backend {shown}: use consul://host:8500 or postgresql://user@host/db "
            "(or leave it out for SQLite)"
        )
    if args.max_instances < 1:
        problems.append(f"--max-instances {args.max_instances}: give at least 1 (default 10000)")
    if args.probe_budget < 1:
        problems.append(f"--probe-budget {args.probe_budget}: give at least 1 (default 1000)")
    if not 1 <= args.probe_concurrency <= 64:
        problems.append(f"--probe-concurrency {args.probe_concurrency}: give 1 to 64 (default 64)")
    trust_root = None
    if env is not None and env.keys is not None:
        try:
            trust_root = TrustRoot.load(env.keys)
        except ConfigError as exc:
            problems.append(f"--keys / MESH_KEYS: {exc}")
    tls = None
    if env is not None:
        try:
            tls = ServerTLS.of(
                env.tls_cert,
                env.tls_key,
                names=("--tls-cert / MESH_TLS_CERT", "--tls-key / MESH_TLS_KEY"),
            )
        except ConfigError as exc:
            problems.append(str(exc))
    if problems or env is None:
        raise ConfigError(
            problems[0]
            if len(problems) == 1
            else f"{len(problems)} settings are wrong: "
            + " ".join(f"({i}) {problem}" for i, problem in enumerate(problems, start=1))
        )
    return RegistrySettings(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        token=env.token.get_secret_value() if env.token else None,
        probe_interval_s=args.probe_interval,
        probe_timeout_s=args.probe_timeout,
        probe_concurrency=args.probe_concurrency,
        probe_budget=args.probe_budget,
        ttl_s=args.ttl,
        remove_after_s=args.remove_after,
        backend=args.backend,
        store_url=store_url,
        consul_token=env.consul_token.get_secret_value() if env.consul_token else None,
        consul_tls=ConsulTLS(
            ca_file=env.consul_cacert,
            cert_file=env.consul_client_cert,
            key_file=env.consul_client_key,
        ),
        allow_networks=env.allow_networks,
        max_instances=args.max_instances,
        mesh_token=env.mesh_token.get_secret_value() if env.mesh_token else None,
        trust_root=trust_root,
        tls=tls,
        tls_ca=env.tls_ca,
    )


def _problem(error: ErrorDetails) -> str:
    # pydantic locates a variable by its name and a keyword (a flag) by the field's.
    where = str(error["loc"][0]) if error["loc"] else "the environment"
    cause = error.get("ctx", {}).get("error")
    return f"{_FLAGS.get(where, where)}: {cause if cause is not None else error['msg']}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the registry until interrupted; returns the exit code (see the module's docstring)."""
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
        # Before any client is built: probes, card fetches and the console verify with it.
        trust(settings.tls_ca)
        # Loaded after the flags are read: --help and a refused flag answer without the app.
        from registry.server import run

        return run(settings, log_level=args.log_level)
    except ConfigError as exc:
        # The line `mesh up`'s supervisor shows for a process that failed to start.
        print(f"mesh: error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except MeshError as exc:
        print(f"mesh: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

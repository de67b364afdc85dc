"""``mesh serve``, ``mesh card``, ``mesh call``: run one agent as a node, and talk to nodes.

mesh serve agents.credit_bureau:agent --port 8017 --data-dir .mesh/credit-bureau
mesh card http://127.0.0.1:8017
mesh call http://127.0.0.1:8017 --skill score --json '{"applicant_id": "APP-501", "amount": 250000}'
mesh call http://127.0.0.1:8007 --text "Should we approve APP-612 for 400000?" --stream
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import logging
import os
import re
import signal
import socket
import sys
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from mesh._errors import ConfigError, MeshError
from mesh._settings import DEFAULT_REGISTRY_URL

if TYPE_CHECKING:
    from mesh._discovery.base import DiscoveryBackend
    from mesh._settings import ConsulTLS, MeshSettings

__all__ = [
    "KEEP_ALIVE_S",
    "Lookup",
    "add_parsers",
    "find_agent_url",
    "in_declared_order",
    "load_agent",
    "lookup_location",
    "resolve_target",
]

#: Read by a2a-sdk once, when ``a2a`` is first imported (a2a.utils.telemetry).
SDK_TRACING = "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"

#: uvicorn's idle keep-alive for a node, in seconds (the registry's too): longer than the idle
#: expiry of common clients (httpx 5 s, Node.js 5 s, aiohttp 15 s) and of load balancers (AWS
#: ALB 60 s), so the client side closes an idle connection first. With uvicorn's default (5 s,
#: httpx's own) a client could reuse a connection the node was closing: "Server disconnected".
KEEP_ALIVE_S = 65


# -- target resolution ----------------------------------------------------------------------
def resolve_target(name_or_url: str, location: Lookup | str) -> str:
    """The base URL of a node named by URL, ``host:port``, or agent name (looked up at
    ``location``: the registry's URL or ``consul://host:port``)."""
    target = name_or_url.strip()
    if target.startswith(("http://", "https://")):
        return target.rstrip("/")
    if ":" in target and target.split(":", 1)[1].isdigit():
        return f"http://{target}"
    if _AGENT_NAME.match(target):
        return asyncio.run(find_agent_url(target, location))
    raise ConfigError(
        f"{name_or_url!r} is neither a URL nor an agent name: give the node's address "
        "(e.g. http://127.0.0.1:8017) or an agent name registered in the registry"
    )


@dataclass(frozen=True)
class Lookup:
    """Where the commands look agent names up, and how to reach it: the registry's URL or a
    Consul location, with the token and the TLS the settings give for it (``lookup_location``).
    Reads as its location in messages."""

    location: str
    token: str | None = None
    consul_tls: ConsulTLS | None = None

    def __str__(self) -> str:
        return self.location

    def backend(self) -> DiscoveryBackend:
        from mesh._discovery import create_backend

        return create_backend(self.location, token=self.token, consul_tls=self.consul_tls)


async def find_agent_url(name: str, lookup: Lookup | str) -> str:
    """The URL of one passing instance of ``name``, asked of the registry (or Consul) that
    ``lookup`` names."""
    from mesh._discovery.client import DiscoveryClient

    where = lookup if isinstance(lookup, Lookup) else Lookup(lookup)
    client = DiscoveryClient(where.backend())
    try:
        instances = await client.require(agent=name)
    finally:
        await client.aclose()
    return instances[0].url.rstrip("/")


def lookup_location(registry: str | None, settings: MeshSettings) -> Lookup:
    """Where agent names are looked up: ``--registry``, else ``MESH_DISCOVERY``'s Consul, else
    ``MESH_REGISTRY``, else the default registry; with the discovery token and Consul's TLS
    when the settings' own location is used."""
    if registry:
        return Lookup(registry)
    return Lookup(settings.discovery_location, settings.discovery_token, settings.consul_tls)


_AGENT_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


# -- serve ----------------------------------------------------------------------------------
def load_agent(target: str) -> Any:
    """Import ``MODULE:ATTR`` and return the ``Agent`` it names (ConfigError otherwise)."""
    from mesh._agent import Agent

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{target!r}: name the agent as MODULE:ATTR, e.g. agents.credit_bureau:agent"
        )
    if os.getcwd() not in sys.path:
        # `mesh serve` is run from a project folder; its modules are importable like `python -m`.
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"{target!r}: no module named {module_name!r}") from exc
        raise ConfigError(f"{target!r}: importing {module_name!r} failed: {exc}") from exc
    except MeshError as exc:
        raise ConfigError(f"{target!r}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"{target!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        agent = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"{target!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if not isinstance(agent, Agent):
        raise ConfigError(f"{target!r} is a {type(agent).__name__}, not a mesh Agent")
    return agent


def _quiet_sdk_tracing() -> None:
    """Turn off a2a-sdk's OpenTelemetry spans in this process unless the operator set
    ``OTEL_INSTRUMENTATION_A2A_SDK_ENABLED``. With no tracer configured the SDK still wraps
    every handler call in a no-op span, ~12 % of a node's CPU per task (docs/performance.md);
    mesh's own trace context (``traceparent``, mesh._tracing) does not depend on it. The SDK
    reads the variable once, when ``a2a`` is first imported, so this runs before the agent's
    module (which imports mesh, then a2a). Only this entry point decides it: ``mesh serve``
    owns its process, while importing mesh as a library leaves the environment alone."""
    os.environ.setdefault(SDK_TRACING, "false")


def collect_from_here() -> None:
    """Resume the cyclic collector ``mesh._cli.main`` paused for ``mesh serve``'s start-up, the
    node being ready. What start-up built (modules, classes, schemas, the app: ~95,000 tracked
    objects) lives as long as the process: frozen, no later collection scans it again (a full
    pass over it took 30-80 ms on the bench machine, a stall in some request's latency). Not
    collected first: that pass would cost the same, for ~1,200 objects of import-time cycles."""
    gc.freeze()
    gc.enable()


def _serve(args: argparse.Namespace) -> int:
    _quiet_sdk_tracing()
    from mesh._cli import log_lines
    from mesh._listener import bind_listener, http_protocol
    from mesh._settings import MeshSettings, NodeSettings

    paused = getattr(args, "collector_paused", False)  # by mesh._cli.main, for start-up
    environment = MeshSettings.from_environment()
    agent = load_agent(args.target)
    settings = NodeSettings.build(
        environment,
        agent_name=agent.name,
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        registry=args.registry,
        no_register=args.no_register,
        store=args.store,
        grace_seconds=args.grace,
        offline=args.offline,
        keys=args.keys,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    log_lines.configure(settings.log_level)
    # httpx logs every request at INFO: one line per heartbeat and delegation is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.exposed and settings.token is None:
        logging.getLogger("mesh.serve").warning(
            "listening on %s without MESH_TOKEN: anyone who can reach this address can send "
            "tasks; set MESH_TOKEN on every node of the mesh",
            settings.host,
        )
    import uvicorn

    from mesh._node import Node

    node = Node(agent, settings)  # a model it cannot run as required refuses here, unbound
    sock = bind_listener(settings.host, settings.port)

    class _Server(uvicorn.Server):
        """SIGTERM/SIGINT: drain the node first (503 on new sends, in-flight tasks finish),
        then let uvicorn stop. A second signal stops at once."""

        draining = False

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if paused and self.started:
                collect_from_here()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.draining:
                self.should_exit = True
                if sig == signal.SIGINT:
                    self.force_exit = True
                return
            self.draining = True
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(self._start_drain)

        def _start_drain(self) -> None:
            self._drain_task = asyncio.ensure_future(self._drain())

        async def _drain(self) -> None:
            try:
                await node.drain()
            finally:
                self.should_exit = True

    config = uvicorn.Config(
        node.app,
        http=http_protocol(),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        log_level=settings.log_level.lower(),
        ssl_certfile=settings.tls.cert_file if settings.tls else None,
        ssl_keyfile=settings.tls.key_file if settings.tls else None,
    )
    server = _Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1


# -- card / call ----------------------------------------------------------------------------
def _card(args: argparse.Namespace) -> int:
    from mesh._settings import MeshSettings

    settings = MeshSettings.from_environment()
    url = resolve_target(args.target, lookup_location(args.registry, settings))
    return asyncio.run(_card_async(url, settings.mesh_token))


async def _card_async(url: str, token: str | None) -> int:
    import httpx

    from mesh._a2a.client import A2APeer, auth_headers
    from mesh._tls import client_context

    headers = auth_headers(token)
    async with httpx.AsyncClient(
        timeout=10.0, headers=headers, trust_env=False, verify=client_context()
    ) as http:
        peer = A2APeer(http, url)
        print(json.dumps(await peer.card_dict(), indent=2))
    return 0


def _call(args: argparse.Namespace) -> int:
    payload: dict[str, Any] | str
    if args.json is not None:
        try:
            payload = json.loads(args.json)
        except ValueError as exc:
            raise ConfigError(f"--json is not valid JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise ConfigError('--json must be a JSON object, e.g. \'{"applicant_id": "APP-501"}\'')
    else:
        payload = args.text
    from mesh._settings import MeshSettings

    settings = MeshSettings.from_environment()
    url = resolve_target(args.target, lookup_location(args.registry, settings))
    return asyncio.run(_call_async(url, payload, args, settings.mesh_token))


def _reply_flags(target: str, url: str, registry: str | None) -> list[str]:
    """How ``mesh reply`` finds the node ``mesh call`` talked to: by the agent name it was
    given (and its registry), else by URL."""
    if _AGENT_NAME.match(target.strip()):
        return ["--agent", target.strip(), *(["--registry", registry] if registry else [])]
    return ["--url", url]


def _print_result(result: Any, shown: str = "", where: list[str] | None = None) -> int:
    from mesh._cli.question import EXIT_WAITING, WAITING_STATES, waiting_lines

    if result.state in WAITING_STATES:
        # The task waits for its caller: what it asks, and the command that answers it.
        from mesh._cli.up import mesh_command

        where = where or []
        agent = where[1] if len(where) > 1 else "the agent"
        for line in waiting_lines(result, agent, where, mesh_command()):
            print(line)
        return EXIT_WAITING
    if result.ok:
        from mesh._cli.progress import attached_lines

        if result.data is not None:
            print(json.dumps(result.data, indent=2))
        elif result.text.strip() != shown.strip():  # already streamed as it arrived
            print(result.text)
        for line in attached_lines(result):
            print(line, file=sys.stderr)
        if result.task_id:
            print(f"(task {result.task_id}, context {result.context_id})", file=sys.stderr)
        return 0
    error = result.error or {}
    print(
        f"mesh: task {result.task_id} {result.state}: {error.get('message', result.text)}",
        file=sys.stderr,
    )
    return 1


async def in_declared_order(peer: Any, result: Any) -> Any:
    """The result with its data in the order the skill's output model declares (the wire's
    protobuf Struct scrambles it), read from the node's card."""
    import dataclasses

    from mesh._a2a.card import skill_schemas
    from mesh._schema_order import order_like

    if result.data is None:
        return result
    schema = skill_schemas(await peer.card()).get(str(result.metadata.get("skill")), {})
    return dataclasses.replace(result, data=order_like(result.data, schema.get("output")))


async def _call_async(
    url: str, payload: dict[str, Any] | str, args: argparse.Namespace, token: str | None
) -> int:
    import httpx

    from mesh._a2a.client import A2APeer, auth_headers
    from mesh._cli.progress import relayed_line
    from mesh._tls import client_context

    timeout = httpx.Timeout(10.0, read=args.timeout)
    headers = auth_headers(token)
    where = _reply_flags(args.target, url, args.registry)
    async with httpx.AsyncClient(
        timeout=timeout, headers=headers, trust_env=False, verify=client_context()
    ) as http:
        peer = A2APeer(http, url)
        try:
            if not args.stream:
                result = await peer.send(
                    payload, skill=args.skill, context_id=args.context_id, timeout=args.timeout
                )
                return _print_result(await in_declared_order(peer, result), where=where)
            task_id = ""
            partial = False
            shown = ""
            async for update in peer.stream(
                payload, skill=args.skill, context_id=args.context_id, timeout=args.timeout
            ):
                task_id = update.task_id or task_id
                if update.kind == "message":  # a direct reply: the whole answer, no task
                    return _print_result(await in_declared_order(peer, update.reply()))
                if update.partial:
                    print(update.text, end="", flush=True)
                    shown += update.text
                    partial = True
                    continue
                if partial:
                    print()
                    partial = False
                if update.relay is not None:  # another agent's progress, a hop or more down
                    if (line := relayed_line(update)) is not None:
                        print(line, file=sys.stderr, flush=True)
                    continue
                if update.kind in ("task", "status") and update.text:
                    print(f"[{update.state}] {update.text}", file=sys.stderr, flush=True)
                elif update.kind in ("task", "status"):
                    print(f"[{update.state}]", file=sys.stderr, flush=True)
            if not task_id:
                raise ConfigError("the stream ended without a task")
            result = await in_declared_order(peer, await peer.get_task(task_id))
            return _print_result(result, shown, where)
        finally:
            await peer.aclose()


# -- parsers --------------------------------------------------------------------------------
_TARGET_HELP = "the node's URL (http://127.0.0.1:8017) or an agent name found in the registry"


def _registry_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        default=None,
        help="registry that resolves agent names (default $MESH_REGISTRY or "
        f"{DEFAULT_REGISTRY_URL})",
    )


def add_parsers(sub: Any) -> None:
    """Register ``serve``, ``card`` and ``call`` on the ``mesh`` sub-command parser."""
    p = sub.add_parser(
        "serve",
        help="run one agent as an A2A node",
        description="Serve the Agent named by MODULE:ATTR over A2A (card, JSON-RPC, /health, "
        "/metrics, /introspect). SIGTERM drains: new sends get 503, running tasks finish.",
    )
    p.add_argument(
        "target", metavar="MODULE:ATTR", help="the Agent, e.g. agents.credit_bureau:agent"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder of node.db (default $MESH_DATA_DIR or .mesh/<agent-name>)",
    )
    p.add_argument(
        "--registry", default=None, help="registry URL to register with (default $MESH_REGISTRY)"
    )
    p.add_argument("--no-register", action="store_true", help="do not register with a registry")
    p.add_argument(
        "--offline",
        action="store_true",
        help="run a named model on the offline scripted model, on purpose (MESH_MODEL=scripted); "
        "beyond loopback a named model without GOOGLE_API_KEY otherwise refuses to start",
    )
    p.add_argument(
        "--grace", type=float, default=None, help="seconds running tasks get on SIGTERM (20)"
    )
    p.add_argument(
        "--keys",
        default=None,
        help="the agent's key folder (`mesh keys issue`): sign the card, verify peers' cards "
        "(default $MESH_KEYS)",
    )
    p.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help="serve HTTPS with this certificate (chain); needs --tls-key (default $MESH_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        default=None,
        metavar="PEM",
        help="the private key of --tls-cert (default $MESH_TLS_KEY)",
    )
    # "memory" (the SDK's in-memory task store) is the benchmark baseline, not documented.
    p.add_argument(
        "--store",
        default=None,
        metavar="STORE",
        help="where tasks and sessions live: sqlite (DATA_DIR/node.db, the default) or a "
        "postgresql://user@host/db URL the agent's replicas share (default $MESH_STORE; "
        "prefer the variable for a URL with a password)",
    )
    p.set_defaults(handler=_serve)

    c = sub.add_parser(
        "card", help="print a node's agent card", description="Print the agent card."
    )
    c.add_argument("target", metavar="URL|NAME", help=_TARGET_HELP)
    _registry_flag(c)
    c.set_defaults(handler=_card)

    k = sub.add_parser(
        "call",
        help="send one task to a node and print the result",
        description="Send a typed request (--skill S --json J) or free text (--text T). A task "
        "that stops to ask something prints its question and the `mesh reply` command that "
        "answers it, and exits with 4.",
    )
    k.add_argument("target", metavar="URL|NAME", help=_TARGET_HELP)
    _registry_flag(k)
    k.add_argument("--skill", default=None, help="skill id (optional when the node has one)")
    what = k.add_mutually_exclusive_group(required=True)
    what.add_argument("--json", default=None, help="the input as a JSON object")
    what.add_argument("--text", default=None, help="free text (the chat skill)")
    k.add_argument("--stream", action="store_true", help="show progress as it arrives")
    k.add_argument("--context-id", default=None, help="continue this conversation")
    k.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (300)")
    k.set_defaults(handler=_call)

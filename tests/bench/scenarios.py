"""The rows of the benchmark table: which processes to start and what to send them.

Every row is loaded with the same kind of request so the rows compare: a JSON object
``{"applicant_id", "amount"}``, bare over HTTP for the floor, as the data part of an A2A
``SendMessage`` for the A2A rows. The delegation rows send the coordinator a text message that
its scripted model answers by calling one tool: remote (a specialist node) or local.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mesh._keys import init_mesh, issue_agent
from tests.bench.load import ID, Target

__all__ = [
    "A2A",
    "ADK",
    "ADK_REMOTE",
    "FLOOR",
    "FLOOR_RELAY",
    "HOP_FLOOR_ROWS",
    "LLM_SPECIALIST",
    "LOCAL_LLM",
    "MESH",
    "MESH_PG",
    "REMOTE_LLM",
    "ROWS",
    "SIGNED",
    "Ctx",
    "Row",
    "ServerSpec",
]

FLOOR = "fastapi"
# The floor's hop (``tests.bench.hops``): the bare echo asked through a bare FastAPI relay.
FLOOR_RELAY = "fastapi-relay"
A2A = "a2a-sdk"
MESH = "mesh-node"
MESH_PG = "mesh-node-pg"
LOCAL = "coord-local"
REMOTE = "coord-remote"
SIGNED = "coord-remote-signed"
# The LLM specialist hop: the specialist alone, then a coordinator asking it over A2A and the
# same coordinator with its work in process.
LLM_SPECIALIST = "llm-specialist"
LOCAL_LLM = "coord-local-llm"
REMOTE_LLM = "coord-remote-llm"
ADK = "adk"
ADK_REMOTE = "adk-coord-remote"

A2A_HEADERS = {"A2A-Version": "1.0"}
# The signed row's user credential: a coordinator with keys is never open, so the load carries
# the mesh token (as the CLI would); its own calls to the specialist carry its call tokens.
BENCH_TOKEN = "bench-user-token"
PY = sys.executable


@dataclass
class Ctx:
    """Where a row's processes live: a port per server name and a scratch directory."""

    ports: dict[str, int]
    tmp: Path

    def url(self, server: str) -> str:
        return f"http://127.0.0.1:{self.ports[server]}"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: Callable[[Ctx], list[str]]
    env: Callable[[Ctx], dict[str, str]] = field(default=lambda ctx: {})
    health: str = "/health"


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    # Started in order; the LAST one receives the load.
    servers: tuple[ServerSpec, ...]
    target: Callable[[Ctx], Target]
    # Why the row cannot run here (a module not written yet), or None.
    missing: Callable[[], str | None] = field(default=lambda: None)


def send_message_body(parts: list[dict[str, object]], skill: str | None) -> str:
    """A JSON-RPC SendMessage whose messageId is the load generator's unique ``{{ID}}``."""
    message: dict[str, object] = {"role": "ROLE_USER", "messageId": ID, "parts": parts}
    if skill:
        message["metadata"] = {"skill": skill}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        # historyLength 0: every A2A row returns the task without echoing the request back.
        "params": {"message": message, "configuration": {"historyLength": 0}},
    }
    return json.dumps(body, separators=(",", ":"))


SCORE_PARTS: list[dict[str, object]] = [{"data": {"applicant_id": "a-1001", "amount": 25000}}]


# What a good answer contains: a completed task; for the coordinator, the scored answer (a
# failed tool call also completes the turn, with an apology instead of a score).
COMPLETED = '"TASK_STATE_COMPLETED"'
SCORED = "a-1001: score "
SCORE_TEXT: list[dict[str, object]] = [{"text": "score a-1001 for 25000"}]


def _need(*modules: str) -> Callable[[], str | None]:
    def check() -> str | None:
        for name in modules:
            try:
                found = importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                return f"{name} is not available yet"
        return None

    return check


def _no_postgres() -> str | None:
    from tests.postgres_support import server_bin

    return None if server_bin() else "no PostgreSQL server binaries (apt-get install postgresql)"


def _mesh_serve(spec: str, server: str) -> Callable[[Ctx], list[str]]:
    def argv(ctx: Ctx) -> list[str]:
        return [
            PY,
            "-m",
            "tests.bench.servers.mesh_node",
            "serve",
            spec,
            "--port",
            str(ctx.ports[server]),
            "--data-dir",
            str(ctx.tmp / server),
            # No registry in the benchmark: the rows measure serving, not discovery.
            "--no-register",
        ]

    return argv


def _adk_serve(kind: str, server: str, peer: str = "") -> Callable[[Ctx], list[str]]:
    def argv(ctx: Ctx) -> list[str]:
        out = [PY, "-m", "tests.bench.servers.adk_node", kind, "--port", str(ctx.ports[server])]
        return out + (["--peer", ctx.url(peer)] if peer else [])

    return argv


# ADK's to_a2a app has no /health: it is ready when it serves its card.
ADK_READY = "/.well-known/agent-card.json"


def _modules_file(server: str) -> Callable[[Ctx], dict[str, str]]:
    return lambda ctx: {"MESH_BENCH_MODULES": str(ctx.tmp / f"{server}.modules.json")}


def _keys(ctx: Ctx, agent: str) -> str:
    """The key folder of ``agent`` under one mesh root in the row's scratch directory (made on
    first use: the servers start in order, in this process)."""
    root = ctx.tmp / "mesh-keys"
    if not (root / "root.jwk").exists():
        init_mesh(root)
    folder = root / "agents" / agent
    if not folder.exists():
        issue_agent(root, agent)
    return str(folder)


def _a2a_target(
    parts: list[dict[str, object]],
    skill: str | None,
    expect: str,
    extra_headers: dict[str, str] | None = None,
) -> Callable[[Ctx], Target]:
    extra_headers = extra_headers or {}

    def build(ctx: Ctx) -> Target:
        last = next(reversed(ctx.ports))
        return Target(
            url=ctx.url(last) + "/",
            body=send_message_body(parts, skill),
            expect=expect,
            headers={**A2A_HEADERS, **extra_headers},
        )

    return build


def _echo_argv(server: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: [
        PY,
        "-m",
        "tests.bench.servers.fastapi_echo",
        "--port",
        str(ctx.ports[server]),
    ]


def _echo_target(server: str) -> Callable[[Ctx], Target]:
    return lambda ctx: Target(
        url=ctx.url(server) + "/echo",
        body=json.dumps({"applicant_id": ID, "amount": 25000}, separators=(",", ":")),
        expect='"applicant_id"',
    )


_FLOOR_ROW = Row(
    key=FLOOR,
    label="bare FastAPI JSON echo",
    servers=(ServerSpec("fastapi", _echo_argv("fastapi")),),
    target=_echo_target("fastapi"),
)

ROWS: tuple[Row, ...] = (
    _FLOOR_ROW,
    Row(
        key=A2A,
        label="bare a2a-sdk, in-memory store",
        servers=(
            ServerSpec(
                "a2a",
                lambda ctx: [
                    PY,
                    "-m",
                    "tests.bench.servers.a2a_echo",
                    "--port",
                    str(ctx.ports["a2a"]),
                ],
            ),
        ),
        target=_a2a_target(SCORE_PARTS, "score", COMPLETED),
    ),
    Row(
        key=MESH,
        label="mesh node, typed skill, SQLite + metrics",
        servers=(
            ServerSpec(
                "bureau",
                _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
                env=_modules_file("bureau"),
            ),
        ),
        target=_a2a_target(SCORE_PARTS, "score", COMPLETED),
        missing=_need("mesh._node", "mesh._cli.serve"),
    ),
    # The same node on PostgreSQL (issue 17: replicas sharing a database), a server the bench
    # starts (tests/bench/servers/postgres.py); its CPU is counted with the row's.
    Row(
        key=MESH_PG,
        label="mesh node (postgres), typed skill, PostgreSQL + metrics",
        servers=(
            ServerSpec(
                "postgres",
                lambda ctx: [
                    PY,
                    "-m",
                    "tests.bench.servers.postgres",
                    "--port",
                    str(ctx.ports["postgres"]),
                    "--url-file",
                    str(ctx.tmp / "postgres.url"),
                ],
            ),
            ServerSpec(
                "bureau",
                _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
                env=lambda ctx: {
                    **_modules_file("bureau")(ctx),
                    "MESH_STORE": (ctx.tmp / "postgres.url").read_text(),
                    "BENCH_COUNT_PG": "1",
                },
            ),
        ),
        target=_a2a_target(SCORE_PARTS, "score", COMPLETED),
        missing=lambda: _need("mesh._node", "psycopg")() or _no_postgres(),
    ),
    Row(
        key=LOCAL,
        label="coordinator (scripted model) -> local tool",
        servers=(
            ServerSpec(
                "coordinator",
                _mesh_serve("tests.bench.agents.coordinator:local", "coordinator"),
                env=_modules_file("coordinator"),
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("mesh._node", "mesh._cli.serve"),
    ),
    Row(
        key=REMOTE,
        label="coordinator (scripted model) -> remote() -> specialist node",
        servers=(
            ServerSpec(
                "bureau",
                _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
                env=_modules_file("bureau"),
            ),
            ServerSpec(
                "coordinator",
                _mesh_serve("tests.bench.agents.coordinator:remote_agent", "coordinator"),
                env=lambda ctx: {
                    **_modules_file("coordinator")(ctx),
                    "BENCH_PEER_URL": ctx.url("bureau"),
                },
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("mesh._node", "mesh._cli.serve", "mesh._remote"),
    ),
    Row(
        key=SIGNED,
        label="coord-remote with keys: signed cards, a call token per call",
        servers=(
            ServerSpec(
                "bureau",
                _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
                env=lambda ctx: {
                    **_modules_file("bureau")(ctx),
                    "MESH_KEYS": _keys(ctx, "bench-bureau"),
                },
            ),
            ServerSpec(
                "coordinator",
                _mesh_serve("tests.bench.agents.coordinator:remote_agent", "coordinator"),
                env=lambda ctx: {
                    **_modules_file("coordinator")(ctx),
                    "BENCH_PEER_URL": ctx.url("bureau"),
                    "MESH_KEYS": _keys(ctx, "bench-coordinator"),
                    "MESH_TOKEN": BENCH_TOKEN,
                },
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED, {"Authorization": f"Bearer {BENCH_TOKEN}"}),
        missing=_need("mesh._node", "mesh._cli.serve", "mesh._remote", "mesh._identity"),
    ),
    Row(
        key=LLM_SPECIALIST,
        label="LLM specialist alone (scripted model) -> local tool",
        servers=(
            ServerSpec(
                "analyst",
                _mesh_serve("tests.bench.agents.analyst:agent", "analyst"),
                env=_modules_file("analyst"),
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("mesh._node", "mesh._cli.serve"),
    ),
    Row(
        key=LOCAL_LLM,
        label="coordinator (scripted model) -> the LLM specialist's work in process",
        servers=(
            ServerSpec(
                "lead",
                _mesh_serve("tests.bench.agents.analyst:local_lead", "lead"),
                env=_modules_file("lead"),
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("mesh._node", "mesh._cli.serve"),
    ),
    Row(
        key=REMOTE_LLM,
        label="coordinator (scripted model) -> remote() -> LLM specialist node",
        servers=(
            ServerSpec(
                "analyst",
                _mesh_serve("tests.bench.agents.analyst:agent", "analyst"),
                env=_modules_file("analyst"),
            ),
            ServerSpec(
                "lead",
                _mesh_serve("tests.bench.agents.analyst:remote_lead", "lead"),
                env=lambda ctx: {
                    **_modules_file("lead")(ctx),
                    "BENCH_PEER_URL": ctx.url("analyst"),
                },
            ),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("mesh._node", "mesh._cli.serve", "mesh._remote"),
    ),
    # What a user would pick instead (issue 19 item 7): Google ADK, its LlmAgent on a fake
    # model with the coordinator's turn, served by its own to_a2a under uvicorn.
    Row(
        key=ADK,
        label="ADK to_a2a: LlmAgent (fake model) -> local tool",
        servers=(ServerSpec("adk", _adk_serve("local", "adk"), health=ADK_READY),),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("google.adk"),
    ),
    Row(
        key=ADK_REMOTE,
        label="ADK to_a2a: LlmAgent -> AgentTool(RemoteA2aAgent) -> mesh specialist node",
        servers=(
            ServerSpec(
                "bureau",
                _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
                env=_modules_file("bureau"),
            ),
            ServerSpec("adk", _adk_serve("remote", "adk", peer="bureau"), health=ADK_READY),
        ),
        target=_a2a_target(SCORE_TEXT, None, SCORED),
        missing=_need("google.adk", "mesh._node", "mesh._cli.serve"),
    ),
)

# Not in the table: the hop's floor on this machine, beside mesh's hops in ``tests.bench.hops``
# (``fastapi-relay`` - ``fastapi``: what one HTTP call between two bare Python processes adds).
HOP_FLOOR_ROWS: tuple[Row, ...] = (
    _FLOOR_ROW,
    Row(
        key=FLOOR_RELAY,
        label="bare FastAPI relay -> bare FastAPI JSON echo",
        servers=(
            ServerSpec("upstream", _echo_argv("upstream")),
            ServerSpec(
                "relay",
                lambda ctx: [
                    PY,
                    "-m",
                    "tests.bench.servers.fastapi_relay",
                    "--port",
                    str(ctx.ports["relay"]),
                    "--upstream",
                    ctx.url("upstream") + "/echo",
                ],
            ),
        ),
        target=_echo_target("relay"),
    ),
)

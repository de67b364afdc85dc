"""``mesh.toml``: what ``mesh up`` runs.

    state_dir = ".mesh"                  # data dirs and logs (relative to where mesh up runs)

    [registry]
    port = 8400

    [env]                                # for every node
    MESH_LOG_LEVEL = "info"

    [nodes.credit-bureau]
    module = "agents.credit_bureau:agent"
    port = "8411-8412"                   # a port, or a range with room for the replicas
    replicas = 2

    [nodes.loan-officer]
    module = "agents.loan_officer:agent"
    port = 8401
    env = { LOAN_DEADLINE_S = "20" }

    [policy]                             # optional: who may call what (MESH_ALLOW, mesh._policy)
    allow = ["loan-officer -> credit-bureau:score", "@token -> *"]

``load_meshfile(path)`` validates it (a ``ConfigError`` names the file and the field) and
``MeshFile.plan(root)`` turns it into the ``ProcessSpec``s a ``Supervisor`` starts: the
registry first, then one process per node replica, each ``python -m mesh ...``. Commands given
no mesh file look for ``MESHFILE_NAMES`` in their folder (``meshfiles_in``): a project's own
``mesh.toml`` first, then this repository's demo, ``agents/mesh.toml``.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mesh._errors import ConfigError
from mesh._policy import CallPolicy

__all__ = [
    "MESHFILE_NAMES",
    "MeshFile",
    "NodeSpec",
    "ProcessSpec",
    "RegistrySpec",
    "load_meshfile",
    "meshfiles_in",
]

# Where a command looks when given no mesh file, in order: the project's own, then the demo.
MESHFILE_NAMES = ("mesh.toml", "agents/mesh.toml")

_MODULE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is outside 1-65535")
    return port


class RegistrySpec(_Strict):
    """The registry process. ``enabled = false`` uses an existing registry at ``url``."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8400
    data_dir: str | None = None
    # Where nodes find the registry when it is not started here.
    url: str | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return _check_port(v)

    @property
    def public_url(self) -> str:
        return self.url or f"http://{self.host}:{self.port}"


class NodeSpec(_Strict):
    """One agent, run as ``replicas`` processes on consecutive ports."""

    module: str
    port: int | str
    replicas: int = Field(default=1, ge=1, le=32)
    host: str = "127.0.0.1"
    env: dict[str, str] = Field(default_factory=dict)
    data_dir: str | None = None

    @field_validator("module")
    @classmethod
    def _module(cls, v: str) -> str:
        if not _MODULE.match(v):
            raise ValueError(f"{v!r} is not MODULE:ATTR (e.g. 'agents.credit_bureau:agent')")
        return v

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | str) -> int | str:
        if isinstance(v, int):
            _check_port(v)
            return v
        match = _RANGE.match(v)
        if match is None:
            raise ValueError(f"{v!r} is neither a port number nor a range like '8411-8412'")
        low, high = int(match[1]), int(match[2])
        _check_port(low)
        _check_port(high)
        if low > high:
            raise ValueError(f"range {v!r} is empty (start > end)")
        return v

    @model_validator(mode="after")
    def _room(self) -> NodeSpec:
        if isinstance(self.port, str):
            low, high = (int(x) for x in self.port.split("-"))
            if high - low + 1 < self.replicas:
                raise ValueError(
                    f"port range {self.port!r} has {high - low + 1} port(s) for "
                    f"{self.replicas} replicas"
                )
        elif self.port + self.replicas - 1 > 65535:
            raise ValueError("not enough ports above the given port for every replica")
        return self

    def ports(self) -> list[int]:
        """The port of each replica."""
        low = self.port if isinstance(self.port, int) else int(self.port.split("-")[0])
        return [low + i for i in range(self.replicas)]


@dataclass(frozen=True)
class ProcessSpec:
    """One OS process ``mesh up`` starts and watches."""

    name: str  # unique label, e.g. "credit-bureau-2"
    kind: Literal["registry", "node"]
    agent: str  # the node's key in mesh.toml ("registry" for the registry)
    argv: tuple[str, ...]
    url: str
    # 200 with {"pid": <this process's pid>} when ready (mesh serve and mesh registry do).
    health_url: str
    env: dict[str, str] = field(default_factory=dict)
    # (host, port) it binds, so ``mesh up`` can check the port is free before starting anyone.
    listen: tuple[str, int] | None = None
    # A node registers there: it is healthy only once this registry lists it as passing.
    registry_url: str | None = None


class PolicySpec(_Strict):
    """``[policy]``: the call policy every node gets as ``MESH_ALLOW`` (a node's own ``env``
    setting ``MESH_ALLOW`` wins for that node)."""

    allow: list[str]

    @field_validator("allow")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(
                "an empty allow list would refuse every call: list rules, or remove [policy] "
                "to let every admitted caller call every skill"
            )
        for rule in v:
            try:
                CallPolicy.parse(rule)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @property
    def env(self) -> dict[str, str]:
        return {"MESH_ALLOW": "; ".join(self.allow)}


class MeshFile(_Strict):
    """A parsed ``mesh.toml``."""

    state_dir: str = ".mesh"
    registry: RegistrySpec = Field(default_factory=RegistrySpec)
    env: dict[str, str] = Field(default_factory=dict)
    nodes: dict[str, NodeSpec] = Field(default_factory=dict)
    policy: PolicySpec | None = None

    @field_validator("nodes")
    @classmethod
    def _names(cls, v: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
        for name in v:
            if not _NAME.match(name):
                raise ValueError(
                    f"node name {name!r} is invalid: lowercase letters, digits and '-'"
                )
        return v

    @model_validator(mode="after")
    def _distinct_ports(self) -> MeshFile:
        owners: dict[tuple[str, int], str] = {}
        if self.registry.enabled:
            owners[(self.registry.host, self.registry.port)] = "registry"
        for name, node in self.nodes.items():
            for port in node.ports():
                other = owners.get((node.host, port))
                if other is not None:
                    raise ValueError(f"port {port} is used by both {other!r} and {name!r}")
                owners[(node.host, port)] = name
        return self

    def state_path(self, root: Path) -> Path:
        """The state directory (data, logs, and the running ``mesh up``'s lock and socket)."""
        return (root / self.state_dir).resolve()

    def plan(self, root: Path, *, python: str = sys.executable) -> list[ProcessSpec]:
        """The processes to start, registry first. Relative paths resolve against ``root``."""
        state = self.state_path(root)
        registry_url = self.registry.public_url
        # One started here, or an existing one named by url (else nodes try the default one).
        has_registry = self.registry.enabled or self.registry.url is not None
        specs: list[ProcessSpec] = []
        if self.registry.enabled:
            reg = self.registry
            data_dir = root / reg.data_dir if reg.data_dir else state / "registry"
            specs.append(
                ProcessSpec(
                    name="registry",
                    kind="registry",
                    agent="registry",
                    argv=(
                        python,
                        "-m",
                        "mesh",
                        "registry",
                        "--host",
                        reg.host,
                        "--port",
                        str(reg.port),
                        "--data-dir",
                        str(data_dir),
                    ),
                    url=registry_url,
                    health_url=f"{registry_url}/health",
                    env=dict(self.env),
                    listen=(reg.host, reg.port),
                )
            )
        for name, node in self.nodes.items():
            for i, port in enumerate(node.ports(), start=1):
                label = name if node.replicas == 1 else f"{name}-{i}"
                base = root / node.data_dir if node.data_dir else state / name
                data_dir = base if node.replicas == 1 else base / str(i)
                url = f"http://{node.host}:{port}"
                specs.append(
                    ProcessSpec(
                        name=label,
                        kind="node",
                        agent=name,
                        argv=(
                            python,
                            "-m",
                            "mesh",
                            "serve",
                            node.module,
                            "--host",
                            node.host,
                            "--port",
                            str(port),
                            "--data-dir",
                            str(data_dir),
                            "--registry",
                            registry_url,
                        ),
                        url=url,
                        health_url=f"{url}/health",
                        env={
                            **self.env,
                            **(self.policy.env if self.policy else {}),
                            "MESH_REGISTRY": registry_url,
                            **node.env,
                        },
                        listen=(node.host, port),
                        registry_url=registry_url if has_registry else None,
                    )
                )
        return specs


def meshfiles_in(folder: Path) -> list[Path]:
    """The ``MESHFILE_NAMES`` that exist in ``folder``, in order; ``ConfigError`` (saying where
    it looked and what to do) when there is none."""
    found = [folder / name for name in MESHFILE_NAMES if (folder / name).is_file()]
    if not found:
        looked = " or ".join(MESHFILE_NAMES)
        raise ConfigError(
            f"no mesh file in {folder} (looked for {looked}): run this in the folder of your "
            "mesh.toml, or give its path"
        )
    return found


def load_meshfile(path: str | Path) -> MeshFile:
    """Read and validate a mesh file; every mistake is a ``ConfigError`` naming the field."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"mesh file {str(path)!r} not found: give its path (e.g. agents/mesh.toml), "
            "relative to the folder you run mesh in"
        ) from exc
    try:
        data: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        meshfile = MeshFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from exc
    if not meshfile.nodes:
        raise ConfigError(f"{path}: no [nodes.<name>] tables: nothing to run")
    return meshfile

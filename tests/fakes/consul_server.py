"""A Consul agent's HTTP API on 127.0.0.1 for tests, answering with Consul's recorded bodies.

Its catalog starts as the one recorded in ``tests/fixtures/consul/`` (what a Consul agent
answers, field for field; the sources are in the README there) and changes as a client
registers and deregisters services on it, the way the agent records them: a registration's
name, id, tags, address, port and meta become the entry's ``Service``, its check a
``service:<id>`` check that starts ``critical``, on this agent's node (``worker-1``). The real
py-consul client, and so mesh's ``ConsulBackend``, run unchanged against it: a blocking query
(``index`` + ``wait``) waits for a change, the blocking endpoints send ``X-Consul-Index``, and
the register endpoint refuses with a 400 what Consul refuses (service meta beyond its limits, an
HTTP check without an interval) and, stricter than Consul, a field Consul does not document.

What a test turns on (each answer's source is in the fixtures' README):

- ``acl_token``: ACLs with ``default_policy = "deny"``: a request without that token is 403.
- ``leader = False``: the servers lost their leader: a read that is not ``stale`` is 500 "No
  cluster leader", a stale one answers with ``X-Consul-KnownLeader: false``.
- ``rate_limited = True``: every request is 429 (Consul's RPC rate limit).
- ``set_index(n)``: the index goes to ``n`` (backwards after a snapshot restore, or 0).
- a blocking query waits as Consul's do: ``index`` 0 (or none) answers at once, ``wait``
  missing or 0 is five minutes; ``queries`` records each request's path and parameters.
- ``FakeConsul(port=...)`` binds a given port (an agent restarting), ``tls=(cert, key)`` serves
  HTTPS, ``client_ca=`` asks for a client certificate signed by it (``verify_incoming``).

    with FakeConsul() as consul:
        backend = ConsulBackend(consul.address)
        await backend.register(registration)
        consul.registrations[-1]                # the body py-consul sent
        consul.set_status("credit-bureau-7f3a", "passing")
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["AGENT_NODE", "FIXTURES", "FakeConsul", "health_host", "real_consul_address", "recorded"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "consul"
# The node whose agent answers: services registered through it run there.
AGENT_NODE = "worker-1"

# The fields of PUT /v1/agent/service/register's body and of a check in it
# (website/content/api-docs/agent/service.mdx and agent/check.mdx), compared as Consul decodes
# them: case-insensitive, snake_case allowed.
_SERVICE_FIELDS = {
    "name", "id", "tags", "address", "taggedaddresses", "meta", "namespace", "port", "kind",
    "proxy", "connect", "check", "checks", "enabletagoverride", "weights", "socketpath",
    "locality",
}  # fmt: skip
_CHECK_FIELDS = {
    "id", "checkid", "name", "notes", "interval", "deregistercriticalserviceafter", "args",
    "aliasnode", "aliasservice", "dockercontainerid", "shell", "grpc", "grpcusetls", "h2ping",
    "http", "method", "body", "header", "timeout", "outputmaxsize", "tlsservername",
    "tlsskipverify", "tcp", "ttl", "serviceid", "status", "successbeforepassing",
    "failuresbeforecritical",
}  # fmt: skip
# Service meta rules (agent/structs/structs.go: metaKeyFormat, metaKeyMaxLength,
# metaValueMaxLength, metaMaxKeyPairs, metaKeyReservedPrefix).
_META_KEY = re.compile(r"^[a-zA-Z0-9_-]+$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
# agent/consul/rpc.go: a blocking query without a wait (or with 0) waits this long.
_DEFAULT_WAIT_S = 300.0
# The anonymous token's accessor id (agent/structs/acl.go, ACLTokenAnonymousID).
_ANONYMOUS = "00000000-0000-0000-0000-000000000002"
# The only filter the fake evaluates: a tag in Service.Tags (what mesh sends).
_TAG_FILTER = re.compile(r'^("(?:[^"\\]|\\.)*") in Service\.Tags$')
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def recorded(name: str) -> Any:
    """A recorded answer from ``tests/fixtures/consul/`` (a fresh copy each call)."""
    return json.loads((FIXTURES / name).read_text())


def _seconds(duration: str) -> float:
    match = _DURATION.match(duration)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("_", "").lower(): value for key, value in body.items()}


class Refused(Exception):
    """What Consul answers 400 to; the message is its reason."""


def _meta_problem(meta: dict[str, Any]) -> str | None:
    if len(meta) > 64:
        return "Node metadata cannot contain more than 64 key/value pairs"
    for key, value in meta.items():
        problem = None
        if not _META_KEY.match(key):
            problem = "Key contains invalid characters"
        elif len(key) > 128:
            problem = "Key is too long (limit: 128 characters)"
        elif key.startswith("consul-"):
            problem = "Key prefix 'consul-' is reserved for internal use"
        elif len(str(value)) > 512:
            problem = "Value is too long (limit: 512 characters)"
        if problem:
            return f"Couldn't load metadata pair ('{key}', '{value}'): {problem}"
    return None


class FakeConsul:
    """The fake agent: a Starlette app under uvicorn, in a thread, on a socket it bound itself.
    ``recorded_services=False`` starts with no service (the nodes' records stay)."""

    def __init__(
        self,
        *,
        recorded_services: bool = True,
        port: int = 0,
        tls: tuple[Path, Path] | None = None,
        client_ca: Path | None = None,
    ) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        for path in sorted(FIXTURES.glob("health_service_*.json")):
            for entry in json.loads(path.read_text()):
                serf = next(c for c in entry["Checks"] if c["CheckID"] == "serfHealth")
                self.nodes[entry["Node"]["Node"]] = (entry["Node"], serf)
                if recorded_services:
                    self.entries[entry["Service"]["ID"]] = entry
        self.registrations: list[dict[str, Any]] = []
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.acl_token: str | None = None
        self.leader = True
        self.rate_limited = False
        self.index = 41
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._closing = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port = int(self._sock.getsockname()[1])
        scheme = "consul+https" if tls else "consul"
        self.address = f"{scheme}://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/v1/health/service/{name}", self._health_service),
                Route("/v1/catalog/services", self._catalog_services),
                Route("/v1/agent/services", self._agent_services),
                Route("/v1/agent/service/register", self._register, methods=["PUT"]),
                Route(
                    "/v1/agent/service/deregister/{service_id}", self._deregister, methods=["PUT"]
                ),
                Route("/v1/status/leader", self._leader),
            ],
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=1,
            ssl_certfile=str(tls[0]) if tls else None,
            ssl_keyfile=str(tls[1]) if tls else None,
            ssl_ca_certs=str(client_ca) if client_ca else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca else ssl.CERT_NONE,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    # -- what a test changes ------------------------------------------------------------------

    def set_status(self, service_id: str, status: str) -> None:
        """Set the status of the service's own check (as Consul's check run would)."""
        with self._lock:
            for check in self.entries[service_id]["Checks"]:
                if check["ServiceID"] == service_id:
                    check["Status"] = status
                    check["ModifyIndex"] = self.index + 1
            self._changed_locked()

    def set_index(self, index: int) -> None:
        """Move the index to ``index`` (backwards: a snapshot restored; 0: a Consul bug),
        answering the blocking queries."""
        with self._lock:
            self.index = index - 1
            self._changed_locked()

    def _changed_locked(self) -> None:
        self.index += 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeConsul:
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake Consul did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)  # blocking queries answer now
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        self._sock.close()

    def __enter__(self) -> FakeConsul:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the endpoints ------------------------------------------------------------------------

    async def _block(self, request: Request) -> None:
        """A blocking query: wait while the index is not past the one asked for. Index 0 does
        not block (agent/blockingquery: "performs a blocking query if MinQueryIndex > 0")."""
        if self._changed is None:
            self._loop, self._changed = asyncio.get_running_loop(), asyncio.Event()
        asked = int(request.query_params.get("index", "0"))
        if asked <= 0:
            return
        loop = asyncio.get_running_loop()
        wait = _seconds(request.query_params.get("wait", "")) or _DEFAULT_WAIT_S
        deadline = loop.time() + wait
        while self.index <= asked and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return

    def _json(self, body: Any) -> JSONResponse:
        # agent/http.go setMeta: every read says whether a leader is known.
        return JSONResponse(
            body,
            headers={
                "X-Consul-Index": str(self.index),
                "X-Consul-KnownLeader": "true" if self.leader else "false",
                "X-Consul-LastContact": "0",
            },
        )

    def _refusal(
        self, request: Request, *, read: bool = False, lacks: str = "'service:write'"
    ) -> Response | None:
        """What Consul answers before it looks at the request: 429, 403 or (a read that needs
        the leader while there is none) 500."""
        self.queries.append((request.url.path, dict(request.query_params)))
        if self.rate_limited:
            # agent/consul/rate/handler.go ErrRetryElsewhere, as agent/http.go answers it.
            return PlainTextResponse("rate limit exceeded, try a different server", status_code=429)
        if self.acl_token is not None:
            token = request.headers.get("X-Consul-Token")
            if token is None:
                # acl/errors.go PermissionDeniedByACL's message.
                return PlainTextResponse(
                    f"Permission denied: token with AccessorID '{_ANONYMOUS}' lacks permission "
                    f"{lacks}",
                    status_code=403,
                )
            if token != self.acl_token:
                return PlainTextResponse("ACL not found", status_code=403)
        if read and not self.leader and "stale" not in request.query_params:
            return PlainTextResponse("No cluster leader", status_code=500)
        return None

    async def _health_service(self, request: Request) -> Response:
        name = request.path_params["name"]
        refused = self._refusal(request, read=True, lacks=f"'service:read' on \"{name}\"")
        if refused is not None:
            return refused
        tags = request.query_params.getlist("tag")
        expr = request.query_params.get("filter")
        if expr is not None:
            match = _TAG_FILTER.match(expr)
            if match is None:
                return PlainTextResponse(
                    f"Failed to create boolexpr evaluator for expression {expr!r}", status_code=400
                )
            tags.append(json.loads(match.group(1)))
        await self._block(request)
        passing = request.query_params.get("passing") in ("", "1", "true")
        with self._lock:
            found = [
                copy.deepcopy(e)
                for e in self.entries.values()
                if e["Service"]["Service"] == name
                and all(t in e["Service"]["Tags"] for t in tags)
                and (not passing or all(c["Status"] == "passing" for c in e["Checks"]))
            ]
        return self._json(found)

    async def _catalog_services(self, request: Request) -> Response:
        refused = self._refusal(request, read=True, lacks="'service:read' on \"consul\"")
        if refused is not None:
            return refused
        await self._block(request)
        with self._lock:
            services: dict[str, list[str]] = {}
            for entry in self.entries.values():
                tags = services.setdefault(entry["Service"]["Service"], [])
                tags.extend(t for t in entry["Service"]["Tags"] if t not in tags)
        return self._json(services)

    async def _agent_services(self, request: Request) -> Response:
        refused = self._refusal(request)  # the agent answers from its own state: no leader
        if refused is not None:
            return refused
        with self._lock:
            return JSONResponse(
                {
                    sid: _agent_service(entry)
                    for sid, entry in self.entries.items()
                    if entry["Node"]["Node"] == AGENT_NODE
                }
            )

    async def _register(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        raw = await request.body()
        body = json.loads(raw)
        self.registrations.append(body)
        try:
            entry = self._entry(body)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=400)
        with self._lock:
            old = self.entries.get(entry["Service"]["ID"])
            if old is not None:  # the agent keeps a check's status across a re-registration
                statuses = {c["CheckID"]: c["Status"] for c in old["Checks"]}
                for check in entry["Checks"]:
                    check["Status"] = statuses.get(check["CheckID"], check["Status"])
            self.entries[entry["Service"]["ID"]] = entry
            self._changed_locked()
        return Response(status_code=200)

    async def _deregister(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        service_id = request.path_params["service_id"]
        with self._lock:
            entry = self.entries.get(service_id)
            if entry is None or entry["Node"]["Node"] != AGENT_NODE:
                # agent/acl.go vetServiceUpdateWithAuthorizer: the agent only deregisters its
                # own services; any other id (unknown, or on another agent) is a 404.
                return PlainTextResponse(
                    f"Unknown service ID {service_id!r}. Ensure that the service ID is passed, "
                    "not the service name.".replace("'", '"'),
                    status_code=404,
                )
            del self.entries[service_id]
            self._changed_locked()
        return Response(status_code=200)

    async def _leader(self, request: Request) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        # agent/status_endpoint.go: "" while the servers have no leader.
        return JSONResponse(recorded("status_leader.json") if self.leader else "")

    def _entry(self, body: dict[str, Any]) -> dict[str, Any]:
        """The health entry the agent records for a registration body, or ``Refused``."""
        fields = _fields(body)
        unknown = set(fields) - _SERVICE_FIELDS
        if unknown:
            raise Refused(f"Request decode failed: unknown fields {sorted(unknown)}")
        name = fields.get("name")
        if not name:
            raise Refused("Missing service name")
        meta = fields.get("meta") or {}
        problem = _meta_problem(meta)
        if problem:
            raise Refused(f"Invalid Service Meta: {problem}")
        checks = [fields["check"]] if fields.get("check") else list(fields.get("checks") or [])
        service_id = fields.get("id") or name
        tags = list(fields.get("tags") or [])
        address = fields.get("address") or ""
        port = int(fields.get("port") or 0)
        node, serf = self.nodes[AGENT_NODE]
        index = self.index + 1
        service: dict[str, Any] = {
            "ID": service_id,
            "Service": name,
            "Tags": tags,
            "Address": address,
            "Meta": meta or None,
            "Port": port,
            "Weights": fields.get("weights") or {"Passing": 1, "Warning": 1},
            "EnableTagOverride": bool(fields.get("enabletagoverride")),
            "Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "PeerName": "",
            "CreateIndex": index,
            "ModifyIndex": index,
        }
        if _is_ip(address):  # the agent tags an IP address for the LAN and the WAN
            tagged = {"Address": address, "Port": port}
            service["TaggedAddresses"] = {"lan_ipv4": tagged, "wan_ipv4": dict(tagged)}
        own = [
            self._check(check, service, n if len(checks) > 1 else None, index)
            for n, check in enumerate(checks, start=1)
        ]
        return {"Node": copy.deepcopy(node), "Service": service, "Checks": [dict(serf), *own]}

    def _check(
        self, body: dict[str, Any], service: dict[str, Any], n: int | None, index: int
    ) -> dict[str, Any]:
        fields = _fields(body)
        unknown = set(fields) - _CHECK_FIELDS
        if unknown:
            raise Refused(f"Request decode failed: unknown check fields {sorted(unknown)}")
        kind = next((k for k in ("http", "tcp", "ttl", "grpc", "h2ping") if fields.get(k)), "")
        if kind in ("http", "tcp", "grpc", "h2ping") and _seconds(fields.get("interval", "")) <= 0:
            raise Refused(
                "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, or TCP checks"
            )
        service_id = service["ID"]
        return {
            "Node": AGENT_NODE,
            "CheckID": fields.get("checkid")
            or fields.get("id")
            or f"service:{service_id}" + (f":{n}" if n else ""),
            "Name": fields.get("name") or f"Service '{service['Service']}' check",
            # Checks start critical unless the registration says otherwise.
            "Status": fields.get("status") or "critical",
            "Notes": fields.get("notes") or "",
            "Output": "",
            "ServiceID": service_id,
            "ServiceName": service["Service"],
            "ServiceTags": list(service["Tags"]),
            "Type": kind,
            "Interval": fields.get("interval") or "",
            "Timeout": fields.get("timeout") or "",
            "ExposedPort": 0,
            "Definition": {},
            "CreateIndex": index,
            "ModifyIndex": index,
        }


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _agent_service(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry's service as ``GET /v1/agent/services`` shows it."""
    svc = entry["Service"]
    out: dict[str, Any] = {"ID": svc["ID"], "Service": svc["Service"], "Tags": svc["Tags"]}
    if "TaggedAddresses" in svc:
        out["TaggedAddresses"] = svc["TaggedAddresses"]
    out |= {
        "Meta": svc["Meta"],
        "Port": svc["Port"],
        "Address": svc["Address"],
        "Weights": svc["Weights"],
        "EnableTagOverride": svc["EnableTagOverride"],
        "Datacenter": entry["Node"]["Datacenter"],
    }
    return out


# -- the gated tests' real agent ------------------------------------------------------------------


def real_consul_address(addr: str) -> str:
    """``CONSUL_HTTP_ADDR`` as mesh names a Consul address: Consul's CLI takes ``host:port``,
    ``http://host:port`` or ``https://host:port`` (any scheme is stripped, https kept as
    ``consul+https://``)."""
    scheme, sep, rest = addr.strip().partition("://")
    if not sep:
        return f"consul://{scheme.rstrip('/')}"
    prefix = "consul+https" if scheme.lower() == "https" else "consul"
    return f"{prefix}://{rest.rstrip('/')}"


def health_host(default: str = "127.0.0.1") -> str:
    """Where the gated tests' nodes listen and what they advertise: ``MESH_TEST_HEALTH_HOST``
    (an address the Consul agent can reach, e.g. the docker bridge's 172.17.0.1 for an agent in
    a container), else loopback."""
    import os

    return os.environ.get("MESH_TEST_HEALTH_HOST", "").strip() or default

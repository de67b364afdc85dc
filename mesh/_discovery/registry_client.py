"""``RegistryBackend``: ``DiscoveryBackend`` over the mesh registry's HTTP API (``/v1``).

Policy (caching, retries, backoff) belongs to ``DiscoveryClient`` and ``Registrar``; this module
only moves requests and translates failures into ``DiscoveryError`` once.

An instance belongs to whoever registered it: the registration answer carries a secret, which
this backend keeps (in memory, per instance id) and sends as ``Mesh-Instance-Secret`` with
that instance's heartbeats, re-registrations and deregistration. The first registration already
proposes one (random, 32 bytes), so sending it again after a lost answer is still the owner.
When the registry has forgotten the instance (404), the secret is dropped: the next
registration proposes a new one. When the id belongs to another secret (403 ``not_owner``: the
registry forgot it and someone else registered it meanwhile), ``InstanceIdTaken`` says so: the
``Registrar`` then registers under a new id.

A request that fails on a stale kept-alive connection (the server closed it as it was reused:
``RemoteProtocolError``, read/write/connect errors) is sent once more at once on a fresh
connection, so a registry that is up is never reported as "no registry".
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from mesh._discovery.base import (
    DiscoveryUnreachable,
    Instance,
    InstanceIdTaken,
    Registration,
    UnknownInstance,
)
from mesh._errors import AgentNotFound, DiscoveryError
from mesh._pool import create_transport
from mesh._settings import DEFAULT_REGISTRY_URL

__all__ = ["DEFAULT_REGISTRY_URL", "SECRET_HEADER", "RegistryBackend"]

SECRET_HEADER = "Mesh-Instance-Secret"
# What a request on a stale kept-alive connection fails with (before any answer came back).
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)


class RegistryBackend:
    """Talks to one registry. ``token`` is sent as a bearer token on writes."""

    def __init__(
        self,
        url: str = DEFAULT_REGISTRY_URL,
        *,
        token: str | None = None,
        timeout: float = 5.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._owns_http = http is None
        # trust_env=False: a proxy from the environment must never sit between a node and
        # a registry on 127.0.0.1. The pool survives requests cancelled while queued
        # (``mesh._pool``): a heartbeat cancelled at shutdown, a lookup under a deadline.
        self._http = http or httpx.AsyncClient(
            transport=create_transport(), timeout=timeout, trust_env=False
        )
        # instance id -> the secret its registration answer gave (never logged).
        self._secrets: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"RegistryBackend({self.url!r})"

    async def _request(
        self,
        method: str,
        path: str,
        *,
        write: bool = False,
        json: Any = None,
        params: dict[str, str] | None = None,
        instance_id: str | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._token}"} if write and self._token else {}
        secret = self._secrets.get(instance_id) if instance_id else None
        if secret:
            headers[SECRET_HEADER] = secret
        try:
            try:
                response = await self._http.request(
                    method, self.url + path, json=json, params=params, headers=headers
                )
            except _STALE:
                # Most likely a pooled connection the server closed as we reused it (its
                # keep-alive ran out): once more, at once, on a fresh connection. Every
                # registry call is idempotent, so a request that did arrive is safe to repeat.
                response = await self._http.request(
                    method, self.url + path, json=json, params=params, headers=headers
                )
        except httpx.HTTPError as exc:
            raise DiscoveryUnreachable(
                f"no registry at {self.url}: start one with `mesh registry` or set "
                f"MESH_REGISTRY ({type(exc).__name__}: {exc})"
            ) from exc
        if response.status_code == 403 and _code(response) == "not_owner":
            raise InstanceIdTaken(
                f"the registry at {self.url} says this node does not own its instance: "
                f"{_message(response)}"
            )
        if response.status_code in (401, 403):
            raise DiscoveryError(
                f"the registry at {self.url} refused the request: {_message(response)} "
                "(set MESH_REGISTRY_TOKEN to the registry's token)"
            )
        return response

    async def register(self, registration: Registration) -> None:
        body = {
            "instance_id": registration.instance_id,
            "url": registration.url,
            "agent": registration.agent,
            "version": registration.version,
            "card_path": registration.card_path,
        }
        instance_id = registration.instance_id
        # Proposed for a new instance (the registry takes a long enough one as the owner's), so
        # a registration whose answer was lost, sent again, still owns what it created.
        self._secrets.setdefault(instance_id, secrets.token_urlsafe(32))
        response = await self._request(
            "POST", "/v1/instances", write=True, json=body, instance_id=instance_id
        )
        if response.status_code != 201:
            raise DiscoveryError(
                f"the registry at {self.url} rejected {registration.agent} at "
                f"{registration.url}: {_message(response)}"
            )
        try:
            secret = response.json().get("secret")
        except ValueError:
            secret = None
        if isinstance(secret, str) and secret:
            self._secrets[instance_id] = secret

    async def heartbeat(self, instance_id: str) -> None:
        response = await self._request(
            "PUT", f"/v1/instances/{instance_id}/heartbeat", write=True, instance_id=instance_id
        )
        if response.status_code == 404:
            # Forgotten (expired, or a registry that lost its data): the secret goes with it.
            self._secrets.pop(instance_id, None)
            raise UnknownInstance(f"the registry at {self.url} does not know {instance_id}")
        _check(response, self.url)

    async def deregister(self, instance_id: str) -> None:
        response = await self._request(
            "DELETE", f"/v1/instances/{instance_id}", write=True, instance_id=instance_id
        )
        if response.status_code != 404:
            _check(response, self.url)
        self._secrets.pop(instance_id, None)

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        params = {"status": "passing" if passing_only else "any"}
        if agent:
            params["agent"] = agent
        if skill:
            params["skill"] = skill
        response = await self._request("GET", "/v1/instances", params=params)
        _check(response, self.url)
        return [_instance(i) for i in response.json().get("instances", [])]

    async def list_agents(
        self, *, skill: str | None = None, tag: str | None = None, q: str | None = None
    ) -> list[dict[str, Any]]:
        """Agent summaries (``GET /v1/agents``): name, description, version, skills, instances."""
        params = {k: v for k, v in {"skill": skill, "tag": tag, "q": q}.items() if v}
        response = await self._request("GET", "/v1/agents", params=params)
        _check(response, self.url)
        agents: list[dict[str, Any]] = response.json().get("agents", [])
        return agents

    async def get_agent(self, name: str) -> dict[str, Any]:
        """One agent with card, skills (with schemas) and instances. ``AgentNotFound`` if none."""
        response = await self._request("GET", f"/v1/agents/{name}")
        if response.status_code == 404:
            raise AgentNotFound(
                f"no agent named {name!r} in the registry at {self.url}; is it running? "
                "try: mesh ls"
            )
        _check(response, self.url)
        agent: dict[str, Any] = response.json()
        return agent

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"HTTP {response.status_code}"


def _code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _check(response: httpx.Response, url: str) -> None:
    if response.status_code >= 400:
        raise DiscoveryError(f"the registry at {url} answered {_message(response)}")


def _instance(data: dict[str, Any]) -> Instance:
    return Instance(
        instance_id=str(data["instance_id"]),
        agent=str(data["agent"]),
        url=str(data["url"]),
        version=str(data.get("version", "")),
        status=data.get("status", "passing"),
        skills=tuple(data.get("skills", ())),
        meta={"status_reason": str(data.get("status_reason", ""))},
    )

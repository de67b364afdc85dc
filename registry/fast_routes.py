"""``FastRoutes``: the registry's two hottest requests answered below FastAPI's routing.

A fleet's heartbeats (``PUT /v1/instances/{instance_id}/heartbeat``, every instance every 5 s)
and every delegation's discovery (``GET /v1/instances?agent=...``, what a node's ``remote()``
and ``mesh._discovery``'s registry client ask) are most of what a registry is asked. Through
FastAPI each paid its routing (a regex per route until one matches), the dependency and
parameter machinery, a ``Request`` and the exception middleware: more CPU than the work itself
once lookups came from memory (docs/performance.md, "The registry at fleet scale").

This pure-ASGI middleware sits inside ``registry.gate.Gate`` (the write token before the body,
the body cap) and ``registry.metrics.CountRequests`` (it sets the scope's ``route`` to the
FastAPI route it stands in for, so the counter's labels are the same), and answers exactly the
well-formed requests of those two routes, with the same store calls and the same bytes:

- the lookup, when its ``status`` is one FastAPI would accept; any other (a 422 naming the
  field) goes on to FastAPI, which answers it as always;
- the heartbeat, with its ownership check (``Mesh-Instance-Secret``), 404 ``unknown_instance``,
  403 ``not_owner`` and 503 ``store_unavailable`` rendered by the same code as FastAPI's path
  (``registry.api``). It has no body: one within the gate's cap is read and ignored, as FastAPI
  ignores it.

Anything else (another method or path, a ``root_path``) passes through untouched.
``tests/test_registry_fast_routes.py`` sends the same requests, errors included, to both paths
and compares the answers byte for byte.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from mesh._errors import StoreError
from registry import api

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.responses import Response
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Receive, Scope, Send

    from registry.state import RegistryState

__all__ = ["FastRoutes"]

_INSTANCES = "/v1/instances"
_PREFIX = "/v1/instances/"
_SUFFIX = "/heartbeat"
_SECRET = api.SECRET_HEADER.lower().encode("latin-1")
_STATUSES = frozenset({"passing", "warning", "critical", "any"})
_JSON = b"application/json"


class FastRoutes:
    """Answers the lookup and the heartbeat (see the module docstring); ``lookup`` and
    ``heartbeat`` are the FastAPI routes they stand in for (their ``path`` labels the
    request counter)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        state: Callable[[], RegistryState],
        lookup: BaseRoute,
        heartbeat: BaseRoute,
    ) -> None:
        self.app = app
        self._state = state
        self._lookup_route = lookup
        self._heartbeat_route = heartbeat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # With a root_path FastAPI matches on the path without it: leave that to FastAPI.
        if scope["type"] == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "GET" and path == _INSTANCES:
                if await self._lookup(scope, send):
                    return
            elif method == "PUT" and path.startswith(_PREFIX) and path.endswith(_SUFFIX):
                # FastAPI's pattern for {instance_id}: one segment, not empty.
                instance_id = path[len(_PREFIX) : -len(_SUFFIX)]
                if instance_id and "/" not in instance_id:
                    await self._heartbeat(instance_id, scope, send)
                    return
        await self.app(scope, receive, send)

    async def _lookup(self, scope: Scope, send: Send) -> bool:
        query = scope.get("query_string", b"")
        # As Starlette reads a query: latin-1, blanks kept, the last of a repeated name wins.
        params = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)) if query else {}
        status = params.get("status", "passing")
        if status not in _STATUSES:
            return False  # FastAPI's 422 names the field
        state = self._state()
        scope["route"] = self._lookup_route
        try:
            body = await api.instances_body(
                state, agent=params.get("agent"), skill=params.get("skill"), status=status
            )
        except StoreError as exc:
            await _send_response(send, api.store_unavailable("GET", scope["path"], exc))
            return True
        await _send(send, 200, body)
        return True

    async def _heartbeat(self, instance_id: str, scope: Scope, send: Send) -> None:
        state = self._state()
        scope["route"] = self._heartbeat_route
        secret = None
        # The first header of the name, as Starlette's ``Headers.get`` (FastAPI's) reads it.
        for key, value in scope["headers"]:
            if key == _SECRET:
                secret = value.decode("latin-1")
                break
        try:
            body = await api.heartbeat_body(state, instance_id, secret, time.time())
        except api.ApiError as exc:
            await _send_response(send, exc.response())
            return
        except StoreError as exc:
            await _send_response(send, api.store_unavailable("PUT", scope["path"], exc))
            return
        await _send(send, 200, body)


async def _send(send: Send, status: int, body: bytes) -> None:
    # The headers Starlette's ``Response(body, media_type="application/json")`` sends, in order.
    headers = [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", _JSON)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_response(send: Send, response: Response) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response.raw_headers,
        }
    )
    await send({"type": "http.response.body", "body": response.body})

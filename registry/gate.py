"""``Gate``: what every request to the registry passes before a route reads a byte of its body.

Pure ASGI (the node's ``mesh._gate.RequestGate`` is its twin; both read a request through
``mesh._asgi``), outermost of the app's middleware:

- a write (any method but GET, HEAD, OPTIONS) needs ``Authorization: Bearer <token>`` when the
  registry has a token: 401 without it, 403 with a wrong one, answered BEFORE the body is read,
  so an anonymous client cannot make the registry buffer anything;
- except the console's forms (``/console/...``): a browser cannot send a bearer token, so those
  routes check the operator's session, its CSRF token and the origin instead
  (``registry.operator``), and refuse everything when the registry has no token;
- a body is at most ``max_body_bytes``: a larger declared ``Content-Length`` is refused at once,
  and a streamed (chunked) body as soon as it passes the limit, with 413.

A refusal closes the connection (``Connection: close``): the rest of the body is never read.
A body within the limit is handed to the app as one message, so routes read it as usual.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mesh._asgi import BodyTooLarge, bearer, read_body, replay
from registry.metrics import RegistryMetrics

__all__ = ["CONSOLE_PREFIX", "Gate"]

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The console's forms: checked by their routes (``registry.operator``), not with a bearer token.
CONSOLE_PREFIX = "/console/"


class Gate:
    """Token before body, and a bounded body (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_body_bytes: int,
        metrics: RegistryMetrics | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (
            self.token is not None
            and scope["method"] not in _SAFE_METHODS
            and not str(scope.get("path", "")).startswith(CONSOLE_PREFIX)
        ):
            given = bearer(scope)
            if not given:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    401,
                    "unauthorized",
                    "this registry requires a token for writes: send "
                    "'Authorization: Bearer <token>' (nodes: set MESH_REGISTRY_TOKEN)",
                    {"WWW-Authenticate": "Bearer"},
                )
                return
            if not hmac.compare_digest(given, self.token.encode()):
                await self._refuse(
                    scope,
                    receive,
                    send,
                    403,
                    "forbidden",
                    "wrong registry token (nodes: set MESH_REGISTRY_TOKEN to the registry's)",
                )
                return
        try:
            body = await read_body(scope, receive, limit=self.max_body_bytes)
        except BodyTooLarge:
            await self._too_large(scope, receive, send)
            return
        if body is not None:
            await self.app(scope, replay(body, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._refuse(
            scope,
            receive,
            send,
            413,
            "body_too_large",
            f"request body over {self.max_body_bytes} bytes: a registration is well under 4 KB",
        )

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        if self.metrics is not None:
            # No route was matched: one fixed label keeps the series bounded.
            self.metrics.requests.labels(route="gate", status=str(status)).inc()
        # Close: whatever of the body is still on its way is never read.
        response = JSONResponse(
            {"error": code, "message": message},
            status_code=status,
            headers={**(headers or {}), "Connection": "close"},
        )
        await response(scope, receive, send)

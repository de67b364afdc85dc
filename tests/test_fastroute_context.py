"""The fast route's call context (``FastRoute._context``) holds what the SDK's builder makes
for the same request, and is the validated ``ServerCallContext(...)`` the route built before
it was made without pydantic's validation (the same fields marked given: the defaults left
unmarked when no extension is asked for, as then)."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.auth.user import UnauthenticatedUser
from a2a.extensions.common import HTTP_EXTENSION_HEADER
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.types import SendMessageRequest
from starlette.requests import Request

from mesh._a2a.fastroute import FastRoute, _call_context

EXT = HTTP_EXTENSION_HEADER.lower().encode()

HEADERS: dict[str, list[tuple[bytes, bytes]]] = {
    "plain": [(b"content-type", b"application/json"), (b"a2a-version", b"1.0")],
    "name twice": [(b"x-one", b"first"), (b"x-one", b"second"), (b"host", b"h")],
    "extensions": [(EXT, b"urn:a, urn:b"), (b"content-type", b"application/json")],
    "extensions twice": [(EXT, b"urn:a"), (EXT, b"urn:c,urn:a"), (b"host", b"h")],
    "latin-1": [(b"x-name", "caf\u00e9".encode("latin-1"))],
}


def _same(fast: ServerCallContext, sdk: ServerCallContext) -> None:
    assert type(fast) is ServerCallContext
    assert fast.state == sdk.state
    assert type(fast.user) is type(sdk.user) is UnauthenticatedUser
    assert fast.tenant == sdk.tenant
    assert fast.requested_extensions == sdk.requested_extensions
    assert fast.__pydantic_extra__ == sdk.__pydantic_extra__
    assert fast.__pydantic_private__ == sdk.__pydantic_private__
    assert fast.model_dump(exclude={"user"}) == sdk.model_dump(exclude={"user"})
    assert list(fast.__dict__) == list(sdk.__dict__)


@pytest.mark.parametrize("case", sorted(HEADERS))
@pytest.mark.parametrize("tenant", ["", "acme"])
def test_the_context_is_the_sdk_builders(case: str, tenant: str) -> None:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": HEADERS[case],
        "query_string": b"",
    }
    route = FastRoute.__new__(FastRoute)
    route._contexts = DefaultServerCallContextBuilder()
    fast = route._context(scope, SendMessageRequest(tenant=tenant))
    sdk = DefaultServerCallContextBuilder().build(Request(scope))
    sdk.tenant = tenant  # as the route sets it on the builder's context
    _same(fast, sdk)
    if sdk.requested_extensions:
        before = ServerCallContext(
            user=UnauthenticatedUser(),
            state={"headers": sdk.state["headers"]},
            requested_extensions=sdk.requested_extensions,
            tenant=tenant,
        )
    else:
        before = ServerCallContext(state={"headers": sdk.state["headers"]}, tenant=tenant)
    _same(fast, before)
    assert fast.model_fields_set == before.model_fields_set


def test_each_context_has_its_own_state_user_and_extensions() -> None:
    given = frozenset({"state", "tenant"})
    first = _call_context({"headers": {}}, "", given, set())
    second = _call_context({"headers": {}}, "", given, set())
    first.state["mesh.x"] = 1
    first.requested_extensions.add("urn:a")
    first.model_fields_set.add("user")
    assert second.state == {"headers": {}}
    assert second.requested_extensions == set()
    assert second.model_fields_set == {"state", "tenant"}
    assert first.user is not second.user
    validated = ServerCallContext(state={"headers": {}}, tenant="")
    _same(second, validated)
    assert second.model_fields_set == validated.model_fields_set

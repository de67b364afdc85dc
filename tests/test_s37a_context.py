"""The fast route's call context (``FastRoute._context``), its headers read in a loop and its
model's slots set through their descriptors (session 37), is what the SDK's builder makes for
any header list: names given twice (their first value), any latin-1 bytes, the extensions
header or not, any tenant; and the model is whole (its copy, its dump, its equality)."""

from __future__ import annotations

from typing import Any

from a2a.auth.user import UnauthenticatedUser
from a2a.extensions.common import HTTP_EXTENSION_HEADER
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.types import SendMessageRequest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from mesh._a2a.fastroute import FastRoute

EXT = HTTP_EXTENSION_HEADER.lower().encode()

_names = st.one_of(
    st.sampled_from([b"content-type", b"a2a-version", b"host", b"x-one", EXT, b"traceparent"]),
    # ASGI names are lowercase (Starlette's Headers relies on it).
    st.text("abxyz-0\u00e9\u00ff", min_size=1, max_size=6).map(lambda n: n.encode("latin-1")),
)
_values = st.one_of(
    st.sampled_from([b"1.0", b"urn:a, urn:b", b"urn:c,urn:a", b"", b"application/json"]),
    st.binary(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _values), max_size=8), st.sampled_from(["", "acme", "\u00e9"]))
def test_the_context_is_the_sdk_builders_for_any_headers(
    headers: list[tuple[bytes, bytes]], tenant: str
) -> None:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": headers,
        "query_string": b"",
    }
    route = FastRoute.__new__(FastRoute)
    route._contexts = DefaultServerCallContextBuilder()
    fast = route._context(scope, SendMessageRequest(tenant=tenant))
    sdk = DefaultServerCallContextBuilder().build(Request(scope))
    sdk.tenant = tenant
    assert type(fast) is ServerCallContext
    assert type(fast.user) is UnauthenticatedUser
    assert fast.state == sdk.state
    assert list(fast.state["headers"].items()) == list(sdk.state["headers"].items())
    assert fast.tenant == sdk.tenant
    assert fast.requested_extensions == sdk.requested_extensions
    assert list(fast.__dict__) == list(sdk.__dict__)
    assert fast.__pydantic_extra__ is None
    assert fast.__pydantic_private__ is None
    given_fields = {"state", "tenant"} | (
        {"user", "requested_extensions"} if any(name == EXT for name, _ in headers) else set()
    )
    assert fast.model_fields_set == given_fields
    assert fast.model_dump(exclude={"user"}) == sdk.model_dump(exclude={"user"})
    copied = fast.model_copy()
    assert copied.model_dump(exclude={"user"}) == fast.model_dump(exclude={"user"})
    assert copied.model_fields_set == fast.model_fields_set

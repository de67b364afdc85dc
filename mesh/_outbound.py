"""``bounded_get``: a GET of a URL someone else chose, in bounded time and memory.

The registry fetches cards and probes ``/health`` at URLs whoever registers chose; a node reads
the card of every peer discovery names before it trusts it. Such an answer may be huge or
trickle in one byte a second: httpx's timeout is per read and its ``.content`` buffers
everything. Here a request has ONE deadline for connect, headers and body together, and the body
is read in chunks and abandoned as soon as it passes ``max_bytes``. With a guarded client
(``mesh._netguard.create_http_client``) a host outside the allowed networks fails as ``refused``
before any connection is made; a server whose certificate does not verify
(``mesh._tls.client_context``) fails as ``tls``, before any request is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from mesh._errors import FetchFailed
from mesh._netguard import AddressRefused
from mesh._tls import verify_failure

__all__ = ["BoundedResponse", "FetchFailed", "bounded_get"]


@dataclass(frozen=True)
class BoundedResponse:
    status_code: int
    content: bytes
    headers: httpx.Headers


async def _read(
    http: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None, max_bytes: int
) -> BoundedResponse:
    # identity: ask for no compression; a server that compresses anyway is counted decoded,
    # chunk by chunk, so a small compressed body cannot expand past the cap.
    sent = {"Accept-Encoding": "identity", **(headers or {})}
    async with http.stream("GET", url, headers=sent) as response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise FetchFailed("too_large", f"Content-Length {declared} > {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise FetchFailed("too_large", f"more than {max_bytes} bytes")
            chunks.append(chunk)
        return BoundedResponse(response.status_code, b"".join(chunks), response.headers)


async def bounded_get(
    http: httpx.AsyncClient,
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> BoundedResponse:
    """GET ``url``: the whole answer within ``timeout_s`` and ``max_bytes``, else ``FetchFailed``."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(http, url, headers, max_bytes)
    except TimeoutError as exc:
        raise FetchFailed("timeout", f"no whole answer within {timeout_s:g}s") from exc
    except httpx.HTTPError as exc:
        if isinstance(exc.__cause__, AddressRefused):
            # Chained to the refusal itself: callers read its ``allowed`` networks.
            raise FetchFailed("refused", str(exc.__cause__)) from exc.__cause__
        failure = verify_failure(exc)
        if failure is not None:
            # Refused at the handshake: the request (and any header) was never sent.
            why = failure.verify_message or failure.reason or "certificate verify failed"
            raise FetchFailed("tls", f"TLS verification failed: {why}") from exc
        raise FetchFailed("unreachable", f"{type(exc).__name__}: {exc}") from exc
    except httpx.InvalidURL as exc:  # stored before the URL rules existed: fail, never crash
        raise FetchFailed("unreachable", f"InvalidURL: {exc}") from exc

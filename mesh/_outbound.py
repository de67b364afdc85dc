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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import h11
import httpx

from mesh._errors import FetchFailed
from mesh._netguard import AddressRefused
from mesh._pool import Resolver, open_checked, plain_mesh_transport
from mesh._tls import verify_failure

__all__ = ["BoundedResponse", "FetchFailed", "bounded_get", "get_once"]

_READ_BYTES = 65_536


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


@contextmanager
def _translated(timeout_s: float) -> Iterator[None]:
    """httpx's failures (and the deadline) as ``FetchFailed`` with its fixed reason words."""
    try:
        yield
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


async def bounded_get(
    http: httpx.AsyncClient,
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> BoundedResponse:
    """GET ``url``: the whole answer within ``timeout_s`` and ``max_bytes``, else ``FetchFailed``."""
    with _translated(timeout_s):
        async with asyncio.timeout(timeout_s):
            return await _read(http, url, headers, max_bytes)


def _resolver_for(http: httpx.AsyncClient, url: httpx.URL) -> Resolver | None:
    """The checking backend of the mesh transport ``http`` sends ``url`` through, when
    ``get_once`` may go around httpx: nothing of the client's own would be missed."""
    transport = plain_mesh_transport(http, url)
    backend = transport.backend if transport is not None else None
    return backend if isinstance(backend, Resolver) else None


async def get_once(
    http: httpx.AsyncClient,
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
) -> BoundedResponse:
    """``bounded_get`` on a connection of its own, closed after the answer (the registry's
    probes: a new connection each is what they cost least with, see ``registry.prober``).

    On a client of ``mesh._netguard.create_http_client`` it goes around httpx (a third of its
    CPU per request, ``tests/bench/probe_connections.py``): h11 on asyncio streams, connected
    like every connection of that client (``mesh._pool.open_checked``: the policy checked on
    the resolved addresses, TLS with ``mesh._tls.client_context()``), with the same deadline,
    byte cap and failures. The answer is taken as sent (identity is asked; a compressed one
    is not decoded, so it cannot expand). Any other client: ``bounded_get`` with
    ``Connection: close``."""
    with _translated(timeout_s):
        parsed = httpx.URL(url)
        resolver = _resolver_for(http, parsed)
        if resolver is None:
            return await bounded_get(
                http, url, max_bytes=max_bytes, timeout_s=timeout_s, headers=_CLOSE
            )
        async with asyncio.timeout(timeout_s):
            return await _get_direct(resolver, parsed, max_bytes)


_CLOSE = {"Connection": "close"}


async def _get_direct(resolver: Resolver, url: httpx.URL, max_bytes: int) -> BoundedResponse:
    scheme = url.scheme
    if scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"{scheme!r} is not http or https")
    port = url.port or (443 if scheme == "https" else 80)
    state = h11.Connection(h11.CLIENT)
    try:
        request = state.send(
            h11.Request(
                method="GET",
                target=url.raw_path,
                headers=[
                    ("Host", url.netloc.decode("ascii")),
                    ("Accept-Encoding", "identity"),
                    ("Connection", "close"),
                ],
            )
        )
    except h11.LocalProtocolError as exc:
        raise httpx.LocalProtocolError(str(exc)) from exc
    reader, writer = await open_checked(resolver, scheme, url.host, port, None)
    try:
        try:
            writer.write(request + state.send(h11.EndOfMessage()))
            status, headers, chunks, size = 0, httpx.Headers(), [], 0
            while True:
                event = state.next_event()
                if event is h11.NEED_DATA:
                    state.receive_data(await reader.read(_READ_BYTES))
                elif isinstance(event, h11.Response):
                    status, headers = event.status_code, httpx.Headers(event.headers)
                    declared = headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > max_bytes:
                        raise FetchFailed("too_large", f"Content-Length {declared} > {max_bytes}")
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > max_bytes:
                        raise FetchFailed("too_large", f"more than {max_bytes} bytes")
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    return BoundedResponse(status, b"".join(chunks), headers)
                elif isinstance(event, h11.ConnectionClosed):
                    raise httpx.RemoteProtocolError("Server disconnected without an answer.")
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
    finally:
        # The answer is whole (or abandoned): nothing more is read or sent on it.
        writer.transport.abort()

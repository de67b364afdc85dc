"""How a service listens: ``bind_listener``, the socket it binds before uvicorn starts, and
``http_protocol``, the HTTP protocol uvicorn serves it with.

    sock = bind_listener("127.0.0.1", 8401)      # ConfigError: "port 8401 on 127.0.0.1 is ..."
    config = uvicorn.Config(app, http=http_protocol(), ...)
    uvicorn.Server(config).run(sockets=[sock])

Binding first turns a busy port into one ``ConfigError`` line (uvicorn would log a stack of its
own and exit 1), so ``mesh serve`` and ``mesh registry`` exit with ``EX_CONFIG`` and ``mesh up``
does not restart them. ``mesh up`` uses the same bind to check every port before it starts
anything.

``mesh serve`` and ``mesh registry`` serve with ``mesh._one_write.OneWriteProtocol`` (an answer
in one write; a refused body's connection closed once the client has stopped sending it) when
httptools is installed, as it is with mesh's dependencies; else with uvicorn's own choice.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from mesh._errors import ConfigError

__all__ = ["bind_listener", "http_protocol"]


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket on ``host:port``, inheritable so uvicorn can use
    it. A busy port or an address that is not this machine's is a ``ConfigError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio's own loop (uvicorn's when uvloop is absent) sets TCP_NODELAY
    # on an accepted connection only when the socket says it is TCP by its proto, and accepted
    # sockets copy the listener's. Without it uvicorn's two writes of an answer (head, then
    # body) meet Nagle and the client's delayed ACK: ~45 ms per request instead of ~1
    # (docs/performance.md "The listening socket"). uvloop sets it either way.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A port left in TIME_WAIT by a process that just stopped is free to take again.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use; stop what runs there or pick "
                "another --port"
            ) from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def http_protocol() -> Any:
    """uvicorn's ``http`` setting for a mesh service: ``OneWriteProtocol``, or ``"auto"`` (its
    h11 protocol) where httptools, which that protocol builds on, is not installed."""
    try:
        from mesh._one_write import OneWriteProtocol
    except ImportError:  # no httptools (a plain install): two writes an answer, closed at once
        return "auto"
    return OneWriteProtocol

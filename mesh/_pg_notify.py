"""``PgListener``: how processes sharing one PostgreSQL learn of each other's writes, at once.

Replicas on one database (the node's tasks, the registry's records) each keep something in
memory that another replica's write makes stale: a follower of a task another replica runs, a
registry's lookup view. A writer publishes with ``NOTIFY`` (``pg_notify(channel, payload)``;
inside its write's transaction, the notification is delivered when that commits, in commit
order), and every replica listens (``LISTEN``) on one connection of its own, opened in its lifespan
and closed with it (``start`` / ``aclose``).

NOTIFY is not durable: a notification sent while a listener is disconnected is lost. So the
listener reconnects on its own (backing off to ``MAX_BACKOFF_S``) and then calls its
``on_reconnect`` callbacks, which reload what they keep; each user keeps a slow poll of the
database as well, the safety net for anything missed. A payload is at most ``MAX_PAYLOAD``
bytes (PostgreSQL's limit is 8000): a bigger message is sent as a pointer and the reader reads
the row.

``notify`` sends on a second connection (the listening one is busy waiting); in order, one at
a time. Its errors are logged, never raised: a writer's work does not fail because a follower
could not be told (the poll will tell it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from mesh._errors import StoreError
from mesh._pg import _said

__all__ = ["MAX_PAYLOAD", "PgListener"]

log = logging.getLogger("mesh.pg")

#: Largest payload sent whole (PostgreSQL refuses 8000 bytes and more).
MAX_PAYLOAD = 7900
#: Longest wait between two attempts to open the LISTEN connection again.
MAX_BACKOFF_S = 5.0
# A connection that waits this long with nothing heard is checked with a query, so a server
# that vanished without closing the socket is found within about this (plus TCP keepalives).
_CHECK_S = 10.0
_CONNECT: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class PgListener:
    """One LISTEN connection of a process, for the channels its users register (``on``)
    before ``start``. ``await listener.start()`` connects (``StoreError`` if it cannot), then
    a task of its own reads notifications and hands each payload to the channel's handlers
    (plain functions, called on the event loop, in the order the server delivered them)."""

    def __init__(self, url: str, *, name: str = "mesh-listen") -> None:
        self._url = url
        self._name = name
        self._handlers: dict[str, list[Callable[[str], None]]] = {}
        self._reconnected: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._send: psycopg.AsyncConnection[Any] | None = None
        self._send_lock = asyncio.Lock()
        #: Set while LISTEN is in effect (cleared from a drop until the reconnect).
        self.connected = asyncio.Event()
        #: Times the LISTEN connection was lost (metrics, tests).
        self.drops = 0
        #: Notifications heard (tests).
        self.heard = 0

    def on(self, channel: str, handler: Callable[[str], None]) -> None:
        """Call ``handler(payload)`` for each notification on ``channel``."""
        self._handlers.setdefault(channel, []).append(handler)

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time LISTEN is in effect again after a drop: whatever was
        sent meanwhile is lost, so the user reloads what it keeps."""
        self._reconnected.append(callback)

    async def start(self) -> None:
        """Connect and LISTEN, then keep doing so until ``aclose``."""
        conn = await self._listen()
        self._task = asyncio.create_task(self._run(conn), name=self._name)

    async def notify(self, channel: str, payload: str) -> bool:
        """Send one notification (outside any transaction: delivered at once); whether it
        was sent. ``payload`` must be under ``MAX_PAYLOAD`` bytes."""
        async with self._send_lock:
            for attempt in range(2):
                try:
                    if self._send is None or self._send.closed:
                        self._send = await psycopg.AsyncConnection.connect(
                            self._url,
                            autocommit=True,
                            application_name=f"{self._name}-send",
                            **_CONNECT,
                        )
                    await self._send.execute("select pg_notify(%s, %s)", (channel, payload))
                    return True
                except psycopg.Error as exc:
                    if self._send is not None:
                        with contextlib.suppress(psycopg.Error):
                            await self._send.close()
                    self._send = None
                    if attempt:
                        log.warning("could not notify %s: %s", channel, _said(exc, self._url))
        return False

    async def aclose(self) -> None:
        """Stop listening and close both connections."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
        if self._send is not None:
            with contextlib.suppress(psycopg.Error):
                await self._send.close()
            self._send = None

    async def _listen(self) -> psycopg.AsyncConnection[Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, application_name=self._name, **_CONNECT
            )
            for channel in self._handlers:
                await conn.execute(f'listen "{channel}"')
        except psycopg.Error as exc:
            raise StoreError(f"cannot listen on the database: {_said(exc, self._url)}") from exc
        self._conn = conn
        self.connected.set()
        return conn

    async def _run(self, conn: psycopg.AsyncConnection[Any]) -> None:
        backoff = 0.1
        while True:
            try:
                await self._read(conn)
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                self.drops += 1
                log.warning(
                    "the LISTEN connection to the database was lost (%s): reconnecting; "
                    "meanwhile other replicas' writes are seen by polling",
                    _said(exc, self._url) if isinstance(exc, psycopg.Error) else exc,
                )
            with contextlib.suppress(psycopg.Error):
                await conn.close()
            while True:
                await asyncio.sleep(backoff)
                try:
                    conn = await self._listen()
                except StoreError as exc:
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    log.debug("%s", exc)
                    continue
                backoff = 0.1
                break
            log.info("listening to the database again: reloading what other replicas wrote")
            for callback in self._reconnected:
                self._call(callback)

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            got = False
            async for note in conn.notifies(timeout=_CHECK_S):
                got = True
                self.heard += 1
                for handler in self._handlers.get(note.channel, ()):
                    self._call(handler, note.payload)
            if not got:
                await conn.execute("select 1")  # raises if the server is gone

    @staticmethod
    def _call(fn: Callable[..., None], *args: Any) -> None:
        # A handler's bug must not stop every other user's notifications.
        try:
            fn(*args)
        except Exception:
            log.exception("a database notification handler failed")

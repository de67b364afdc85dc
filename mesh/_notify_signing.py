"""Signed PostgreSQL notifications: the key replicas share and the HMAC each message carries.

PostgreSQL grants CONNECT on a database to every role by default, and any connected role may
NOTIFY on any channel without a privilege on a table. So whatever replicas tell each other by
NOTIFY (the task feed, ``mesh._a2a.task_feed``; the registry's view, ``registry.sqlite_store``)
is signed: HMAC-SHA256 cut to 128 bits (``MAC_CHARS`` hex digits in front of the payload), with a
key the first replica stores in a one-row table of its user's schema (readable by that user's
role only), and a message whose signature does not check is dropped.

No psycopg here: a SQLite registry imports its store, and loads no psycopg.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import sqlite3

from mesh._sqlite import Database

__all__ = ["MAC_CHARS", "NotifySigner", "key_schema", "shared_key"]

log = logging.getLogger("mesh.pg")

#: Hex digits of a notification's signature (128 bits), in front of its payload.
MAC_CHARS = 32


def key_schema(table: str) -> str:
    """The DDL of ``table``, which holds the replicas' signing key (one row)."""
    return f"""
create table if not exists {table} (
    id integer primary key,
    key text not null
);
"""


async def shared_key(db: Database, table: str) -> bytes:
    """The replicas' key in ``table`` (made by ``key_schema``): the first replica's is
    everyone's, so this one's is written only if none is there yet."""
    fresh = secrets.token_hex(32)

    def key(conn: sqlite3.Connection) -> str:
        conn.execute(
            f"insert into {table} (id, key) values (1, ?) on conflict do nothing", (fresh,)
        )
        return str(conn.execute(f"select key from {table} where id = 1").fetchone()[0])

    return (await db.write(key)).encode()


class NotifySigner:
    """Signs and checks the notifications of one user with one key. The signature covers the
    channel too (channel, NUL, payload: a message is not good on another channel) unless
    ``bind_channel`` is false (the registry's, which has one channel: the payload alone)."""

    def __init__(self, key: bytes, *, bind_channel: bool = True) -> None:
        self._key = key
        self._bind = bind_channel

    def _mac(self, channel: str, payload: str) -> str:
        message = payload.encode()
        if self._bind:
            message = channel.encode() + b"\0" + message
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:MAC_CHARS]

    def sign(self, channel: str, payload: str) -> str:
        """``payload`` as sent on ``channel``: its signature, then itself."""
        return self._mac(channel, payload) + payload

    def verify(self, channel: str, message: str) -> str | None:
        """The payload of ``message`` heard on ``channel``; None unless its signature checks
        (not one of the replicas': dropped)."""
        payload = message[MAC_CHARS:]
        if hmac.compare_digest(message[:MAC_CHARS], self._mac(channel, payload)):
            return payload
        log.debug("a notification on %s not signed by a replica: dropped", channel)
        return None

"""Where a node's push notifications go: the webhook configs (table ``a2a_push_configs``) and
the check of their URLs. Delivery is ``mesh._a2a.push``'s outbox.

``PushConfigStore`` is the SDK's ``PushNotificationConfigStore``: the handler serves Create / Get /
List / Delete (and the inline config of ``SendMessage``) over it, scoped by owner like the tasks.
``PushUrlCheck`` is the handler's ``push_url_validator``: a2a-sdk's rules with
``MESH_PUSH_NETWORKS`` as the allowed networks; a refused URL is -32602 naming the field and what
to do, never what the host resolved to (whoever set the URL may be probing the node's network).
Configs (with their token and credentials) are stored in clear in ``node.db``, like the tasks.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import PushNotificationConfigStore
from a2a.types import TaskPushNotificationConfig
from a2a.utils.errors import InvalidParamsError

from mesh._errors import NetworkRefused
from mesh._netpolicy import NetworkPolicy
from mesh._sqlite import Database

if TYPE_CHECKING:
    from mesh._a2a.push import PushOutbox

__all__ = ["PushConfigStore", "PushUrlCheck", "config_from_bytes", "delete_configs_of"]

log = logging.getLogger("mesh._a2a.push")

# Version 1 of the "push" component (Database.migrate: a later change is a new step, never an edit).
_SCHEMA = """
create table if not exists a2a_push_configs (
    owner text not null,
    task_id text not null,
    config_id text not null,
    -- the TaskPushNotificationConfig, protobuf bytes
    data blob not null,
    -- ns; the listing order
    created_at integer not null,
    -- the task state (and its status timestamp, ns) last queued for this config
    notified_state integer not null default 0,
    notified_at integer not null default -1,
    -- 1 once a terminal state of its task was queued: nothing more to send
    done integer not null default 0,
    primary key (owner, task_id, config_id)
) without rowid;
create index if not exists a2a_push_configs_open on a2a_push_configs (task_id) where done = 0;
create table if not exists a2a_push_outbox (
    owner text not null,
    task_id text not null,
    config_id text not null,
    -- bumped when a newer state replaces the body (a finished POST of the older one keeps it)
    version integer not null,
    state integer not null,
    -- the JSON POSTed: a StreamResponse holding the task
    body blob not null,
    attempts integer not null default 0,
    -- unix time of the next attempt (of the end of the claim while one is being sent)
    next_at real not null,
    expires_at real not null,
    last_error text not null default '',
    primary key (owner, task_id, config_id)
) without rowid;
create index if not exists a2a_push_outbox_due on a2a_push_outbox (next_at);
"""


def _field_error(field: str, problem: str) -> InvalidParamsError:
    return InvalidParamsError(message=f"{field}: {problem}")


class PushUrlCheck:
    """The handler's ``push_url_validator``: a2a-sdk's ``validate_push_notification_url`` rules
    (http or https, a host that resolves, EVERY address allowed) with ``policy`` deciding which
    addresses are allowed (``MESH_PUSH_NETWORKS``; ``public`` is the SDK's own rule). A refused
    URL raises ``InvalidParamsError`` (-32602) naming the field and what to do, never the
    addresses the host resolved to (whoever set the URL may be probing the node's network)."""

    #: The field as both methods spell it (inline: ``configuration.taskPushNotificationConfig``).
    FIELD = "taskPushNotificationConfig.url"

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy

    async def __call__(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise _field_error(self.FIELD, "not a URL; give an http(s) URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _field_error(self.FIELD, "give an http:// or https:// URL with a host")
        try:
            await self.policy.resolve(parts.hostname, port)
        except NetworkRefused as exc:
            log.warning("push URL refused (%s): %s", self.policy.spec, exc)
            if "does not resolve" in str(exc):
                raise _field_error(self.FIELD, "its host does not resolve") from None
            raise _field_error(
                self.FIELD,
                "its host is outside the networks this node sends push notifications to "
                f"(MESH_PUSH_NETWORKS={self.policy.spec}): use a webhook on a public address, "
                "or have the node's operator add its network to MESH_PUSH_NETWORKS",
            ) from None
        return True


class PushConfigStore(PushNotificationConfigStore):
    """The SDK's ``PushNotificationConfigStore`` over table ``a2a_push_configs``: scoped by
    owner like the tasks, durable, and telling ``outbox`` of each new config (a config set on a
    task that already settled gets that state: the caller learns the end it may have missed
    between a non-blocking send and this call)."""

    def __init__(
        self,
        db: Database,
        outbox: PushOutbox | None = None,
        owner_resolver: OwnerResolver = resolve_user_scope,
    ) -> None:
        self._db = db
        self._outbox = outbox
        self._owner = owner_resolver

    async def initialize(self) -> None:
        await self._db.migrate("push", [_SCHEMA])

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        stored = TaskPushNotificationConfig()
        stored.CopyFrom(notification_config)
        stored.task_id = task_id
        if not stored.id:
            stored.id = task_id
        row = (self._owner(context), task_id, stored.id, stored.SerializeToString(), time.time_ns())
        # Replacing a config keeps what was queued for it (no second notification of a state).
        await self._db.write(
            lambda conn: conn.execute(
                "insert into a2a_push_configs (owner, task_id, config_id, data, created_at) "
                "values (?, ?, ?, ?, ?) on conflict (owner, task_id, config_id) "
                "do update set data = excluded.data",
                row,
            )
        )
        if self._outbox is not None:
            self._outbox.watch(task_id)
        result = TaskPushNotificationConfig()
        result.CopyFrom(stored)
        return result

    async def get_info(
        self, task_id: str, context: ServerCallContext
    ) -> list[TaskPushNotificationConfig]:
        owner = self._owner(context)
        rows = await self._db.read(
            lambda conn: conn.execute(
                "select data from a2a_push_configs where owner = ? and task_id = ? "
                "order by created_at, config_id",
                (owner, task_id),
            ).fetchall()
        )
        return [config_from_bytes(row[0]) for row in rows]

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        """Every config of ``task_id``, whoever set it (the SDK's dispatch read path; mesh's
        own outbox reads the table itself)."""
        rows = await self._db.read(
            lambda conn: conn.execute(
                "select data from a2a_push_configs where task_id = ? order by created_at",
                (task_id,),
            ).fetchall()
        )
        return [config_from_bytes(row[0]) for row in rows]

    async def delete_info(
        self, task_id: str, context: ServerCallContext, config_id: str | None = None
    ) -> None:
        """Delete one config (or all of the caller's for the task), and whatever is still
        queued for it: a deleted webhook gets nothing more."""
        owner = self._owner(context)
        match = "owner = ? and task_id = ?" + ("" if config_id is None else " and config_id = ?")
        args: tuple[str, ...] = (
            (owner, task_id) if config_id is None else (owner, task_id, config_id)
        )

        def delete(conn: sqlite3.Connection) -> int:
            conn.execute(f"delete from a2a_push_configs where {match}", args)
            return conn.execute(f"delete from a2a_push_outbox where {match}", args).rowcount

        dropped = await self._db.write(delete)
        if dropped and self._outbox is not None:
            self._outbox.count("dropped", dropped)


def delete_configs_of(conn: sqlite3.Connection, tasks: list[tuple[str, str]]) -> int:
    """Delete the configs of ``tasks`` ((owner, task id) pairs) and whatever is still queued
    for them (retention, ``mesh._retention``: the tasks are being deleted). Returns how many
    configs went."""
    conn.executemany("delete from a2a_push_outbox where owner = ? and task_id = ?", tasks)
    cur = conn.executemany("delete from a2a_push_configs where owner = ? and task_id = ?", tasks)
    return max(cur.rowcount, 0)


def config_from_bytes(data: bytes) -> TaskPushNotificationConfig:
    config = TaskPushNotificationConfig()
    config.ParseFromString(data)
    return config

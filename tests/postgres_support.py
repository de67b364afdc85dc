"""A real PostgreSQL server for the tests marked ``postgres``: Debian's server binaries
(``/usr/lib/postgresql/<major>/bin``, installed by ``.ci/system-deps``), ``initdb`` into a
temporary folder and ``postgres`` on a free 127.0.0.1 port as a child process, once per
session, stopped and deleted after. ``initdb`` refuses root, so as root (CI) both run as the
unprivileged user ``.ci/system-deps`` creates (``PG_USER``).

    from tests.postgres_support import pg_database, postgres_server  # noqa: F401 (fixtures)

    @pytest.mark.postgres
    def test_x(pg_database: str) -> None: ...   # a fresh, empty database's URL

``database_with(component, ddl)`` makes a fixture ``db``: a ``mesh._pg.PgDatabase`` open on such
a database with ``ddl`` in place, closed after the test.

Missing binaries, driver or user: the test is skipped, the reason saying what to install.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port

#: The user the server runs as when the tests run as root (``.ci/system-deps`` creates it).
PG_USER = "mesh-pg"
_INSTALL = "apt-get install postgresql (what .ci/system-deps does)"


@dataclass(frozen=True)
class PostgresServer:
    """A running server: ``url(db)`` is the URL of database ``db`` on it (user postgres,
    trust authentication on 127.0.0.1)."""

    port: int
    data: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


def server_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding initdb and postgres."""
    found = [
        Path(d)
        for d in glob.glob("/usr/lib/postgresql/*/bin")
        if (Path(d) / "initdb").exists() and (Path(d) / "postgres").exists()
    ]
    found.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return found[-1] if found else None


def _as_user() -> dict[str, str]:
    # Popen's own setuid before exec (not runuser, a parent that would not pass on the
    # shutdown signal): the server is our direct child.
    return {"user": PG_USER, "group": PG_USER} if os.geteuid() == 0 else {}


def _connectable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session (skips when it cannot be had here)."""
    bindir = server_bin()
    if bindir is None:
        pytest.skip(f"PostgreSQL server binaries not under /usr/lib/postgresql/*/bin: {_INSTALL}")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("the psycopg driver is missing: pip install -e '.[postgres]' (make test does)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            pytest.skip(f"running as root needs the user {PG_USER}: run .ci/system-deps")
    with running_postgres(bindir) as server:
        yield server


@contextlib.contextmanager
def running_postgres(bindir: Path) -> Iterator[PostgresServer]:
    """``initdb`` into a temporary folder and ``postgres`` on a free 127.0.0.1 port (as
    ``PG_USER`` when root), stopped and deleted on exit. The fixture's, and ``make bench``'s
    (tests/bench/servers/postgres.py)."""
    root = Path(tempfile.mkdtemp(prefix="mesh-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(PG_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    data = root / "data"
    port = free_port()
    log = root / "postgres.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N"],
            **_as_user(),
            check=True,
            capture_output=True,
            timeout=120,
        )
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-k",
                    str(root),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    # A test server: losing the last commits in an OS crash is fine.
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ],
                **_as_user(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = PostgresServer(port=port, data=data)
        deadline = time.monotonic() + 60
        while not _connectable(server.url()):
            if proc.poll() is not None:
                raise AssertionError(f"postgres exited with {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"postgres did not accept connections:\n{log.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_database(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new empty database on the session's server, dropped after the test."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f"create database {name}")
    yield postgres_server.url(name)
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f"drop database if exists {name} with (force)")


def database_with(component: str, ddl: str) -> Callable[..., Any]:
    """A fixture (assign it to a name in the test module, which imports ``pg_database`` and
    ``postgres_server`` too): a ``mesh._pg.PgDatabase`` on ``pg_database`` with ``ddl`` in place
    as schema component ``component``, closed after the test."""

    @pytest.fixture
    async def db(pg_database: str) -> AsyncIterator[Any]:
        from mesh._pg import PgDatabase

        opened = await PgDatabase.open(pg_database)
        await opened.ensure_schema(component, ddl)
        try:
            yield opened
        finally:
            await opened.aclose()

    return db


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def either_database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh, empty database of each backend in turn: a ``mesh._sqlite.Database`` on a file
    in ``tmp_path``, then a ``mesh._pg.PgDatabase`` on ``pg_database`` (the PostgreSQL case
    marked ``postgres``); closed after the test. ``tests/conftest.py`` makes it every test's."""
    from mesh._sqlite import Database

    opened: Any
    if request.param == "sqlite":
        opened = await Database.open(tmp_path / "node.db")
    else:
        from mesh._pg import PgDatabase

        opened = await PgDatabase.open(request.getfixturevalue("pg_database"))
    try:
        yield opened
    finally:
        await opened.aclose()

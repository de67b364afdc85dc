"""The store contract, one suite over both backends: the node's SQL stores behave the same on
SQLite (the default) and on PostgreSQL (``--store postgresql://...``)."""

from __future__ import annotations

import pytest


@pytest.mark.postgres
def test_the_suite_runs_its_own_postgres(pg_database: str) -> None:
    import psycopg

    with psycopg.connect(pg_database) as conn:
        row = conn.execute("select current_setting('listen_addresses'), version()").fetchone()
    assert row is not None
    assert row[0] == "127.0.0.1"
    assert row[1].startswith("PostgreSQL")

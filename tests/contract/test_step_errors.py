"""How each driver classifies a failed statement of a ``db_step`` (#18), on real connections.

The store or the step's connection failing (disk full, a statement timeout, a connection the
server terminated) is an outage, :class:`StoreUnavailableError`, which the retry rules never
bury; the step's own SQL failing (a constraint, a syntax error) stays a :class:`StepSQLError`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from jobguard.backends.postgres.driver import StepConnection as PostgresStep
from jobguard.backends.sqlite.driver import StepConnection as SQLiteStep
from jobguard.exceptions import StepSQLError, StoreUnavailableError
from tests.support import pg


def test_sqlite_disk_full_is_an_outage_and_a_constraint_is_the_step_s(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "full.db", isolation_level=None)
    try:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, blob BLOB)")
        conn.execute("INSERT INTO t (id) VALUES (1)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 1}")
        step = SQLiteStep(conn)
        with pytest.raises(StoreUnavailableError, match="full"):
            step.execute("INSERT INTO t (blob) VALUES (zeroblob(1000000))")
        with pytest.raises(StepSQLError, match="UNIQUE"):
            step.execute("INSERT INTO t (id) VALUES (1)")
        with pytest.raises(StepSQLError, match="incomplete input"):
            step.execute("INSERT INTO")
    finally:
        conn.close()
    conn.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        SQLiteStep(conn).execute("SELECT 1")


def test_postgres_timeouts_and_lost_connections_are_outages_constraints_are_not() -> None:
    url = pg.session_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        step = PostgresStep(conn)
        with conn.transaction():
            with pytest.raises(StepSQLError, match="duplicate key"):
                step.execute("INSERT INTO t VALUES (1)")
            raise psycopg.Rollback()
        with conn.transaction():
            with pytest.raises(StepSQLError, match="syntax"):
                step.execute("INSERT INTO")
            raise psycopg.Rollback()
        with conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '20ms'")
            with pytest.raises(StoreUnavailableError, match="statement timeout"):
                step.execute("SELECT pg_sleep(5)")
            raise psycopg.Rollback()
        with (
            conn.transaction(),
            pytest.raises(StoreUnavailableError, match="PostgreSQL failed"),
        ):
            step.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        assert conn.closed

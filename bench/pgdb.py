"""A throw-away PostgreSQL database for one bench run, and the effect table every handler writes.

Each run creates its own database (random name) on the server named by ``JOBGUARD_BENCH_PG``
(default the local one) and drops it at the end; nothing else on the server is touched.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ADMIN_URL = os.environ.get("JOBGUARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

# The business row of the benchmark: the same statement for jobguard's db_step and the peers'
# handlers. ``enqueued_at``/``started_at``/``done_at`` are the producer's and the handler's
# time.time() (one host), giving every system's enqueue-to-start and drain span the same way.
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects (n integer NOT NULL, enqueued_at double precision "
    "NOT NULL, started_at double precision NOT NULL, done_at double precision NOT NULL)"
)
INSERT_EFFECT_PG = (
    "INSERT INTO bench_effects (n, enqueued_at, started_at, done_at) VALUES (%s, %s, %s, %s)"
)
INSERT_EFFECT_SQLITE = (
    "INSERT INTO bench_effects (n, enqueued_at, started_at, done_at) VALUES (?, ?, ?, ?)"
)


_local = threading.local()


def insert_effect(url: str, n: int, enqueued_at: float, started_at: float) -> None:
    """Insert the business row as a plain handler would: on its thread's own autocommit
    connection to ``url``, in a commit of its own (the peers' handlers)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(url, autocommit=True)
    conn.execute(INSERT_EFFECT_PG, (n, enqueued_at, started_at, time.time()))


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database of the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


@contextmanager
def scratch_database() -> Iterator[str]:
    """Create a database for this run, yield its URL, drop it afterwards."""
    name = f"jobguard_bench_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(ADMIN_URL, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        yield url
    finally:
        wait_for_server()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def server_started(timeout_s: float = 120.0) -> object:
    """When the server last started (changes if it restarts); waits while it is down."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                return conn.execute("SELECT pg_postmaster_start_time()").fetchall()[0][0]
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_for_server() -> None:
    """Wait until the server accepts connections (it may be restarting)."""
    server_started()


def server_settings(url: str) -> str:
    """The server's version and the settings that decide commit cost."""
    with psycopg.connect(url) as conn:
        shown = [
            str(conn.execute(f"SHOW {name}").fetchall()[0][0])
            for name in ("server_version", "synchronous_commit", "fsync", "autovacuum")
        ]
    return (
        f"PostgreSQL {shown[0]}, synchronous_commit={shown[1]}, fsync={shown[2]}, "
        f"autovacuum={shown[3]} (each run in a fresh database; see docs/operations.md)"
    )

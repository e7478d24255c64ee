"""PostgreSQL for tests: one throw-away database per test session, one fresh schema per store.

Every store gets its own schema in a database created for this session, so tests (and several
test sessions on one server) never see each other's rows. The server is the machine's real
PostgreSQL (``TEST_POSTGRES_URL``, default the local one); nothing here is a fake.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from jobguard.backends import migrate_store

ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database of the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def create_database() -> str:
    """Create a database for this session; return its URL."""
    name = f"jobguard_test_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(ADMIN_URL, name)


def drop_database(url: str) -> None:
    """Drop a database made by :func:`create_database` (its connections are cut first)."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def fresh_store_url(database_url: str) -> str:
    """A migrated, empty jobguard schema of its own in the session's database."""
    url = f"{database_url}?schema=s_{secrets.token_hex(6)}"
    migrate_store(url)
    return url


_session: list[str] = []


def session_database() -> str:
    """This test session's database, created on first use (dropped by ``tests/conftest.py``)."""
    if not _session:
        _session.append(create_database())
    return _session[0]


def drop_session_database() -> None:
    """Drop this session's database if one was made."""
    while _session:
        drop_database(_session.pop())


def terminate_connections_of(url: str, pid: int) -> int:
    """Have the server cut every connection of worker process ``pid``; return how many."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (f"jobguard:{pid}",),
        ).fetchone()
    del url  # every connection of that process, whichever store it serves
    return int(row[0]) if row else 0


def restart_postgres() -> None:
    """Restart the machine's PostgreSQL cluster (fast shutdown: every connection is cut)."""
    versions = sorted(os.listdir("/etc/postgresql"))
    subprocess.run(
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            versions[-1],
            "main",
            "restart",
            "-m",
            "fast",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            psycopg.connect(ADMIN_URL, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            time.sleep(0.2)
    raise TimeoutError("PostgreSQL did not come back within 60 s")

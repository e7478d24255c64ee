"""Fresh jobguard stores for the benches, and reading their tables back.

A PostgreSQL store is a new schema in the run's throw-away database; a SQLite store is a new
file in the run's temporary directory. Both hold the ``bench_effects`` table the full-guard
task writes, next to jobguard's own tables.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.pgdb import EFFECTS_DDL
from jobguard.backends import migrate_store


class BenchStore:
    """One fresh store: its URL for jobguard and a reader for the bench."""

    def __init__(self, kind: str, database_url: str | None, folder: Path, label: str) -> None:
        self.kind = kind
        if kind == "postgres":
            assert database_url is not None
            self.schema = f"bench_{label}_{secrets.token_hex(3)}"
            self.database_url = database_url
            self.url = f"{database_url}?schema={self.schema}"
            migrate_store(self.url)
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("TRUNCATE bench_effects")
        else:
            self.path = folder / f"{label}.db"
            self.url = f"sqlite:///{self.path}"
            migrate_store(self.url)
            with sqlite3.connect(self.path) as conn:
                conn.execute(EFFECTS_DDL)

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        """Rows of ``query``; jobguard's tables and ``bench_effects`` are visible unqualified."""
        if self.kind == "postgres":
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                path = sql.SQL("SET search_path TO {}, public").format(sql.Identifier(self.schema))
                conn.execute(path)
                return list(conn.execute(query).fetchall())
        with sqlite3.connect(self.path) as conn:
            return list(conn.execute(query).fetchall())

    def scalar(self, query: str) -> Any:
        """The first column of the first row of ``query``."""
        return self.rows(query)[0][0]

    def completed(self) -> int:
        """Jobs completed so far."""
        return int(self.scalar("SELECT count(*) FROM jobs WHERE status = 'completed'"))

    def attempt_span(self) -> float:
        """Seconds from the first delivery to the last finish, from the attempt log."""
        first, last = self.rows("SELECT min(started_at), max(ended_at) FROM attempts")[0]
        return float(last - first)

    def leased(self) -> dict[int, float]:
        """Job number (the payload's ``n``) -> its first delivery (store clock)."""
        found = self.rows(
            "SELECT j.payload, min(a.started_at) FROM jobs j "
            "JOIN attempts a ON a.job_id = j.id GROUP BY j.id, j.payload"
        )
        return {json.loads(payload)["n"]: float(started) for payload, started in found}

"""Helpers for testing code that uses jobguard: drain queues, control the store clock, a
temporary store (the pytest plugin's fixtures are in :mod:`jobguard.pytest_plugin`, the faults
in :mod:`jobguard.faults`).

These run the real pipeline against a real store (use a SQLite file in a temporary directory);
nothing here is a fake.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobguard.app import App
from jobguard.exceptions import ConfigurationError
from jobguard.models import JobStatus

if TYPE_CHECKING:
    from jobguard.backends.base import Backend


def drain(app: App, *, timeout_s: float = 30.0, concurrency: int = 1) -> dict[JobStatus, int]:
    """Run workers until no job is queued or running (retries included); return the counts.

    Waits for jobs scheduled in the future (backoff), so keep backoff short in tests. Raises
    ``TimeoutError`` if the queues do not settle within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        app.worker(concurrency=concurrency, install_signal_handlers=False, grace_s=1.0).run(
            burst=True
        )
        counts = app.counts()
        if counts[JobStatus.QUEUED] == 0 and counts[JobStatus.RUNNING] == 0:
            return counts
        if time.monotonic() > deadline:
            raise TimeoutError(f"queues did not settle in {timeout_s}s: {counts}")
        time.sleep(0.02)


class ControlledClock:
    """A store clock that moves only when told to; pass it to a backend as ``clock=``.

    Lets tests expire leases and locks without sleeping::

        clock = ControlledClock()
        backend = SQLiteBackend(path, clock=clock)
        clock.advance(31)   # every 30 s lease is now expired
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError("a store clock never goes backward")
        with self._lock:
            self._now += seconds


class TemporaryStore:
    """An empty store for one test, on a :class:`ControlledClock` (the ``jobguard_store``
    fixture of the pytest plugin). Close it to drop what it made.

    Attributes:
        url: The store's URL (a SQLite file, or a PostgreSQL database with its own schema).
        clock: The store clock of :attr:`backend`.
        backend: The store, opened on :attr:`clock`: ``App(backend=store.backend)``.
    """

    def __init__(self, url: str, clock: ControlledClock, backend: Backend) -> None:
        self.url = url
        self.clock = clock
        self.backend = backend

    @classmethod
    def create(cls, where: str, directory: Path) -> TemporaryStore:
        """``where`` is ``sqlite`` (a file in ``directory``) or a PostgreSQL database URL."""
        # Leases written now must expire on this clock as on the host's: start at real time.
        clock = ControlledClock(start=time.time())
        if where == "sqlite":
            from jobguard.backends.sqlite import SQLiteBackend

            path = directory / "jobguard-test.db"
            return cls(f"sqlite:///{path}", clock, SQLiteBackend(str(path), clock=clock))
        if not where.startswith(("postgresql://", "postgres://")) or "?" in where:
            raise ConfigurationError(
                f"jobguard_store must be 'sqlite' or a postgresql:// database URL without "
                f"options, not {where!r}"
            )
        from jobguard.backends import migrate_store
        from jobguard.backends.postgres import PostgresBackend

        url = f"{where}?schema=jobguard_test_{secrets.token_hex(6)}"
        migrate_store(url)
        return cls(url, clock, PostgresBackend(url, clock=clock))

    @property
    def schema(self) -> str | None:
        """The store's PostgreSQL schema (put business tables there), or ``None`` on SQLite."""
        return None if self.url.startswith("sqlite:") else self.url.partition("?schema=")[2]

    def connect(self) -> Any:
        """A new autocommit DB-API connection to the store's database (``sqlite3`` or psycopg;
        placeholders ``?`` or ``%s``); close it when done."""
        if self.url.startswith("sqlite:"):
            import sqlite3

            return sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        import psycopg

        return psycopg.connect(self.url.partition("?")[0], autocommit=True)

    def close(self) -> None:
        """Close the store; on PostgreSQL, drop its schema."""
        self.backend.close()
        if self.url.startswith("sqlite:"):
            return
        import psycopg
        from psycopg import sql

        base, _, query = self.url.partition("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(query)))

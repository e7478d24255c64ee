"""The app real scheduler and worker processes run in the schedule tests.

Configured by the environment the tests set (``--app tests.support.schedule_app:app``):

* ``SCHEDULE_TEST_URL``: the store (SQLite or PostgreSQL).
* ``SCHEDULE_TEST_CLOCK`` (optional): a file holding the store clock's time, read on every call,
  so a test moves time for every process at once instead of waiting for real ticks.
* ``SCHEDULE_TEST_EVENTS``: a sidecar SQLite file where the handler records each execution,
  outside jobguard's transactions, so tests count what really ran.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from datetime import datetime
from pathlib import Path

from jobguard import App, Context
from jobguard.backends import sqlite_path
from jobguard.backends.sqlite import SQLiteBackend

GAP_POLICIES = {"gap-skip": "skip", "gap-last": "last", "gap-3": 3, "gap-20": 20}
GAP_GRACE_S = 0.2


class FileClock:
    """A store clock shared by processes: the time written in a file (see :func:`set_clock`)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def __call__(self) -> float:
        return float(self.path.read_text())


def set_clock(path: Path, now: float) -> None:
    """Move every process's store clock to ``now`` (atomically: no reader sees half a number)."""
    scratch = path.with_suffix(".next")
    scratch.write_text(repr(now))
    os.replace(scratch, path)


def executions(events: Path) -> list[tuple[str, int]]:
    """``(tick ISO text, pid)`` of every execution recorded, in order."""
    if not events.exists():
        return []
    with closing(sqlite3.connect(events, timeout=30)) as conn:
        return list(conn.execute("SELECT tick, pid FROM runs ORDER BY id"))


def _make_app() -> App:
    # Imported by the tests too, for the helpers above: the App opens no store until used.
    url = os.environ.get("SCHEDULE_TEST_URL", "sqlite:///unused.db")
    clock = os.environ.get("SCHEDULE_TEST_CLOCK")
    if not clock:
        return App(url)
    if url.startswith("sqlite:"):
        return App(backend=SQLiteBackend(sqlite_path(url), clock=FileClock(clock)))
    from jobguard.backends.postgres import PostgresBackend

    return App(backend=PostgresBackend(url, clock=FileClock(clock)))


app = _make_app()


@app.periodic(every=1, missed=10_000, name="beat")
def beat(ctx: Context, tick: datetime) -> None:
    """Record this execution of the tick durably before returning."""
    with closing(sqlite3.connect(os.environ["SCHEDULE_TEST_EVENTS"], timeout=30)) as conn, conn:
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS runs "
            "(id INTEGER PRIMARY KEY, tick TEXT, pid INTEGER, t REAL)"
        )
        conn.execute(
            "INSERT INTO runs (tick, pid, t) VALUES (?, ?, ?)",
            (tick.strftime("%Y-%m-%dT%H:%M:%SZ"), os.getpid(), time.time()),
        )


def _noop(ctx: Context, tick: datetime) -> None:
    """The gap schedules only count jobs."""


for _name, _missed in GAP_POLICIES.items():
    app.periodic(every=1, missed=_missed, grace_s=GAP_GRACE_S, name=_name)(_noop)

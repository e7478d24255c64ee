"""The app real worker processes run in the queue fault tests (``tests.support.queue_app``).

Every task records what it saw in an event log of its own: a SQLite file in the store's home
directory (:func:`tests.support.stores.home_of`), written outside jobguard's transactions, so
the tests can compare what the handlers actually did (which process, which attempt, when,
whether the lease was lost) with what the attempt log claims.

Run as a module it is also the producer of the concurrent dedup test::

    python -m tests.support.queue_app enqueue-dedup --url URL --key K --count 100 --go FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobguard import App, Context, Retry
from tests.support import stores

SLEEP = "sleep"
KILL_SELF = "kill_self"
NOOP = "noop"
BACKOFF = "backoff"
LONG_BACKOFF_S = 3600.0
SLOTTED = "slotted"
SLOT_LIMIT = 3
SLOT_TTL_S = 3.0
KILL_SELF_MAX_ATTEMPTS = 3
AWAIT_LOST_S = 15.0

_EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id    INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    worker_id TEXT    NOT NULL,
    pid       INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    t         REAL    NOT NULL,
    lease_lost INTEGER NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class Event:
    """One thing a handler recorded: ``start`` on entry, ``end`` just before returning."""

    job_id: int
    attempt: int
    worker_id: str
    pid: int
    kind: str
    t: float
    lease_lost: bool


def events_path(url: str) -> Path:
    """The event log of the store at ``url``."""
    return stores.home_of(url) / "events.sqlite"


def _connect(url: str) -> sqlite3.Connection:
    events_path(url).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(events_path(url), timeout=30.0, isolation_level=None)
    # Two handlers opening a new log at once: SQLite answers the journal-mode switch with
    # "database is locked" at once, without waiting, so it is retried here.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_EVENTS_SCHEMA)
            return conn
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                conn.close()
                raise
            time.sleep(0.005)


def record(url: str, ctx: Context, kind: str) -> None:
    """Durably append one event for this delivery (committed before returning)."""
    conn = _connect(url)
    try:
        conn.execute(
            "INSERT INTO events (job_id, attempt, worker_id, pid, kind, t, lease_lost) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                ctx.job_id,
                ctx.attempt,
                ctx.worker_id,
                os.getpid(),
                kind,
                time.time(),
                int(ctx.lease_lost),
            ),
        )
    finally:
        conn.close()


def read_events(url: str, job_id: int | None = None) -> list[Event]:
    """Events in the order they were recorded, of one job or of all."""
    if not events_path(url).exists():
        return []
    conn = _connect(url)
    try:
        found = conn.execute(
            "SELECT job_id, attempt, worker_id, pid, kind, t, lease_lost FROM events "
            "WHERE ? IS NULL OR job_id = ? ORDER BY id",
            (job_id, job_id),
        ).fetchall()
    finally:
        conn.close()
    return [Event(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6])) for r in found]


def make_app(url: str, *, visibility_timeout_s: float = 1.0) -> App:
    """The tasks of the fault tests on the store at ``url``.

    The visibility timeout is stored on each job at enqueue, so the producer's value is the one
    the worker heartbeats against; workers need not be started with the same value.
    """
    app = App(url)

    @app.task(name=SLEEP, visibility_timeout_s=visibility_timeout_s, max_attempts=5)
    def sleep(ctx: Context, sleep_s: list[float], await_lost_attempt: int = 0) -> None:
        """Sleep ``sleep_s[attempt - 1]`` (the last value repeats), recording start and end.

        On attempt ``await_lost_attempt`` it then waits for ``ctx.lease_lost`` before ending, so
        a paused-and-resumed worker records that it learnt of the loss.
        """
        record(url, ctx, "start")
        time.sleep(sleep_s[min(ctx.attempt, len(sleep_s)) - 1])
        if ctx.attempt == await_lost_attempt:
            deadline = time.monotonic() + AWAIT_LOST_S
            while not ctx.lease_lost and time.monotonic() < deadline:
                time.sleep(0.02)
        record(url, ctx, "end")

    @app.task(
        name=KILL_SELF,
        visibility_timeout_s=visibility_timeout_s,
        max_attempts=KILL_SELF_MAX_ATTEMPTS,
    )
    def kill_self(ctx: Context) -> None:
        """Record the start, then SIGKILL the worker process running it (never reports back)."""
        record(url, ctx, "start")
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(
        name=SLOTTED,
        visibility_timeout_s=SLOT_TTL_S,
        lock_ttl_s=SLOT_TTL_S,
        max_attempts=10,
        concurrency_key="account:{account}",
        concurrency_limit=SLOT_LIMIT,
    )
    def slotted(ctx: Context, account: int, sleep_s: float) -> None:
        """At most ``SLOT_LIMIT`` run at once per account: record start, sleep, record end."""
        record(url, ctx, "start")
        time.sleep(sleep_s)
        record(url, ctx, "end")

    @app.task(name=NOOP, visibility_timeout_s=visibility_timeout_s)
    def noop(ctx: Context, n: int = 0) -> None:
        """Record one ``end`` event and return."""
        record(url, ctx, "end")

    @app.task(name=BACKOFF, visibility_timeout_s=visibility_timeout_s, max_attempts=3)
    def backoff(ctx: Context) -> None:
        """Record ``start``; the first attempt asks to be retried in an hour, the next ends."""
        record(url, ctx, "start")
        if ctx.attempt == 1:
            raise Retry("first attempt: come back in an hour", delay_s=LONG_BACKOFF_S)
        record(url, ctx, "end")

    return app


def _enqueue_dedup(url: str, key: str, count: int, go: Path) -> None:
    app = make_app(url)
    _ = app.backend  # open the store before the start line, so every producer starts together
    print("READY", flush=True)
    while not go.exists():
        time.sleep(0.002)
    task = app.tasks[NOOP]
    results = []
    for _ in range(count):
        job = task.options(dedup_key=key).enqueue()
        results.append([job.id, job.deduplicated])
    app.close()
    print(json.dumps(results), flush=True)


def main() -> None:
    """Command line of the producer helper (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["enqueue-dedup"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--go", required=True, help="start enqueueing once this file exists")
    args = parser.parse_args()
    _enqueue_dedup(args.url, args.key, args.count, Path(args.go))
    sys.exit(0)


if __name__ == "__main__":
    main()

"""The peer: huey's SQLite storage with fsync (synchronous=FULL) and WAL, like jobguard's."""

from __future__ import annotations

import os

from huey import SqliteHuey

huey = SqliteHuey(
    "bench",
    filename=os.environ.get("JOBGUARD_BENCH_DB", "huey-bench.db"),
    fsync=True,
    journal_mode="wal",
    results=False,
)


@huey.task()
def noop(n: int) -> None:
    """Do nothing: measures the queue alone."""

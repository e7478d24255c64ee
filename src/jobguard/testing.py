"""Helpers for testing code that uses jobguard: drain queues, control the store clock.

These run the real pipeline against a real store (use a SQLite file in a temporary directory);
nothing here is a fake.
"""

from __future__ import annotations

import threading
import time

from jobguard.app import App
from jobguard.models import JobStatus


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

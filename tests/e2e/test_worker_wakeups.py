"""A fetch that came back short of its room took all that was ready: the worker then waits for
an enqueue's wake-up instead of fetching again at once, and that wake-up still reaches it (both
stores). The poll interval is a minute, so only the wake-up can bring the next job in time."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from jobguard import App, Context
from jobguard.backends import sqlite_path
from jobguard.backends.postgres.driver import channel_of
from jobguard.backends.sqlite.wake import wake_dir
from tests.support import pg


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.02)


def listening(app: App, store_url: str) -> bool:
    """Whether this process has begun to listen for enqueues, so one sent now wakes it."""
    if store_url.startswith("sqlite:"):
        folder = wake_dir(sqlite_path(store_url))
        return folder.is_dir() and any(
            name.startswith(f"{os.getpid()}-") for name in os.listdir(folder)
        )
    channel = channel_of(app.backend.driver.schema)  # type: ignore[attr-defined]
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query = %s",
            (f'LISTEN "{channel}"',),
        ).fetchone()
    return bool(found and found[0])


def test_after_a_short_batch_the_worker_waits_for_a_wake_up_not_another_fetch(
    store_url: str,
) -> None:
    app = App(store_url)
    done: list[int] = []

    @app.task(name="one")
    def one(ctx: Context, n: int) -> None:
        done.append(n)

    fetched: list[int] = []
    waits: list[float] = []
    fetch, wait = app.backend.fetch_prepared, app.backend.wait_for_jobs

    def counted_fetch(*args: Any, **kwargs: Any) -> Any:
        found = fetch(*args, **kwargs)
        fetched.append(len(found))
        return found

    def counted_wait(*args: Any, **kwargs: Any) -> Any:
        waits.append(time.monotonic())
        return wait(*args, **kwargs)

    app.backend.fetch_prepared = counted_fetch  # type: ignore[method-assign]
    app.backend.wait_for_jobs = counted_wait  # type: ignore[method-assign]
    one.enqueue(n=1)
    one.enqueue(n=2)
    worker = app.worker(install_signal_handlers=False, concurrency=4, poll_interval_s=60.0)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    try:
        eventually(lambda: sorted(done) == [1, 2], "the two queued jobs ran")
        eventually(lambda: len(waits) == 1, "the fetch loop went to wait")
        # Two jobs of the eight it had room for: the fetch took all that was ready.
        assert fetched == [2]
        eventually(lambda: listening(app, store_url), "the worker listens for enqueues")
        one.enqueue(n=3)
        eventually(lambda: done[-1:] == [3], "the job enqueued during the wait ran")
        eventually(lambda: len(waits) == 2, "the fetch loop went back to wait")
        assert fetched == [2, 1]
    finally:
        worker.stop()
        running.join(70.0)
        app.close()

"""The app of the observability tests: retries, lock contention, and a task that waits to be killed.

``make_app(url)`` serves ``tests.support.run_worker``; ``app`` (on ``OBSERVED_APP_URL``) serves
the real ``jobguard`` command as ``--app tests.support.observed_app:app``.
"""

from __future__ import annotations

import os
import threading
import time

from jobguard import App, Context, Fatal

VICTIM_PREFIX = "victim"


def make_app(url: str) -> App:
    """The app with its tasks: ``flaky``, ``hold``, ``reject``, ``note`` and ``stall``."""
    app = App(url)

    @app.task(
        name="flaky",
        operation_key="flaky:{n}",
        resource_key="item:{n}",
        max_attempts=3,
        backoff_base_s=0.01,
        backoff_cap_s=0.05,
    )
    def flaky(ctx: Context, n: int) -> int:
        """Two steps; fails its first attempt when ``n % 3 == 0``; fatal when ``n % 7 == 6``."""
        first = ctx.step("reserve", lambda: n * 10)
        if n % 7 == 6:
            raise Fatal(f"item {n} cannot be processed")
        if n % 3 == 0 and ctx.attempt == 1:
            raise RuntimeError(f"item {n}: upstream timed out")
        return int(ctx.step("confirm", lambda: first + 1))

    @app.task(
        name="hold",
        resource_key="shared",
        max_attempts=1,
        visibility_timeout_s=2.0,
        lock_ttl_s=1.5,
    )
    def hold(ctx: Context, n: int) -> None:
        """Holds the one shared resource a moment, so concurrent deliveries are deferred."""
        time.sleep(0.02 + 0.03 * (n % 8))

    @app.task(name="reject", queue="rejects")
    def reject(ctx: Context, text: str) -> None:
        """Refuses its text for good: the job is buried with the text as its error."""
        raise Fatal(text)

    @app.task(name="note", queue="notes")
    def note(ctx: Context, text: str) -> None:
        """Arguments an operator will read on the dashboard (no worker runs this queue)."""

    @app.task(name="stall", queue="crashing", visibility_timeout_s=1.0, max_attempts=3)
    def stall(ctx: Context, n: int) -> None:
        """Hangs in a worker whose id starts with ``victim`` (until it is killed)."""
        if ctx.worker_id.startswith(VICTIM_PREFIX):
            threading.Event().wait()

    return app


app = make_app(os.environ.get("OBSERVED_APP_URL", "sqlite:///observed.db"))

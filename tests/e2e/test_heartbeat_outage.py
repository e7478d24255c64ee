"""A heartbeat that cannot reach the store treats the lease as possibly lost.

The store is real (a SQLite file); the outage is an injected fault: while ``down`` is set its
``renew`` fails as an unreachable database would. Once a lease has gone unrenewed for its whole
length, the worker tells the handler (``ctx.lease_lost``) instead of letting it believe it still
holds the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from jobguard import App, Context, Hooks
from jobguard.backends.base import Renewal, RenewalResult
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.exceptions import StoreUnavailableError
from jobguard.models import Delivery
from tests.support.procs import wait_until


class OutageStore(SQLiteBackend):
    """A real SQLite store whose lease renewals fail while ``down`` is set."""

    down = False

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        if self.down:
            raise StoreUnavailableError("injected outage: the database does not answer")
        return super().renew(renewals)


class Recorder(Hooks):
    def __init__(self) -> None:
        self.lost: list[str] = []

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        self.lost.append(reason)


def test_a_lease_unrenewed_for_its_length_is_reported_lost_to_the_handler(tmp_path: Path) -> None:
    store = OutageStore(str(tmp_path / "jobs.db"))
    hooks = Recorder()
    app = App(backend=store, hooks=hooks)
    seen: dict[str, object] = {}
    started = threading.Event()

    @app.task(visibility_timeout_s=0.6)
    def wait_for_the_outage(ctx: Context) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not ctx.lease_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["lost"] = ctx.lease_lost

    wait_for_the_outage.enqueue()
    worker = app.worker(concurrency=1, install_signal_handlers=False, grace_s=1.0)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        assert started.wait(20)
        store.down = True
        wait_until(lambda: "lost" in seen, timeout_s=15)
    finally:
        store.down = False
        worker.stop()
        runner.join(timeout=20)
        app.close()
    assert seen["lost"] is True
    assert any("store unreachable" in reason for reason in hooks.lost)

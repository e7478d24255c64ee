"""The app real worker processes run in the network tests (``--app tests.support.network_app``).

``call_once(work_s)`` works for ``work_s`` seconds, checking ``ctx.lease_lost`` as it goes,
and then makes one "external call" (an email, a payment), unless it learnt that its lease may
be another worker's: then it stops without calling, and records when its last check still
found the lease held. ``run_once()`` records that it ran, then waits for a ``go`` file in the
store's home directory before it returns (with a lease long enough that no renewal falls in
between). ``brief(n, work_s)`` records whether it holds its lease as it starts, sleeps
``work_s`` and records whether it still does. The worker's hooks record every renewal that
succeeded. Events go to ``events-<pid>.jsonl`` in the store's home directory, with the worker
id, the wall time and the host's monotonic clock (``m``: one clock for every process of a
Linux host, so the tests compare processes on it); :func:`read_events` reads them back.
"""

from __future__ import annotations

import os
import time

from jobguard import App, Context, Hooks
from tests.support import jsonl_events, stores

CALL_ONCE = "call_once"
RUN_ONCE = "run_once"
BRIEF = "brief"
LEASE_S = 3.0
RUN_ONCE_LEASE_S = 30.0


def record(url: str, ctx: Context, what: str, **fields: float) -> None:
    """Append one event of this delivery."""
    jsonl_events.append(
        url,
        job=ctx.job_id,
        attempt=ctx.attempt,
        worker=ctx.worker_id,
        what=what,
        pid=os.getpid(),
        m=time.monotonic(),
        **fields,
    )


class RenewalLog(Hooks):
    """Records, with the monotonic time it returned, each renewal that extended a lease."""

    def __init__(self, url: str) -> None:
        self.url = url

    def leases_renewed(self, count: int) -> None:
        """One event per beat that renewed something."""
        if count:
            jsonl_events.append(self.url, what="renewed", pid=os.getpid(), m=time.monotonic())


read_events = jsonl_events.read_all


def make_app(url: str) -> App:
    """The network tasks on the store at ``url`` (a worker may reach it through a proxy)."""
    app = App(url, hooks=RenewalLog(url))

    @app.task(name=CALL_ONCE, visibility_timeout_s=LEASE_S, max_attempts=5)
    def call_once(ctx: Context, work_s: float) -> None:
        record(url, ctx, "start")
        deadline = time.monotonic() + work_s
        held_at = time.monotonic()  # after the last check that found the lease held
        while time.monotonic() < deadline and not ctx.lease_lost:
            held_at = time.monotonic()
            time.sleep(0.01)
        if ctx.lease_lost:  # checked right before the call, as the docs advise
            record(url, ctx, "noticed-lost", held_m=held_at)
            return
        record(url, ctx, "external-call")

    @app.task(name=RUN_ONCE, visibility_timeout_s=RUN_ONCE_LEASE_S, max_attempts=5)
    def run_once(ctx: Context) -> None:
        record(url, ctx, "ran")
        go = stores.home_of(url) / "go"
        deadline = time.monotonic() + RUN_ONCE_LEASE_S
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.005)

    @app.task(name=BRIEF, visibility_timeout_s=LEASE_S, max_attempts=5)
    def brief(ctx: Context, n: int, work_s: float) -> None:
        record(url, ctx, "lost-at-start" if ctx.lease_lost else "started")
        time.sleep(work_s)
        record(url, ctx, "lost" if ctx.lease_lost else "ran")

    return app

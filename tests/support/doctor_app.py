"""The app real worker processes run in the doctor's tests (``tests.support.doctor_app``).

Each task reproduces one situation the doctor must name, driven by marker files beside the
store (:func:`tests.support.stores.home_of`) rather than by sleeps where an order of events
matters:

* ``rates`` fails with ``ConnectionError`` while ``down`` exists (a dependency outage);
  ``parse`` always fails the same way for ``bad=True`` (one poison job);
* ``crash`` SIGKILLs the worker running it; ``work`` sleeps a little, so it is running when its
  worker dies (collateral);
* ``notify`` (operation key) and ``ping`` (none) are enqueued with unstable dedup keys;
* ``report`` holds the ``ledger`` lock for ``hold_s``; ``touch`` needs it for a moment;
* ``restock`` holds the ``stock`` lock past its 1 s TTL (run it on a worker without heartbeat)
  until ``sell`` has written under a newer fence, then writes with its stale one;
* ``load`` holds the one slot of its ``dock`` concurrency key past its 1 s TTL the same way
  (``waits=True``, until a ``load`` that took the slot meanwhile has written), then writes;
* ``ship`` runs three steps and records a reference, unless ``skip`` makes it return early;
* ``export`` runs longer than its 1 s lease and lock TTL on its own queue, on the heartbeat;
* ``guarded`` (operation, resource and dedup keys, two steps, a transient failure on the first
  run of ``flaky`` jobs) and ``fast`` make the healthy run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from jobguard import App, Context
from tests.support import stores

RATES = "rates"
PARSE = "parse"
CRASH = "crash"
WORK = "work"
NOTIFY = "notify"
PING = "ping"
REPORT = "report"
TOUCH = "touch"
RESTOCK = "restock"
SELL = "sell"
LOAD = "load"
SHIP = "ship"
EXPORT = "export"
GUARDED = "guarded"
FAST = "fast"
EXPORT_QUEUE = "exports"
CRASH_MAX_ATTEMPTS = 3
WAIT_S = 15.0
# How long the first restock runs at least, past its 1 s lock TTL.
OUTLAST_TTL_S = 1.3


class InjectedError(Exception):
    """A transient failure the healthy run injects on purpose."""


def markers_of(url: str) -> Path:
    """Where the marker files of the store at ``url`` live (beside it, whatever the backend)."""
    return stores.home_of(url)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _nothing(conn: Any) -> int:
    return 1


def make_app(url: str) -> App:
    """The doctor's tasks on the store at ``url`` (SQLite or PostgreSQL)."""
    where = markers_of(url)
    app = App(url)
    _failing_tasks(app, where)
    _key_tasks(app)
    _lock_tasks(app, where)
    _healthy_tasks(app, where)
    return app


def _failing_tasks(app: App, markers: Path) -> None:
    @app.task(
        name=RATES,
        operation_key="rates:{n}",
        transient=(ConnectionError,),
        max_attempts=4,
        backoff_base_s=0.05,
        backoff_cap_s=0.2,
    )
    def rates(ctx: Context, n: int) -> None:
        if (markers / "down").exists():
            raise ConnectionError("the rates service did not answer")

    @app.task(name=PARSE, backoff_base_s=0.01, backoff_cap_s=0.05)
    def parse(ctx: Context, n: int, bad: bool = False) -> None:
        if bad:
            raise KeyError(f"feed {n} has no 'items'")

    @app.task(
        name=CRASH,
        operation_key="crash:{n}",
        visibility_timeout_s=1.0,
        max_attempts=CRASH_MAX_ATTEMPTS,
        priority=10,
    )
    def crash(ctx: Context, n: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(name=WORK, operation_key="work:{n}", visibility_timeout_s=1.0)
    def work(ctx: Context, n: int) -> None:
        time.sleep(0.4)


def _key_tasks(app: App) -> None:
    @app.task(name=NOTIFY, operation_key="notify:{user}")
    def notify(ctx: Context, user: int) -> None:
        ctx.step("send", lambda: user)

    @app.task(name=PING)
    def ping(ctx: Context, user: int) -> None:
        pass


def _lock_tasks(app: App, markers: Path) -> None:
    @app.task(name=REPORT, operation_key="report:{n}", resource_key="ledger:{account}")
    def report(ctx: Context, n: int, account: str, hold_s: float) -> None:
        time.sleep(hold_s)

    @app.task(name=TOUCH, operation_key="touch:{n}", resource_key="ledger:{account}")
    def touch(ctx: Context, n: int, account: str) -> None:
        pass

    @app.task(
        name=RESTOCK,
        operation_key="restock:{n}",
        resource_key="stock:{sku}",
        lock_ttl_s=1.0,
        backoff_base_s=0.01,
    )
    def restock(ctx: Context, n: int, sku: str) -> None:
        started = time.monotonic()
        if ctx.attempt == 1:
            _wait_for(markers / "sold")
            # The lock was granted at fetch, a little before this run started: run clearly
            # past its TTL, so this run's own duration shows the TTL was too short.
            time.sleep(max(0.0, OUTLAST_TTL_S - (time.monotonic() - started)))
        ctx.db_step("write", _nothing)

    @app.task(
        name=SELL,
        operation_key="sell:{n}",
        resource_key="stock:{sku}",
        lock_ttl_s=1.0,
    )
    def sell(ctx: Context, n: int, sku: str) -> None:
        ctx.db_step("write", _nothing)
        (markers / "sold").touch()

    @app.task(
        name=LOAD,
        operation_key="load:{n}",
        concurrency_key="dock:{site}",
        concurrency_limit=1,
        lock_ttl_s=1.0,
        backoff_base_s=0.01,
    )
    def load(ctx: Context, n: int, site: str, waits: bool) -> None:
        if waits:
            _wait_for(markers / "loaded")
        ctx.db_step("write", _nothing)
        if not waits:
            (markers / "loaded").touch()


def _healthy_tasks(app: App, markers: Path) -> None:
    @app.task(name=SHIP, operation_key="ship:{order}")
    def ship(ctx: Context, order: int, skip: bool = False) -> None:
        ctx.step("pick", lambda: order)
        if skip:
            return
        ctx.step("pack", lambda: order)
        label = ctx.step("label", lambda: f"label-{order}")
        ctx.set_external_ref(label)

    @app.task(
        name=EXPORT,
        queue=EXPORT_QUEUE,
        operation_key="export:{n}",
        resource_key="export:{n}",
        visibility_timeout_s=1.0,
        lock_ttl_s=1.0,
    )
    def export(ctx: Context, n: int, run_s: float) -> None:
        time.sleep(run_s)

    @app.task(
        name=GUARDED,
        operation_key="guarded:{n}",
        resource_key="account:{account}",
        # Short, so killed workers' jobs come back soon; long enough that a loaded machine
        # does not miss 2 renewals in a row.
        visibility_timeout_s=2.0,
        lock_ttl_s=2.0,
        backoff_base_s=0.05,
        backoff_cap_s=0.1,
    )
    def guarded(ctx: Context, n: int, account: int, flaky: bool = False) -> None:
        first_run = markers / f"flaky-{n}"
        if flaky and not first_run.exists():
            # The first run of the handler, not the first delivery: that one may have died
            # with its worker before it got here.
            first_run.touch()
            raise InjectedError(f"job {n}: the first run fails on purpose")
        ctx.step("debit", lambda: n)
        time.sleep(0.15)
        ctx.step("receipt", lambda: n)
        ctx.set_external_ref(f"receipt-{n}")

    @app.task(name=FAST)
    def fast(ctx: Context, n: int) -> None:
        pass

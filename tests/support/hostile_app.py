"""The app real worker processes run in the hostile-use tests (``tests.support.hostile_app``).

Its tasks do what a new or a hostile user does on day one: fail through an outage, reuse a step
name in a loop, return a tuple from a step, raise errors whose text no store accepts, plant an
external reference with a lone surrogate, and install a hook that raises. Each side effect is
counted in a sidecar SQLite file named by the ``HOSTILE_EFFECTS`` environment variable (outside
jobguard's transactions, one commit per effect), so a test can tell how often an effect ran.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from jobguard import App, Context, Hooks
from jobguard.backends.base import Renewal, RenewalResult
from jobguard.models import Delivery

EFFECTS_ENV = "HOSTILE_EFFECTS"
URL_ENV = "HOSTILE_URL"
OUTAGE = "outage"
OUTAGE_DECLARED = "outage_declared"
STEP_WITHOUT_KEY = "step_without_key"
STEP_LOOP = "step_loop"
TUPLE_STEP = "tuple_step"
BAD_TEXT = "bad_text"
BAD_REF = "bad_ref"
NOOP = "noop"
HOLD_UNTIL_LOST = "hold_until_lost"
ASYNC_CHARGE = "async_charge"
UNSTORABLE_MESSAGE = "upstream said \ud800\x00 and hung up"
UNSTORABLE_REF = "ref-\udc80-1"
HOLD_LIMIT_S = 20.0


def count_effect(ctx: Context, name: str) -> str:
    """Record that effect ``name`` of this job ran once more; return the name."""
    conn = sqlite3.connect(os.environ[EFFECTS_ENV], timeout=10, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id INTEGER, name TEXT)")
        conn.execute("INSERT INTO effects VALUES (?, ?)", (ctx.job_id, name))
    finally:
        conn.close()
    return name


def effects(path: str | Path, job_id: int) -> list[str]:
    """The effects of one job, in the order they ran."""
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(path, timeout=30.0)
    try:
        # The file can exist a moment before the handler that made it has created the table.
        conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id INTEGER, name TEXT)")
        rows = conn.execute("SELECT name FROM effects WHERE job_id = ? ORDER BY rowid", (job_id,))
        return [row[0] for row in rows]
    finally:
        conn.close()


class MetricsHooks(Hooks):
    """A metrics exporter that breaks when it is told about a lost lease (contained: the
    worker logs it and goes on)."""

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """Raise, as a metrics client whose collector went away would."""
        raise RuntimeError("metrics collector unreachable")


LEASE_BUG = "the bookkeeping of a lost lease broke"


def _break_on_a_lost_lease(app: App) -> None:
    """Fault injection: the heartbeat meets an error it does not expect (not a store error)
    once its store reports a lease taken over."""
    backend = app.backend
    renew = backend.renew

    def renew_or_break(renewals: Sequence[Renewal]) -> list[RenewalResult]:
        results = renew(renewals)
        if not all(result.lease_ok for result in results):
            raise RuntimeError(LEASE_BUG)
        return results

    backend.renew = renew_or_break  # type: ignore[method-assign]


def make_app(url: str) -> App:
    """The hostile tasks on the store at ``url``."""
    app = App(url, hooks=MetricsHooks())
    _break_on_a_lost_lease(app)
    _register_retry_tasks(app)
    _register_step_tasks(app)
    _register_data_tasks(app)
    _register_worker_tasks(app)
    return app


def _register_retry_tasks(app: App) -> None:
    def outage(ctx: Context, failures: int) -> None:
        count_effect(ctx, f"attempt-{ctx.attempt}")
        if ctx.attempt <= failures:
            raise ConnectionError("connection refused by the payment service")

    app.task(name=OUTAGE, max_attempts=5, backoff_base_s=0.0)(outage)
    app.task(
        name=OUTAGE_DECLARED, max_attempts=5, backoff_base_s=0.0, transient=(ConnectionError,)
    )(outage)

    @app.task(name=STEP_WITHOUT_KEY, max_attempts=5, backoff_base_s=0.0)
    def step_without_key(ctx: Context) -> None:
        ctx.step("charge", count_effect, ctx, "charge")


def _register_step_tasks(app: App) -> None:
    @app.task(name=STEP_LOOP, operation_key="notify:{batch}", max_attempts=5, backoff_base_s=0.0)
    def step_loop(ctx: Context, batch: int, recipients: list[str]) -> list[str]:
        return [ctx.step("send", count_effect, ctx, f"send-{who}") for who in recipients]

    @app.task(name=TUPLE_STEP, operation_key="quote:{n}", max_attempts=5, backoff_base_s=0.0)
    def tuple_step(ctx: Context, n: int) -> None:
        def quote() -> tuple[str, int]:
            count_effect(ctx, "quote")
            return ("EUR", n)

        ctx.step("quote", quote)

    @app.task(name=ASYNC_CHARGE, operation_key="charge:{order_id}", visibility_timeout_s=1.0)
    async def async_charge(ctx: Context, order_id: int) -> dict[str, str]:
        async def charge() -> dict[str, str]:
            await asyncio.sleep(0)
            count_effect(ctx, "charge")
            return {"charge": f"ch_{order_id}"}

        charged: dict[str, str] = await ctx.step_async("charge", charge)
        if ctx.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies after the step was recorded
        await app.tasks[NOOP].enqueue_async(n=order_id)
        return charged


def _register_data_tasks(app: App) -> None:
    @app.task(name=BAD_TEXT, max_attempts=2, backoff_base_s=0.0)
    def bad_text(ctx: Context) -> None:
        count_effect(ctx, f"attempt-{ctx.attempt}")
        raise ValueError(UNSTORABLE_MESSAGE)

    @app.task(name=BAD_REF, operation_key="ref:{n}")
    def bad_ref(ctx: Context, n: int) -> None:
        count_effect(ctx, "ref")
        ctx.set_external_ref(UNSTORABLE_REF)

    @app.task(name=NOOP)
    def noop(ctx: Context, n: int = 0, data: object = None) -> None:
        count_effect(ctx, "noop")


def _register_worker_tasks(app: App) -> None:
    @app.task(name=HOLD_UNTIL_LOST, visibility_timeout_s=1.0, max_attempts=3)
    def hold_until_lost(ctx: Context) -> None:
        count_effect(ctx, "start")
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not ctx.lease_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        count_effect(ctx, "lost" if ctx.lease_lost else "timeout")


def __getattr__(name: str) -> App:
    """``app``, for ``jobguard --app tests.support.hostile_app:app``: the store comes from
    HOSTILE_URL. Made when asked for, since it opens its store at once (the fault above wraps
    the backend's renewal): importing this module touches no file."""
    if name == "app":
        return make_app(os.environ[URL_ENV])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

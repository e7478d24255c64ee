"""Apps the benchmark workers run.

The store is ``JOBGUARD_BENCH_URL`` if set (``sqlite:///…`` or ``postgresql://…``), else the
SQLite file ``JOBGUARD_BENCH_DB``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.pgdb import INSERT_EFFECT_PG, INSERT_EFFECT_SQLITE
from jobguard import App, Context

URL = os.environ.get("JOBGUARD_BENCH_URL") or (
    f"sqlite:///{os.environ.get('JOBGUARD_BENCH_DB', 'bench.db')}"
)
INSERT_EFFECT = INSERT_EFFECT_SQLITE if URL.startswith("sqlite") else INSERT_EFFECT_PG

app = App(URL)


@app.task(name="noop", queue="plain")
def noop(ctx: Context, n: int) -> None:
    """Do nothing: measures the queue engine alone."""


def _identity(n: int) -> int:
    return n


@app.task(
    name="guarded",
    queue="guarded",
    operation_key="bench-op:{n}",
    resource_key="bench-res:{n}",
)
def guarded(ctx: Context, n: int) -> None:
    """Lease + lock + operation record + one memoised step + atomic finish."""
    ctx.step("one", _identity, n)


def _insert_effect(conn: Any, n: int, enqueued_at: float, started_at: float) -> None:
    conn.execute(INSERT_EFFECT, (n, enqueued_at, started_at, time.time()))


@app.task(
    name="full",
    queue="full",
    operation_key="bench-full:{n}",
    resource_key="bench-res:{n}",
)
def full(ctx: Context, n: int, t: float) -> None:
    """The full guard: lease + lock + operation record + one ``db_step`` inserting a business
    row into the store's own database (committed with the step record) + atomic finish."""
    ctx.db_step("effect", _insert_effect, n, t, time.time())


@app.task(
    name="full_writes",
    queue="writes",
    operation_key="bench-writes:{n}",
    resource_key="bench-res:{n}",
)
def full_writes(ctx: Context, n: int, t: float) -> None:
    """The full guard with the business row written by ``ctx.db_writes``: the same rows and
    proofs as ``full``, the step's transaction sent at once (one round trip on PostgreSQL)."""
    now = time.time()
    ctx.db_writes("effect", [(INSERT_EFFECT, (n, t, now, now))])


@app.task(
    name="full_retry",
    queue="retry",
    operation_key="bench-retry:{n}",
    resource_key="bench-res:{n}",
    backoff_base_s=0.0,
)
def full_retry(ctx: Context, n: int, t: float) -> None:
    """The full guard under a retry storm: the first attempt of every third job fails with a
    transient error before its ``db_step``, and the job is retried at once."""
    if n % 3 == 0 and ctx.attempt == 1:
        raise ConnectionError("bench: the first attempt of every third job fails")
    ctx.db_step("effect", _insert_effect, n, t, time.time())

"""Apps the benchmark workers run; the store path comes from ``JOBGUARD_BENCH_DB``."""

from __future__ import annotations

import os

from jobguard import App, Context

app = App(f"sqlite:///{os.environ.get('JOBGUARD_BENCH_DB', 'bench.db')}")


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

"""The app real worker processes run in the time-limit and cancel tests (#17).

Handlers record what they did in the event log of ``tests.support.queue_app`` and write to a
fenced ledger: a SQLite table beside the store that, like any system guarded by fencing tokens,
refuses a write whose fence is older than one it already took. A handler that must hang waits
for a release file the test creates, so "blocks forever" lasts exactly as long as the test says.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from jobguard import App, Context, RunStopped
from tests.support import stores
from tests.support.procs import WorkerProcess, spawn_worker
from tests.support.queue_app import record

HANG = "hang"
FOLLOW = "follow"
COOP = "coop"
STUBBORN = "stubborn"
NOOP = "noop"
ASYNC_HANG = "async_hang"
SOFT_S = 0.5
LEASE_S = 1.5  # the heartbeat renews every LEASE_S / 3
HANG_FOR_S = 60.0  # "forever": far longer than any test waits


def start_worker(url: str, name: str, concurrency: int = 1) -> WorkerProcess:
    """A worker process running this app's jobs, ``concurrency`` at a time, none buffered."""
    proc = spawn_worker(url, __name__, worker_id=name, concurrency=concurrency, prefetch=0)
    proc.wait_ready()
    return proc


def release_path(url: str, job_id: int) -> Path:
    """The file whose creation wakes job ``job_id``'s hanging handler."""
    return stores.home_of(url) / f"release-{job_id}"


def release(url: str, job_id: int) -> None:
    """Wake a hanging handler."""
    path = release_path(url, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def hang_until_released(url: str, job_id: int) -> None:
    """Block (never looking at ``ctx``) until the test releases this job."""
    deadline = time.monotonic() + HANG_FOR_S
    while not release_path(url, job_id).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _ledger(url: str) -> sqlite3.Connection:
    path = stores.home_of(url) / "ledger.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS ledger (resource TEXT, fence INTEGER, writer TEXT)")
    return conn


def ledger_write(url: str, resource: str, fence: int | None, writer: str) -> bool:
    """Write with ``fence`` unless a newer fence wrote already (the fencing-token check)."""
    conn = _ledger(url)
    try:
        conn.execute("BEGIN IMMEDIATE")
        (newest,) = conn.execute(
            "SELECT coalesce(max(fence), 0) FROM ledger WHERE resource = ?", (resource,)
        ).fetchone()
        if fence is None or fence < newest:
            conn.execute("ROLLBACK")
            return False
        conn.execute("INSERT INTO ledger VALUES (?, ?, ?)", (resource, fence, writer))
        conn.execute("COMMIT")
        return True
    finally:
        conn.close()


def ledger(url: str) -> list[tuple[str, int, str]]:
    """Every write the ledger took, in order."""
    conn = _ledger(url)
    try:
        return conn.execute("SELECT resource, fence, writer FROM ledger ORDER BY rowid").fetchall()
    finally:
        conn.close()


def make_app(url: str) -> App:
    """The tasks of the time-limit and cancel tests on the store at ``url``."""
    app = App(url)
    common = {"visibility_timeout_s": LEASE_S, "lock_ttl_s": LEASE_S, "backoff_base_s": 0.0}

    @app.task(
        name=HANG,
        resource_key="res:{res}",
        operation_key="hang:{res}",
        soft_time_limit_s=SOFT_S,
        max_attempts=3,
        **common,
    )
    def hang(ctx: Context, res: str) -> None:
        """Attempt 1 hangs past its soft limit without looking; when woken late, it writes
        with its old fence and tries a step. Later attempts finish at once."""
        ctx.step("first", lambda: ctx.attempt)
        record(url, ctx, "start")
        if ctx.attempt > 1:
            record(url, ctx, "end")
            return
        hang_until_released(url, ctx.job_id)
        record(url, ctx, f"woke:passed={ctx.time_limit_passed}")
        accepted = ledger_write(url, f"res:{res}", ctx.fence, f"{HANG}:{ctx.attempt}")
        record(url, ctx, f"stale-write:{'accepted' if accepted else 'refused'}")
        try:
            ctx.step("after", lambda: 1)
            record(url, ctx, "step:accepted")
        except RunStopped as exc:
            record(url, ctx, f"step:refused:{type(exc).__name__}")

    @app.task(name=FOLLOW, resource_key="res:{res}", **common)
    def follow(ctx: Context, res: str) -> None:
        """The next job on the same resource: writes with its own fence."""
        record(url, ctx, "start")
        accepted = ledger_write(url, f"res:{res}", ctx.fence, FOLLOW)
        record(url, ctx, f"write:{'accepted' if accepted else 'refused'}")

    @app.task(name=COOP, operation_key="coop:{n}", **common)
    def coop(ctx: Context, n: int) -> None:
        """Works in steps until told to stop (a cancel), as a cooperative handler does."""
        record(url, ctx, "start")
        for i in range(int(HANG_FOR_S / 0.02)):
            ctx.step(f"tick-{i}", lambda: None)
            time.sleep(0.02)

    @app.task(name=STUBBORN, **common)
    def stubborn(ctx: Context) -> None:
        """Never cooperates: hangs until released, then records whether it was cancelled."""
        record(url, ctx, "start")
        hang_until_released(url, ctx.job_id)
        record(url, ctx, f"woke:cancel={ctx.cancel_requested}")

    @app.task(name=NOOP, **common)
    def noop(ctx: Context, n: int = 0) -> None:
        """Records that it ran."""
        record(url, ctx, "start")

    @app.task(name=ASYNC_HANG, soft_time_limit_s=SOFT_S, max_attempts=1, **common)
    async def async_hang(ctx: Context) -> None:
        """Awaits far past its soft limit: cancelled there."""
        record(url, ctx, "start")
        try:
            await asyncio.sleep(HANG_FOR_S)
        except asyncio.CancelledError:
            record(url, ctx, "cancelled")
            raise

    return app

"""Producers and lock holders in async code: ``enqueue_many_async`` and ``app.lock_async`` (G11).

Both run their store calls on threads, never on the event loop, and keep what the sync forms
promise: one transaction for a batch of jobs; one live owner per resource, a fence larger than
any before, release when the block ends however it ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from jobguard import App, Context, JobStatus, LockBusyError
from tests.support import stores
from tests.support.procs import wait_until


def test_enqueue_many_async_stores_every_job_from_a_running_loop(app: App) -> None:
    @app.task(name="ship")
    def ship(ctx: Context, order_id: int) -> None:
        """Nothing to do."""

    async def produce() -> list[int]:
        jobs = await ship.enqueue_many_async({"order_id": n} for n in range(5))
        return [job.id for job in jobs]

    ids = asyncio.run(produce())
    assert len(ids) == 5
    assert {app.get_job(job_id).status for job_id in ids} == {JobStatus.QUEUED}


def test_lock_async_holds_one_owner_and_releases_when_the_block_ends(app: App) -> None:
    async def hold() -> tuple[int, int]:
        async with app.lock_async("dock:7", ttl_s=10.0) as first:
            with pytest.raises(LockBusyError):
                async with app.lock_async("dock:7", ttl_s=10.0):
                    pass
            with pytest.raises(LockBusyError), app.lock("dock:7", ttl_s=10.0):
                pass
        with pytest.raises(RuntimeError, match="the block failed"):
            async with app.lock_async("dock:7", ttl_s=10.0):
                raise RuntimeError("the block failed")
        async with app.lock_async("dock:7", ttl_s=10.0) as third:
            pass
        return first.fence, third.fence

    first_fence, third_fence = asyncio.run(hold())
    assert third_fence > first_fence
    with app.lock("dock:7", ttl_s=10.0):  # released by every block above, the failed one too
        pass


def test_a_lock_granted_after_its_taker_was_cancelled_is_released(tmp_path: Path) -> None:
    """The taker is cancelled while the store is busy granting; the grant that follows is
    given back, not renewed for ever by a holder that no longer exists."""
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    app = App(url)
    try:
        app.backend.lock_fence("dock:1")  # the store exists before another connection holds it
        blocker = sqlite3.connect(stores.sqlite_file(url), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # every write waits until this commits

        async def cancel_while_taking() -> asyncio.Task[None]:
            taker = asyncio.create_task(_hold_for_ever(app))
            await asyncio.sleep(0.2)  # the taker's thread now waits for the write lock
            taker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await taker
            blocker.execute("COMMIT")  # the grant now goes through on the taker's thread
            return taker

        # The cancelled task is kept, as an application may keep it: the grant it never got
        # must still be given back.
        cancelled = asyncio.run(cancel_while_taking())  # ends once the taker's thread returned
        assert cancelled.cancelled()
        blocker.close()
        assert app.backend.lock_fence("dock:1") == 1  # granted after the cancellation

        def free() -> bool:
            try:
                with app.lock("dock:1", ttl_s=30.0):
                    return True
            except LockBusyError:
                return False

        # The lock's TTL is 30 s: free well before, only if the cancelled grant was released.
        started = time.monotonic()
        wait_until(free, timeout_s=10)
        assert time.monotonic() - started < 10
    finally:
        app.close()


async def _hold_for_ever(app: App) -> None:
    async with app.lock_async("dock:1", ttl_s=30.0):
        await asyncio.Event().wait()

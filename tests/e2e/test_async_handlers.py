"""``async def`` handlers run on the worker's event loop with all that sync ones have (G11).

In-process workers (``jobguard.testing.drain``) on each backend's store; the store, the
pipeline, the heartbeat and the loop are the real ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from jobguard import App, ConfigurationError, Context, JobStatus, Retry
from jobguard.testing import drain
from tests.support import stores


def test_async_handlers_are_awaited_on_one_loop_the_worker_owns(app: App) -> None:
    """Every async job of a worker runs on the same loop, on a thread of its own (not a handler
    thread), and its return value is stored as a sync handler's is."""
    seen: list[tuple[int, int]] = []

    @app.task(name="fetch_rate")
    async def fetch_rate(ctx: Context, n: int) -> dict[str, int]:
        await asyncio.sleep(0.01)
        seen.append((id(asyncio.get_running_loop()), threading.get_ident()))
        return {"n": n}

    jobs = [fetch_rate.enqueue(n=n) for n in range(6)]
    drain(app, concurrency=3)
    assert {app.get_job(job.id).status for job in jobs} == {JobStatus.COMPLETED}
    assert len(seen) == 6
    assert len({loop for loop, _ in seen}) == 1
    assert len({thread for _, thread in seen}) == 1
    assert seen[0][1] != threading.get_ident()
    operation_results = [app.get_job(job.id) for job in jobs]
    assert all(job.attempts == 1 for job in operation_results)


def test_async_steps_are_memoised_across_retries_and_db_steps_commit_with_their_record(
    app: App, store_url: str
) -> None:
    """``await ctx.step_async`` (of a coroutine function) runs once per operation and returns
    its stored value on the retry; ``await ctx.db_step_async`` and ``await ctx.db_writes_async``
    write their rows once; async code
    enqueues with ``await task.enqueue_async`` without blocking its loop."""
    calls: list[str] = []

    @app.task(name="receipt")
    def receipt(ctx: Context, order_id: int) -> None:
        calls.append(f"receipt-{order_id}")

    paid = stores.table(store_url, "paid")
    stores.execute(store_url, [f"CREATE TABLE {paid} (order_id INTEGER UNIQUE)"])
    insert = stores.dialect_sql(store_url, f"INSERT INTO {paid} VALUES (?)")
    ledger = stores.table(store_url, "ledger")
    stores.execute(store_url, [f"CREATE TABLE {ledger} (order_id INTEGER UNIQUE)"])
    booked = stores.dialect_sql(store_url, f"INSERT INTO {ledger} VALUES (?)")

    def insert_row(conn: Any, order_id: int) -> int:
        conn.execute(insert, (order_id,))
        return order_id

    @app.task(name="pay", operation_key="pay:{order_id}", backoff_base_s=0)
    async def pay(ctx: Context, order_id: int) -> dict[str, Any]:
        async def charge() -> dict[str, Any]:
            calls.append("charge")
            await asyncio.sleep(0)
            return {"id": "ch_1", "amounts": [1, 2], "meta": {"ok": True}}

        charged = await ctx.step_async("charge", charge)
        await ctx.db_step_async("record", insert_row, order_id)
        await ctx.db_writes_async("ledger", [(booked, (order_id,))])
        if ctx.attempt == 1:
            raise Retry("the bank asked us to come back", delay_s=0)
        await receipt.enqueue_async(order_id=order_id)
        return charged

    job = pay.enqueue(order_id=9)
    drain(app)
    final = app.get_job(job.id)
    assert (final.status, final.attempts) == (JobStatus.COMPLETED, 2)
    assert calls == ["charge", "receipt-9"]
    operation = app.operation("pay:9")
    assert operation is not None
    assert operation.result == {"id": "ch_1", "amounts": [1, 2], "meta": {"ok": True}}
    assert set(operation.steps) == {"charge", "record", "ledger"}
    [attempt_1, attempt_2] = app.attempts(job_id=job.id)
    assert (attempt_1.steps_run, attempt_2.steps_run, attempt_2.steps_skipped) == (3, 0, 3)
    assert stores.query(store_url, f"SELECT order_id FROM {paid}") == [(9,)]
    assert stores.query(store_url, f"SELECT order_id FROM {ledger}") == [(9,)]


def test_an_async_handler_longer_than_its_lease_keeps_it_through_the_heartbeat(app: App) -> None:
    """A coroutine awaiting 3x its 0.5 s visibility timeout is renewed like a sync handler: no
    second delivery, one attempt."""
    starts: list[int] = []

    @app.task(name="slow", visibility_timeout_s=0.5)
    async def slow(ctx: Context) -> None:
        starts.append(ctx.attempt)
        await asyncio.sleep(1.5)
        assert not ctx.lease_lost

    job = slow.enqueue()
    drain(app, concurrency=2)
    assert starts == [1]
    assert app.get_job(job.id).status == JobStatus.COMPLETED


def generator_handler(ctx: Context) -> Iterator[int]:
    """A generator: calling it runs nothing."""
    yield 1


async def async_generator_handler(ctx: Context) -> AsyncIterator[int]:
    """An async generator: calling it runs nothing either."""
    yield 1


@pytest.mark.parametrize("handler", [generator_handler, async_generator_handler])
def test_generators_are_refused_at_registration_with_the_reason(app: App, handler: Any) -> None:
    """A generator would be accepted and then every job would die at run time; refuse it."""
    with pytest.raises(ConfigurationError, match="generator function; calling it only creates"):
        app.task(name="gen")(handler)


def test_a_class_is_refused_as_a_handler(app: App) -> None:
    """Calling a class instantiates it; nothing of a job would run."""

    class Handler:
        def __init__(self, ctx: Context) -> None:
            pass

    with pytest.raises(ConfigurationError, match="the handler must be a function"):
        app.task(name="cls")(Handler)

"""Hostile handler text and async handlers on every store (G11, G12), in process.

The same checks on a fresh SQLite file and on a fresh PostgreSQL schema: text PostgreSQL's
``text`` columns refuse (NUL) and that no store can encode (lone surrogates) is made storable
before it is written, and an ``async def`` handler's steps are recorded through the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App, Context, JobStatus, Outcome
from jobguard.testing import drain
from tests.support import pg

UNSTORABLE = "bad \x00 text \ud800 here"
STORED = "bad \ufffd text \ufffd here"


@pytest.fixture(params=["sqlite", "postgres"])
def any_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    """An app on a fresh store of each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        url = pg.fresh_store_url(pg.session_database())
    application = App(url)
    yield application
    application.close()


def test_unstorable_handler_text_is_recorded_made_storable(any_app: App) -> None:
    """An error message and an external reference with NUL and a lone surrogate: the failure is
    recorded and the job retried, then completes with its reference stored (U+FFFD for both)."""

    @any_app.task(name="hostile", operation_key="hostile:{n}", backoff_base_s=0)
    def hostile(ctx: Context, n: int) -> None:
        if ctx.attempt == 1:
            raise ValueError(UNSTORABLE)
        ctx.set_external_ref(UNSTORABLE)

    job = hostile.enqueue(n=1)
    drain(any_app)
    assert any_app.get_job(job.id).status == JobStatus.COMPLETED
    first, second = any_app.attempts(job_id=job.id)
    assert (first.outcome, first.error_message) == (Outcome.RETRY, STORED)
    assert second.outcome == Outcome.COMPLETED
    operation = any_app.operation("hostile:1")
    assert operation is not None
    assert operation.external_ref == STORED


def test_an_async_handler_records_its_steps_on_every_store(any_app: App) -> None:
    """``await ctx.step_async`` and the handler's result go through the store like sync ones."""

    @any_app.task(name="fetch", operation_key="fetch:{n}")
    async def fetch(ctx: Context, n: int) -> list[int]:
        async def load() -> list[int]:
            await asyncio.sleep(0)
            return [n, n + 1]

        return list(await ctx.step_async("load", load))

    job = fetch.enqueue(n=3)
    drain(any_app)
    assert any_app.get_job(job.id).status == JobStatus.COMPLETED
    operation = any_app.operation("fetch:3")
    assert operation is not None
    assert (operation.result, operation.steps) == ([3, 4], {"load": [3, 4]})

"""Steps are exact, in process on each backend's store (G5): names once per execution, values
back exactly as first returned, and a database step whose result would change rolls back."""

from __future__ import annotations

from typing import Any

import pytest

from jobguard import App, Context, JobStatus, Retry
from jobguard.testing import drain
from tests.support import stores


def test_a_memoised_value_comes_back_on_a_retry_exactly_as_first_returned(app: App) -> None:
    """Nested dicts, lists, floats, bools and None: equal and of the same types on attempt 2."""
    first: dict[int, Any] = {}

    @app.task(name="quote", operation_key="quote:{n}", backoff_base_s=0)
    def quote(ctx: Context, n: int) -> None:
        value = ctx.step(
            "price", lambda: {"eur": [1.5, 2], "ok": True, "note": None, "by": {"x": "y"}}
        )
        first.setdefault(ctx.attempt, value)
        if ctx.attempt == 1:
            raise Retry("again", delay_s=0)

    job = quote.enqueue(n=1)
    drain(app)
    assert app.get_job(job.id).status == JobStatus.COMPLETED
    assert first[1] == first[2]
    assert repr(first[1]) == repr(first[2])  # same types all the way down (2 stays an int)


def test_a_database_step_whose_result_would_change_rolls_its_rows_back(
    app: App, store_url: str
) -> None:
    """``ctx.db_step`` returning a dict with int keys: StepError, the transaction rolled back
    (no row, no step record), the job dead after one delivery."""
    notes = stores.table(store_url, "notes")
    stores.execute(store_url, [f"CREATE TABLE {notes} (n INTEGER)"])
    insert = stores.dialect_sql(store_url, f"INSERT INTO {notes} VALUES (?)")

    def write(conn: Any, n: int) -> dict[int, str]:
        conn.execute(insert, (n,))
        return {n: "written"}

    @app.task(name="note", operation_key="note:{n}")
    def note(ctx: Context, n: int) -> None:
        ctx.db_step("write", write, n)

    job = note.enqueue(n=8)
    drain(app)
    final = app.get_job(job.id)
    assert (final.status, final.attempts) == (JobStatus.DEAD, 1)
    assert "has the int key 8; JSON keys are text" in (final.dead_reason or "")
    assert stores.query(store_url, f"SELECT COUNT(*) FROM {notes}") == [(0,)]
    operation = app.operation("note:8")
    assert operation is not None
    assert operation.steps == {}


@pytest.mark.parametrize("name", ["", "x" * 201, "a\ud800", "nul\x00", 7])
def test_a_step_name_no_store_can_hold_is_refused_before_anything_runs(app: App, name: Any) -> None:
    """A name that could not be recorded would let the step run again on every delivery."""
    ran: list[int] = []

    @app.task(name="named", operation_key="named:{n}")
    def named(ctx: Context, n: int) -> None:
        ctx.step(name, ran.append, n)

    job = named.enqueue(n=1)
    drain(app)
    final = app.get_job(job.id)
    assert (final.status, final.attempts) == (JobStatus.DEAD, 1)
    assert "name must be non-empty text" in (final.dead_reason or "")
    assert ran == []

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


# Four bytes of UTF-8 each: 512 of them is the longest operation key an enqueue allows.
WIDE = "\U0001f4e6"


@pytest.mark.parametrize("step", ["step", "db_step"])
def test_a_step_name_too_wide_to_index_with_its_operation_key_is_refused(
    app: App, step: str
) -> None:
    """A step's record is indexed on its operation key and name together. Before, a name of 200
    four-byte characters in a job whose key had 512 made PostgreSQL refuse the record ("index
    row size 2864 exceeds btree version 4 maximum 2704"), reported as the store being
    unavailable: the step ran again on every delivery until the attempts ran out. Now it is a
    StepError on every store, before the step runs, and the job is dead after one delivery; a
    name that fits still runs."""
    ran: list[str] = []

    @app.task(name="wide", operation_key="{key}")
    def wide(ctx: Context, key: str, name: str) -> None:
        do = getattr(ctx, step)
        if step == "db_step":
            do(name, lambda conn: ran.append(name))
        else:
            do(name, ran.append, name)

    too_wide = wide.enqueue(key=WIDE * 511 + "a", name=WIDE * 200)
    fits = wide.enqueue(key=WIDE * 511 + "b", name=WIDE * 100 + "-")
    drain(app)
    final = app.get_job(too_wide.id)
    assert (final.status, final.attempts) == (JobStatus.DEAD, 1)
    assert "and the operation key together take 2845 bytes of UTF-8" in (final.dead_reason or "")
    assert app.get_job(fits.id).status == JobStatus.COMPLETED
    assert ran == [WIDE * 100 + "-"]


def test_db_writes_commit_once_and_a_retry_after_them_runs_nothing_again(
    app: App, store_url: str
) -> None:
    """``ctx.db_writes``: the rows and the step record commit together on attempt 1; attempt 2
    (the handler failed after the step) skips the step, so each row exists once."""
    notes = stores.table(store_url, "notes")
    stores.execute(store_url, [f"CREATE TABLE {notes} (n INTEGER PRIMARY KEY, by_attempt INTEGER)"])
    insert = stores.dialect_sql(store_url, f"INSERT INTO {notes} VALUES (?, ?)")
    seen: list[tuple[int, int]] = []

    @app.task(name="note", operation_key="note:{n}", backoff_base_s=0)
    def note(ctx: Context, n: int) -> None:
        ctx.db_writes("write", [(insert, (n, ctx.attempt)), (insert, (n + 1, ctx.attempt))])
        seen.append((ctx.attempt, ctx.steps_run))
        if ctx.attempt == 1:
            raise Retry("fail after the step", delay_s=0)

    job = note.enqueue(n=8)
    drain(app)
    final = app.get_job(job.id)
    assert (final.status, final.attempts) == (JobStatus.COMPLETED, 2)
    assert stores.query(store_url, f"SELECT n, by_attempt FROM {notes} ORDER BY n") == [
        (8, 1),
        (9, 1),
    ]
    assert seen == [(1, 1), (2, 0)]  # attempts with the step run, then skipped
    operation = app.operation("note:8")
    assert operation is not None
    assert operation.steps == {"write": None}


@pytest.mark.parametrize(
    ("statements", "message"),
    [
        ("INSERT INTO t VALUES (1)", "takes a list of (sql, parameters) pairs, not str"),
        ([], "was given no statement to run"),
        (["INSERT INTO t VALUES (1)"], "statement 0 must be a (sql, parameters) pair"),
        ([(b"INSERT INTO t VALUES (1)", None)], "statement 0: the SQL must be text, not bytes"),
        ([("INSERT INTO t VALUES (?)", 5)], "parameters must be None, a sequence or a mapping"),
        ([("INSERT INTO t VALUES (?)", "5")], "parameters must be None, a sequence or a mapping"),
    ],
)
def test_db_writes_refuses_statements_of_the_wrong_shape_and_buries_the_job(
    app: App, statements: Any, message: str
) -> None:
    """What a handler passes to ``ctx.db_writes`` is checked before anything is sent: the job
    is buried with a reason naming what is wrong (every rerun would repeat it)."""

    @app.task(name="bad", operation_key="bad:{n}")
    def bad(ctx: Context, n: int) -> None:
        ctx.db_writes("write", statements)

    job = bad.enqueue(n=1)
    drain(app)
    final = app.get_job(job.id)
    assert final.status == JobStatus.DEAD
    assert message in (final.dead_reason or "")

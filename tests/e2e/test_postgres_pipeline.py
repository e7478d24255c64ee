"""PostgreSQL: the round trips one guarded job costs (fetch, db_step, settle), counted by psycopg.

A round trip is a wait for the server: a statement or BEGIN/COMMIT outside pipeline mode, and
in pipeline mode a Sync or a fetch of results still outstanding. Upper bounds, not timings:
what a job costs the worker and the server does not depend on how busy the machine is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import _pipeline_base

from jobguard.backends.base import Closing
from jobguard.backends.postgres import PostgresBackend
from jobguard.exceptions import StepSQLError, StoreUnavailableError
from jobguard.models import Guard, JobStatus, Outcome
from tests.support import pg
from tests.support.ports import keyed_spec, rules_for, success


@contextmanager
def round_trips() -> Iterator[Counter[str]]:
    """Count this process's waits for the server, by kind."""
    counts: Counter[str] = Counter()
    execute = psycopg.Cursor.execute
    transaction = psycopg.Connection.transaction
    enqueue_sync = _pipeline_base.BasePipeline._enqueue_sync
    fetch_pipeline = psycopg.Cursor._fetch_pipeline

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.connection._pipeline is None:
            counts["statement"] += 1
        return execute(self, *args, **kwargs)

    @contextmanager
    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if self._pipeline is None:
            counts["begin and commit"] += 2
        with transaction(self, *args, **kwargs) as tx:
            yield tx

    def counted_sync(self: Any) -> None:
        counts["sync"] += 1
        enqueue_sync(self)

    def counted_fetch(self: Any) -> None:
        if self._conn._pipeline is not None and self.pgresult is None:
            counts["flush"] += 1
        fetch_pipeline(self)

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Connection.transaction = counted_transaction  # type: ignore[assignment,method-assign]
    _pipeline_base.BasePipeline._enqueue_sync = counted_sync  # type: ignore[method-assign]
    psycopg.Cursor._fetch_pipeline = counted_fetch  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Connection.transaction = transaction  # type: ignore[method-assign]
        _pipeline_base.BasePipeline._enqueue_sync = enqueue_sync  # type: ignore[method-assign]
        psycopg.Cursor._fetch_pipeline = fetch_pipeline  # type: ignore[method-assign]


@pytest.fixture
def store() -> Iterator[PostgresBackend]:
    backend = PostgresBackend(pg.fresh_store_url(pg.session_database()))
    with backend.driver.connect() as conn:
        conn.execute(f'CREATE TABLE "{backend.driver.schema}".effects (n int PRIMARY KEY)')
    yield backend
    backend.close()


def _insert(conn: Any, table: str, n: int) -> int:
    conn.execute(f"INSERT INTO {table} (n) VALUES (%s)", (n,))
    return n


def test_a_guarded_job_is_fetched_in_six_round_trips_stepped_in_three_settled_in_three(
    store: PostgresBackend,
) -> None:
    """BEGIN travels with a transaction's first statement; the step's user statement is its
    own round trip, its step record goes with COMMIT; the settle's statements whose results
    are not needed travel with the next one, and COMMIT with the last (7, 5 and 6 round trips
    before pipeline mode)."""
    table = f'"{store.driver.schema}".effects'
    store.enqueue_many([keyed_spec("q", "dock:1", "op:1")])
    store.fetch_prepared(["q"], 10, "w0", rules_for("tests.keyed"))  # the pool is warm
    store.enqueue_many([keyed_spec("q", "dock:2", "op:2")])
    with round_trips() as fetching:
        (item,) = store.fetch_prepared(["q"], 10, "w1", rules_for("tests.keyed"))
    assert item.begun is not None
    assert item.begun.operation is not None
    guard = Guard(
        item.delivery.job_id, item.delivery.lease_token, item.delivery.attempt_id, item.begun.grant
    )
    with round_trips() as stepping:
        ran, value = store.db_step(guard, "op:2", "effect", _insert, [table, 2])
    assert (ran, value) == (True, 2)
    ending = success(guard, Closing(0.1), Outcome.COMPLETED, "op:2", "1")
    with round_trips() as settling:
        assert store.settle([ending]) == [None]
    assert store.get_job(item.delivery.job_id).status is JobStatus.COMPLETED
    assert sum(stepping.values()) <= 3, stepping
    assert sum(settling.values()) <= 3, settling
    # BEGIN + ready_jobs, lease_jobs, grant_locks, insert_operations, insert_attempts, COMMIT
    # (any_ready skipped: work was found before); 7 before pipeline mode.
    assert sum(fetching.values()) <= 6, fetching


def test_a_failing_statement_of_a_step_raises_in_the_step_function_and_nothing_commits(
    store: PostgresBackend,
) -> None:
    """In pipeline mode the user's statements still run one at a time: the one that fails
    raises in the function, which may catch it; the step then records nothing."""
    table = f'"{store.driver.schema}".effects'
    store.enqueue_many([keyed_spec("q", "dock:1", "op:1")])
    (item,) = store.fetch_prepared(["q"], 10, "w1", rules_for("tests.keyed"))
    assert item.begun is not None
    guard = Guard(
        item.delivery.job_id, item.delivery.lease_token, item.delivery.attempt_id, item.begun.grant
    )
    seen: list[str] = []

    def twice(conn: Any) -> None:
        conn.execute(f"INSERT INTO {table} (n) VALUES (1)")
        try:
            conn.execute(f"INSERT INTO {table} (n) VALUES (1)")
        except StepSQLError as exc:
            seen.append(str(exc))
            raise

    with pytest.raises(StepSQLError, match="duplicate key"):
        store.db_step(guard, "op:1", "effect", twice, [])
    assert len(seen) == 1
    assert "duplicate key" in seen[0]
    with store.driver.connect() as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert store.db_step(guard, "op:1", "effect", _insert, [table, 1]) == (True, 1)


@pytest.mark.parametrize(
    ("awaited_after", "runs"),
    [
        # The client learns of the loss at the commit's Sync, with no answer from the server:
        # COMMIT had left by then and may have landed, so the write is not run again (it
        # fails, and what it wrote is left to the lease, as any write whose commit may have).
        pytest.param(False, 1, id="lost-once-commit-was-sent"),
        # Seen at a statement whose answer is awaited: COMMIT was never sent, so nothing
        # committed and the write runs again, once, on a new connection.
        pytest.param(True, 2, id="lost-before-commit"),
    ],
)
def test_a_write_whose_connection_is_lost_runs_again_only_if_its_commit_was_not_sent(
    store: PostgresBackend, awaited_after: bool, runs: int
) -> None:
    """The server ends the write's connection at a statement sent without waiting (a pipeline
    queues it); whether the write runs again depends on whether COMMIT followed it out."""
    calls: list[int] = []

    def op(tx: Any) -> None:
        calls.append(1)
        tx.one("store_clock", {})
        tx.connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # queued
        if awaited_after:
            tx.one("store_clock", {})  # its Sync finds the connection gone

    with pytest.raises(StoreUnavailableError, match="PostgreSQL write failed"):
        store.driver.write(op)
    assert len(calls) == runs


def test_a_queued_statement_refused_by_the_server_fails_the_write_and_nothing_commits(
    store: PostgresBackend,
) -> None:
    """A statement whose result was not awaited fails at the commit: the write fails with
    it, nothing of the transaction is kept, and the pooled connection is usable again."""
    table = f'"{store.driver.schema}".effects'

    def op(tx: Any) -> None:
        tx.connection.execute(f"INSERT INTO {table} (n) VALUES (7)")
        tx.connection.execute(f"INSERT INTO {table} (n) VALUES (7)")  # queued: refused

    with pytest.raises(StoreUnavailableError, match="duplicate key"):
        store.driver.write(op)
    assert store.driver.write(lambda tx: tx.one("store_clock", {})) is not None
    with store.driver.connect() as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)

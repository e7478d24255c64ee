"""PostgreSQL: a fetch whose batch needs nothing more than new leases, locks, operations and
attempt rows is one statement, committed on its own (``lease_and_begin``); a batch that needs
more (an expired lease to close, two jobs for one resource or operation, an operation recorded
already, a concurrency slot) takes the fetch's transaction of several statements instead, and
the one statement wrote nothing of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from jobguard.backends.base import Prepared
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.postgres.driver import PostgresTx
from jobguard.exceptions import StoreUnavailableError
from jobguard.models import BusyReason, JobStatus, OperationStatus, Outcome
from tests.support import pg, stores
from tests.support.ports import keyed_spec, rules_for

RULES = rules_for("tests.keyed")
# The fetch's pick inside its transaction: the one statement without its begin.
PICK = "lease_and_begin (pick only)"


@pytest.fixture
def url() -> str:
    return pg.fresh_store_url(pg.session_database())


@pytest.fixture
def store(url: str) -> Iterator[PostgresBackend]:
    backend = PostgresBackend(url)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the store's statements as they run, and ``write`` for each transaction."""
    names: list[str] = []
    execute = PostgresTx._execute

    def recorded(tx: PostgresTx, name: str, params: Mapping[str, Any]) -> Any:
        names.append(PICK if name == "lease_and_begin" and not params["begin"] else name)
        return execute(tx, name, params)

    monkeypatch.setattr(PostgresTx, "_execute", recorded)
    return names


def writes(statements: list[str]) -> list[str]:
    """The statements that write, of those recorded (not the look for work nor the clock)."""
    return [name for name in statements if name not in ("any_ready", "store_clock")]


def fetch(store: PostgresBackend, queues: list[str], limit: int = 10) -> list[Prepared]:
    return store.fetch_prepared(queues, limit, "w1", RULES)


def job_row(store: PostgresBackend, job_id: int) -> tuple[str, int]:
    job = store.get_job(job_id)
    return job.status.value, job.attempts


def test_a_batch_of_new_jobs_is_leased_and_begun_by_one_statement(
    store: PostgresBackend, statements: list[str]
) -> None:
    jobs = store.enqueue_many(
        [
            keyed_spec("a", "dock:1", "op:1"),
            keyed_spec("a", "dock:2", None),
            keyed_spec("a", None, "op:3"),
            keyed_spec("a", None, None),
        ]
    )
    statements.clear()
    prepared = fetch(store, ["a"])
    assert [p.delivery.job_id for p in prepared] == [job.id for job in jobs]
    assert writes(statements) == ["lease_and_begin"]

    both, lock_only, claim_only, plain = prepared
    assert plain.request is None
    assert plain.begun is None
    for item in (both, lock_only):
        assert item.begun is not None
        assert item.begun.grant is not None
        assert item.begun.grant.fence == 1
        assert item.request is not None
        assert item.begun.grant.owner == item.request.lock_owner
        assert item.request.lock_owner.startswith("w1/")
        assert item.begun.grant.expires_at == pytest.approx(
            item.delivery.lease_expires_at - 60.0 + 30.0, abs=1.0
        )
    assert both.begun is not None
    assert claim_only.begun is not None
    for item, resource, key in ((both, "dock:1", "op:1"), (claim_only, None, "op:3")):
        assert item.begun is not None
        operation = item.begun.operation
        assert operation is not None
        assert operation.status is OperationStatus.PROCESSING
        assert operation.resource_key == resource
        # Known without reading it back: the record as the statement wrote it, field by field.
        assert operation == store.get_operation(key)
    assert lock_only.begun is not None
    assert lock_only.begun.operation is None
    assert claim_only.begun.grant is None

    # Each attempt row is written once, with the lock its delivery holds, under its own id.
    for item in prepared:
        (attempt,) = store.attempts(job_id=item.delivery.job_id)
        assert attempt.id == item.delivery.attempt_id
        assert attempt.outcome is Outcome.RUNNING
        assert attempt.lease_token == item.delivery.lease_token
        grant = item.begun.grant if item.begun else None
        assert attempt.lock_owner == (grant.owner if grant else None)
        assert attempt.fence == (grant.fence if grant else None)
        assert job_row(store, item.delivery.job_id) == (JobStatus.RUNNING.value, 1)
    assert fetch(store, ["a"]) == []


def test_after_a_batch_short_of_its_limit_the_next_fetch_looks_before_it_writes(
    store: PostgresBackend, statements: list[str]
) -> None:
    """A full batch may have left more behind: the next fetch leases at once. A batch short of
    its limit took what was ready: with no enqueue since, the next fetch looks on a read
    connection first and, finding nothing, writes nothing."""
    store.enqueue_many([keyed_spec("a", None, None) for _ in range(3)])
    assert len(fetch(store, ["a"], limit=2)) == 2
    statements.clear()
    assert len(fetch(store, ["a"], limit=2)) == 1
    assert "any_ready" not in statements
    statements.clear()
    assert fetch(store, ["a"], limit=2) == []
    assert "any_ready" in statements
    assert writes(statements) == []


def test_a_lock_held_by_a_live_owner_is_busy_in_the_one_statement_too(
    store: PostgresBackend, statements: list[str]
) -> None:
    (first,) = store.enqueue_many([keyed_spec("a", "dock:1", None)])
    (held,) = fetch(store, ["a"])
    store.enqueue_many([keyed_spec("a", "dock:1", "op:2")])
    statements.clear()
    (waiting,) = fetch(store, ["a"])
    assert writes(statements) == ["lease_and_begin"]
    assert waiting.begun is not None
    assert waiting.begun.busy is BusyReason.LOCK
    (attempt,) = store.attempts(job_id=waiting.delivery.job_id)
    assert (attempt.lock_owner, attempt.fence) == (None, None)
    # Its operation is not claimed while the lock it needs is busy.
    assert store.get_operation("op:2") is None
    assert held.delivery.job_id == first.id


def test_a_lock_whose_fence_cannot_grow_is_busy_in_the_one_statement(
    store: PostgresBackend, url: str, statements: list[str]
) -> None:
    """A lock whose fence was written by hand at bigint's largest value is not granted: the one
    statement reports it busy, as a held lock, instead of failing on "bigint out of range" and
    sending every fetch the long way."""
    (job,) = store.enqueue_many([keyed_spec("a", "dock:1", "op:1")])
    with psycopg.connect(stores.conninfo_of(url), autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{stores.schema_of(url)}".locks (resource, owner, fence, expires_at) '
            "VALUES ('dock:1', NULL, %s, NULL)",
            (2**63 - 1,),
        )
    statements.clear()
    (waiting,) = fetch(store, ["a"])
    assert writes(statements) == ["lease_and_begin"]
    assert waiting.delivery.job_id == job.id
    assert waiting.begun is not None
    assert waiting.begun.busy is BusyReason.LOCK
    assert store.get_operation("op:1") is None


def _expired_lease(store: PostgresBackend) -> None:
    store.enqueue_many([keyed_spec("a", "dock:9", None, lease_s=0.05)])
    assert len(fetch(store, ["a"])) == 1
    time.sleep(0.3)  # past the lease, on the server's clock (nothing waits for it to pass)
    store.enqueue_many([keyed_spec("a", "dock:10", None)])


def _one_resource(store: PostgresBackend) -> None:
    store.enqueue_many([keyed_spec("a", "dock:1", None), keyed_spec("a", "dock:1", None)])


def _one_operation(store: PostgresBackend) -> None:
    store.enqueue_many([keyed_spec("a", None, "op:1"), keyed_spec("a", None, "op:1")])


def _recorded_operation(store: PostgresBackend) -> None:
    store.enqueue_many([keyed_spec("a", None, "op:1")])
    assert len(fetch(store, ["a"])) == 1
    store.enqueue_many([keyed_spec("a", None, "op:1"), keyed_spec("a", "dock:2", "op:2")])


def _slot(store: PostgresBackend) -> None:
    limited = replace(keyed_spec("a", None, "op:1"), concurrency_key="db", concurrency_limit=1)
    store.enqueue_many([limited, keyed_spec("a", "dock:2", None)])


@pytest.mark.parametrize(
    "given",
    [_expired_lease, _one_resource, _one_operation, _recorded_operation, _slot],
    ids=["expired-lease", "one-resource", "one-operation", "recorded-operation", "slot"],
)
def test_a_batch_that_needs_more_takes_the_transaction_and_the_one_statement_wrote_nothing(
    store: PostgresBackend, statements: list[str], given: Any
) -> None:
    given(store)
    before = {job.id: job.attempts for job in store.find_jobs(queue="a")}
    statements.clear()
    prepared = fetch(store, ["a"])
    ran = writes(statements)
    assert ran[0] == "lease_and_begin"
    assert PICK in ran[1:]
    # Each job picked was leased once (by the transaction): the statement before it wrote none.
    for item in prepared:
        assert item.delivery.attempt == before[item.delivery.job_id] + 1
        attempts = store.attempts(job_id=item.delivery.job_id)
        assert [a.attempt for a in attempts] == list(range(1, item.delivery.attempt + 1))
        assert attempts[-1].id == item.delivery.attempt_id
        # An expired lease's attempt was closed as lost before the job was leased again.
        assert [a.outcome for a in attempts[:-1]] == [Outcome.LOST] * (len(attempts) - 1)
    assert {item.delivery.job_id for item in prepared} == {
        job_id for job_id, count in before.items() if count == 0 or given is _expired_lease
    }


def test_an_operation_recorded_while_the_statement_runs_sends_the_fetch_the_long_way(
    url: str, store: PostgresBackend, statements: list[str]
) -> None:
    """Another session inserts the operation after the statement looked and commits while the
    statement waits on its key: the statement fails whole, and the transaction claims it."""
    (job,) = store.enqueue_many([keyed_spec("a", None, "op:9")])
    statements.clear()
    database, _, schema = url.partition("?schema=")
    result: dict[str, Any] = {}
    with psycopg.connect(database) as other:
        other.execute(
            f'INSERT INTO "{schema}".operations (key, status, owner_lease, attempts, created_at,'
            " updated_at) VALUES ('op:9', 'processing', 'gone', 1, 0, 0)"
        )
        fetching = threading.Thread(target=lambda: result.setdefault("p", fetch(store, ["a"])))
        fetching.start()
        _wait_for_a_lock_wait(database.rsplit("/", 1)[1])
        other.commit()
        fetching.join(20)
    assert not fetching.is_alive()
    (item,) = result["p"]
    ran = writes(statements)
    assert ran[:2] == ["lease_and_begin", PICK]
    assert item.begun is not None
    assert item.begun.operation is not None
    assert item.begun.operation.status is OperationStatus.PROCESSING
    assert job_row(store, job.id) == (JobStatus.RUNNING.value, 1)
    assert len(store.attempts(job_id=job.id)) == 1


def _wait_for_a_lock_wait(database: str) -> None:
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        for _ in range(2000):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND wait_event_type = 'Lock'",
                (database,),
            ).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.005)
    raise AssertionError("the fetch never waited for the operation's key")


def test_queues_are_taken_in_order_and_within_the_limit_across_both_ways(
    store: PostgresBackend, statements: list[str]
) -> None:
    (first,) = store.enqueue_many([keyed_spec("a", "dock:1", None)])
    second, third = store.enqueue_many(
        [keyed_spec("b", "dock:2", None), keyed_spec("b", "dock:2", None)]
    )
    (fourth,) = store.enqueue_many([keyed_spec("c", "dock:3", None)])
    prepared = fetch(store, ["a", "b", "c"], limit=3)
    assert [p.delivery.job_id for p in prepared] == [first.id, second.id, third.id]
    assert job_row(store, fourth.id) == (JobStatus.QUEUED.value, 0)
    assert [p.delivery.job_id for p in fetch(store, ["a", "b", "c"])] == [fourth.id]


def test_a_spec_with_unknown_task_is_leased_without_a_begin(
    store: PostgresBackend, statements: list[str]
) -> None:
    spec = replace(keyed_spec("a", "dock:1", "op:1"), task="tests.unknown")
    store.enqueue_many([spec])
    statements.clear()
    (item,) = fetch(store, ["a"])
    assert writes(statements) == ["lease_and_begin"]
    assert item.request is None
    assert item.begun is None
    assert store.get_operation("op:1") is None


def test_leases_the_one_statement_took_go_to_work_when_the_transaction_after_it_fails(
    store: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They are committed: dropped with the fetch's error, they would wait out their leases."""
    (first,) = store.enqueue_many([keyed_spec("a", "dock:1", None)])
    waiting = store.enqueue_many([keyed_spec("b", "dock:2", None), keyed_spec("b", "dock:2", None)])

    def failing(fn: Any) -> Any:
        raise StoreUnavailableError("injected: the connection failed")

    monkeypatch.setattr(store.driver, "write", failing)
    assert [p.delivery.job_id for p in fetch(store, ["a", "b"])] == [first.id]
    with pytest.raises(StoreUnavailableError, match="injected"):
        fetch(store, ["b"])  # nothing taken before the failure: the fetch fails
    monkeypatch.undo()
    assert [job_row(store, job.id) for job in waiting] == [(JobStatus.QUEUED.value, 0)] * 2


def test_leases_one_queue_took_go_to_work_when_the_next_queue_s_statement_fails(
    store: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first,) = store.enqueue_many([keyed_spec("a", "dock:1", None)])
    (later,) = store.enqueue_many([keyed_spec("b", "dock:2", None)])
    write_statement = store.driver.write_statement

    def failing_for_b(name: str, params: Mapping[str, Any]) -> Any:
        if params.get("queue") == "b":
            raise StoreUnavailableError("injected: the connection failed")
        return write_statement(name, params)

    monkeypatch.setattr(store.driver, "write_statement", failing_for_b)
    assert [p.delivery.job_id for p in fetch(store, ["a", "b"])] == [first.id]
    with pytest.raises(StoreUnavailableError, match="injected"):
        fetch(store, ["b"])
    monkeypatch.undo()
    assert job_row(store, later.id) == (JobStatus.QUEUED.value, 0)

"""Conformance tests of the operation port: records, claims, memoised steps, db_step (G4).

Runs against every backend in ``conftest.BACKENDS``. Business tables are created and read through
``db_step`` itself, with plain SQL every supported database accepts, so the tests use only ports.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from jobguard.backends.base import Backend, BeginRequest, Begun, Closing, DeliveryRules, ErrorInfo
from jobguard.exceptions import GuardLost, LeaseLostError, StaleFenceError, StepSQLError
from jobguard.models import (
    BusyReason,
    DeadCode,
    Guard,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    OperationStatus,
    Outcome,
)
from jobguard.testing import ControlledClock
from tests.contract.conftest import business_table
from tests.support.ports import begin_operation, bury, fetch, finish, guard_of, release, retry

CLOSING = Closing(duration_s=0.1)
ERROR = ErrorInfo(type="ConnectionError", message="reset")
KEY = "fulfill-order:42"
_probe_names = itertools.count()


def make_spec(**changes: Any) -> JobSpec:
    """A job of operation ``KEY`` with a 30 s lease and 3 attempts."""
    fields: dict[str, Any] = {
        "task": "tests.fulfill",
        "queue": "default",
        "payload": '{"order_id":42}',
        "max_attempts": 3,
        "visibility_timeout_s": 30.0,
        "operation_key": KEY,
    }
    fields.update(changes)
    return JobSpec(**fields)


def deliver(backend: Backend, **changes: Any) -> Guard:
    """Enqueue one job and fetch it; return the delivery's guard (no lock)."""
    job = backend.enqueue(make_spec(**changes))
    found = fetch(backend, ["default"], 10, "w1")
    (delivery,) = [d for d in found if d.job_id == job.id]
    return guard_of(delivery)


def stored(backend: Backend, key: str = KEY) -> Operation:
    """The operation record, which the test expects to exist."""
    operation = backend.get_operation(key)
    assert operation is not None
    return operation


def lock_of(guard: Guard) -> LockGrant:
    """The lock grant a test guard was given by :func:`locked`."""
    assert guard.lock is not None
    return guard.lock


def locked(backend: Backend, guard: Guard, resource: str, ttl_s: float) -> Guard:
    """The same guard holding a fresh lock grant on ``resource``."""
    grant = backend.acquire_lock(resource, f"owner-{guard.job_id}", ttl_s)
    assert grant is not None
    return Guard(guard.job_id, guard.lease_token, guard.attempt_id, grant)


INVOICES = "invoices"


@pytest.fixture(autouse=True)
def _invoices_of_this_store(backend: Backend) -> None:
    """The business table lives beside this test's store (its own schema on PostgreSQL)."""
    global INVOICES
    INVOICES = business_table(backend, "invoices")


def create_invoices(conn: Any) -> str:
    """Business schema: one invoice per order, enforced by the primary key (G4.5)."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {INVOICES} (order_id INTEGER PRIMARY KEY)")
    return "created"


def insert_invoice(conn: Any, order_id: int) -> dict[str, int]:
    """The business write of the step (literal SQL: parameter styles differ per driver)."""
    assert isinstance(order_id, int)
    conn.execute(f"INSERT INTO {INVOICES} (order_id) VALUES ({order_id})")
    return {"invoice_for": order_id}


def count_invoices(backend: Backend, guard: Guard, key: str = KEY) -> int:
    """Read the business table inside a (uniquely named) step of a claimed operation."""

    def count(conn: Any) -> int:
        return int(conn.execute(f"SELECT count(*) FROM {INVOICES}").fetchone()[0])

    ran, value = backend.db_step(guard, key, f"probe-{next(_probe_names)}", count, ())
    assert ran
    return int(value)


# -- begin_operation (G4.2, G4.3) ---------------------------------------------------------------


def test_begin_operation_creates_the_record_and_claims_it(
    backend: Backend, clock: ControlledClock
) -> None:
    """G4.2: the first delivery creates the record as ``processing`` with attempt count 1."""
    guard = locked(backend, deliver(backend), "order:42", 30.0)
    operation = begin_operation(backend, guard, KEY, "order:42")
    assert operation is not None
    assert (operation.key, operation.status, operation.resource_key) == (
        KEY,
        OperationStatus.PROCESSING,
        "order:42",
    )
    assert (operation.attempts, operation.fence, operation.steps) == (1, lock_of(guard).fence, {})
    assert operation.created_at == clock()
    assert operation.completed_at is None
    assert backend.get_operation(KEY) == operation


def test_get_operation_of_an_unknown_key_is_none(backend: Backend) -> None:
    """Port contract: no record, no exception."""
    assert backend.get_operation("never-seen") is None


def test_a_completed_operation_is_returned_without_a_claim(
    backend: Backend, clock: ControlledClock
) -> None:
    """G4.3: a later delivery of a completed operation sees it done, claims nothing."""
    first = deliver(backend)
    assert begin_operation(backend, first, KEY, None) is not None
    backend.put_step(first, KEY, "render", '"pdf-1"')
    finish(
        backend, first, CLOSING, operation_key=KEY, result_json='{"ok": true}', external_ref="x-1"
    )
    completed = backend.get_operation(KEY)
    assert completed is not None
    assert completed.status == OperationStatus.COMPLETED
    assert (completed.result, completed.external_ref) == ({"ok": True}, "x-1")
    assert completed.completed_at == clock()

    clock.advance(5.0)
    second = deliver(backend)  # e.g. a replay, or the same key enqueued again
    seen = begin_operation(backend, second, KEY, None)
    assert seen == completed
    finish(backend, second, CLOSING, outcome=Outcome.ALREADY_PROCESSED)
    assert backend.get_operation(KEY) == completed
    assert backend.attempts(job_id=second.job_id)[0].outcome == Outcome.ALREADY_PROCESSED


def test_a_live_claim_by_another_delivery_makes_begin_return_none(backend: Backend) -> None:
    """G4.2: two live deliveries of one operation never both hold its claim (treat as busy)."""
    first = deliver(backend)
    assert begin_operation(backend, first, KEY, None) is not None
    second = deliver(backend)
    assert begin_operation(backend, second, KEY, None) is None
    with pytest.raises(LeaseLostError):
        backend.put_step(second, KEY, "render", "1")
    assert stored(backend).steps == {}


def test_the_claim_of_an_expired_delivery_can_be_taken_and_the_old_claimant_loses_its_writes(
    backend: Backend, clock: ControlledClock
) -> None:
    """G5.1, G2.4: a claimant whose lease expired gives way; its later step writes are refused."""
    slow = deliver(backend, visibility_timeout_s=5.0)
    assert begin_operation(backend, slow, KEY, None) is not None
    clock.advance(5.0)
    fresh = deliver(backend, visibility_timeout_s=60.0)
    taken = begin_operation(backend, fresh, KEY, None)
    assert taken is not None
    assert taken.status == OperationStatus.PROCESSING
    assert taken.attempts == 2
    with pytest.raises(LeaseLostError):
        backend.put_step(slow, KEY, "render", '"late"')
    backend.put_step(fresh, KEY, "render", '"fresh"')
    assert stored(backend).steps == {"render": "fresh"}


def test_begin_operation_is_refused_for_a_stale_lease_or_fence(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 2, G3.5: begin is a guarded write; nothing is created when refused."""
    stale_lease = deliver(backend, visibility_timeout_s=5.0)
    clock.advance(5.0)
    fetch(backend, ["default"], 10, "w2")  # redelivers it
    with pytest.raises(LeaseLostError):
        begin_operation(backend, stale_lease, KEY, None)
    stale_fence = locked(backend, deliver(backend, operation_key="op:b"), "order:b", 5.0)
    clock.advance(5.0)
    assert backend.acquire_lock("order:b", "newer", 5.0) is not None
    with pytest.raises(StaleFenceError):
        begin_operation(backend, stale_fence, "op:b", "order:b")
    assert backend.get_operation(KEY) is None
    assert backend.get_operation("op:b") is None


# -- finish, retry and bury on the operation record ---------------------------------------------


def test_finish_completes_operation_job_and_attempt_together_with_the_fence(
    backend: Backend,
) -> None:
    """Finish atomically: operation completed + job acked + attempt closed + unlock."""
    guard = locked(backend, deliver(backend), "order:42", 30.0)
    begin_operation(backend, guard, KEY, "order:42")
    finish(backend, guard, CLOSING, operation_key=KEY, result_json="[1, 2]")
    operation = backend.get_operation(KEY)
    assert operation is not None
    assert (operation.status, operation.result, operation.fence) == (
        OperationStatus.COMPLETED,
        [1, 2],
        lock_of(guard).fence,
    )
    assert backend.get_job(guard.job_id).status == JobStatus.COMPLETED
    (row,) = backend.attempts(job_id=guard.job_id)
    assert (row.outcome, row.lock_owner, row.fence) == (
        Outcome.COMPLETED,
        lock_of(guard).owner,
        lock_of(guard).fence,
    )
    assert backend.acquire_lock("order:42", "next", 5.0) is not None  # the lock was released


def test_finish_with_a_stale_fence_is_refused_and_changes_nothing(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 5, G3.5: a paused holder whose lock was re-granted cannot complete or ack."""
    guard = locked(backend, deliver(backend, visibility_timeout_s=60.0), "order:42", 5.0)
    begin_operation(backend, guard, KEY, "order:42")
    clock.advance(5.0)
    newer = backend.acquire_lock("order:42", "newer", 30.0)
    assert newer is not None
    job_before = backend.get_job(guard.job_id)
    attempts_before = backend.attempts(job_id=guard.job_id)
    operation_before = backend.get_operation(KEY)
    with pytest.raises(StaleFenceError):
        finish(backend, guard, CLOSING, operation_key=KEY, result_json='"stale"')
    assert backend.get_job(guard.job_id) == job_before
    assert backend.attempts(job_id=guard.job_id) == attempts_before
    assert backend.get_operation(KEY) == operation_before
    assert backend.acquire_lock("order:42", "third", 5.0) is None  # the newer grant still holds


def test_retry_gives_up_the_claim_but_keeps_the_operation_processing(backend: Backend) -> None:
    """G7.3: a retried delivery leaves its steps and lets the next delivery claim at once."""
    first = deliver(backend)
    begin_operation(backend, first, KEY, None)
    backend.put_step(first, KEY, "cut-stock", '{"left": 9}')
    retry(backend, first, CLOSING, delay_s=0.0, error=ERROR, operation_key=KEY)
    operation = backend.get_operation(KEY)
    assert operation is not None
    assert (operation.status, operation.last_error) == (
        OperationStatus.PROCESSING,
        "ConnectionError: reset",
    )
    second = guard_of(fetch(backend, ["default"], 1, "w2")[0])
    resumed = begin_operation(backend, second, KEY, None)
    assert resumed is not None
    assert resumed.steps == {"cut-stock": {"left": 9}}


def test_bury_marks_the_operation_failed(backend: Backend) -> None:
    """G4.2, G8.1: a dead job's operation records ``failed`` with the reason."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    bury(
        backend,
        guard,
        CLOSING,
        code=DeadCode.FATAL,
        reason="fatal error: bad card",
        error=ERROR,
        operation_key=KEY,
    )
    operation = backend.get_operation(KEY)
    assert operation is not None
    assert (operation.status, operation.last_error) == (
        OperationStatus.FAILED,
        "fatal error: bad card",
    )


def test_release_drops_the_claim_so_the_next_delivery_can_take_it(backend: Backend) -> None:
    """Invariant 9: a released delivery does not block its operation for the next worker."""
    first = deliver(backend)
    begin_operation(backend, first, KEY, None)
    assert release(backend, [first], [KEY]) == 1
    second = guard_of(fetch(backend, ["default"], 1, "w2")[0])
    assert begin_operation(backend, second, KEY, None) is not None


# -- steps (G5.1) -------------------------------------------------------------------------------


def test_put_step_records_a_step_that_the_next_delivery_sees(
    backend: Backend, clock: ControlledClock
) -> None:
    """G5.1: a recorded step is returned with the operation on every later claim."""
    first = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, first, KEY, None)
    backend.put_step(first, KEY, "render-pdf", '{"pages": 2}')
    assert stored(backend).steps == {"render-pdf": {"pages": 2}}
    clock.advance(5.0)
    (redelivered,) = fetch(backend, ["default"], 1, "w2")
    operation = begin_operation(backend, guard_of(redelivered), KEY, None)
    assert operation is not None
    assert operation.steps == {"render-pdf": {"pages": 2}}


StaleGuard = Callable[[Backend, ControlledClock], Guard]


def _stale_lease(backend: Backend, clock: ControlledClock) -> Guard:
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    clock.advance(5.0)
    fetch(backend, ["default"], 10, "w2")
    return guard


def _stale_fence(backend: Backend, clock: ControlledClock) -> Guard:
    guard = locked(backend, deliver(backend, visibility_timeout_s=60.0), "order:42", 5.0)
    begin_operation(backend, guard, KEY, "order:42")
    clock.advance(5.0)
    assert backend.acquire_lock("order:42", "newer", 30.0) is not None
    return guard


def _lost_claim(backend: Backend, clock: ControlledClock) -> Guard:
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    clock.advance(5.0)
    assert begin_operation(backend, deliver(backend, visibility_timeout_s=60.0), KEY, None)
    return guard


def _claim_taken_under_its_lease(backend: Backend, clock: ControlledClock) -> Guard:
    """The claim taken by another job of the operation while this delivery's job still holds
    its (expired) lease: no fetch took this job over, so only the claim proof can refuse it."""
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    clock.advance(5.0)
    other = backend.enqueue(make_spec(priority=10, visibility_timeout_s=60.0))
    (taken,) = fetch(backend, ["default"], 1, "w2")
    assert taken.job_id == other.id
    assert begin_operation(backend, guard_of(taken), KEY, None)
    return guard


STALE_GUARDS: dict[str, tuple[StaleGuard, type[GuardLost]]] = {
    "stale-lease": (_stale_lease, LeaseLostError),
    "stale-fence": (_stale_fence, StaleFenceError),
    "lost-claim": (_lost_claim, LeaseLostError),
    "claim-taken": (_claim_taken_under_its_lease, LeaseLostError),
}


@pytest.mark.parametrize("staleness", sorted(STALE_GUARDS))
def test_put_step_is_refused_for_a_stale_guard_and_records_nothing(
    backend: Backend, clock: ControlledClock, staleness: str
) -> None:
    """Invariants 2, 4, 5: a step write by a stale lease, fence or claim is refused."""
    make_stale, error = STALE_GUARDS[staleness]
    guard = make_stale(backend, clock)
    with pytest.raises(error):
        backend.put_step(guard, KEY, "render-pdf", '"stale"')
    assert "render-pdf" not in stored(backend).steps


@pytest.mark.parametrize("staleness", sorted(STALE_GUARDS))
def test_db_step_is_refused_for_a_stale_guard_without_running_fn(
    backend: Backend, clock: ControlledClock, staleness: str
) -> None:
    """Invariants 5, 10: a stale delivery's db_step neither runs its effect nor records it."""
    make_stale, error = STALE_GUARDS[staleness]
    guard = make_stale(backend, clock)
    calls: list[int] = []

    def effect(conn: Any) -> int:
        calls.append(1)
        return 1

    with pytest.raises(error):
        backend.db_step(guard, KEY, "cut-stock", effect, ())
    assert calls == []
    assert "cut-stock" not in stored(backend).steps


def test_db_step_runs_fn_once_and_returns_the_stored_result_afterwards(
    backend: Backend, clock: ControlledClock
) -> None:
    """G5.1, G4.5, G5.1: the effect and its step record commit once; a retry skips it."""
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    assert backend.db_step(guard, KEY, "schema", create_invoices, ()) == (True, "created")
    assert backend.db_step(guard, KEY, "invoice", insert_invoice, (42,)) == (
        True,
        {"invoice_for": 42},
    )
    clock.advance(5.0)
    (redelivered,) = fetch(backend, ["default"], 1, "w2")
    retry = guard_of(redelivered)
    operation = begin_operation(backend, retry, KEY, None)
    assert operation is not None
    assert operation.steps["invoice"] == {"invoice_for": 42}

    def must_not_run(conn: Any, order_id: int) -> None:
        raise AssertionError("a recorded db_step ran again")

    assert backend.db_step(retry, KEY, "invoice", must_not_run, (42,)) == (
        False,
        {"invoice_for": 42},
    )
    assert count_invoices(backend, retry) == 1


def test_db_step_that_raises_commits_neither_its_rows_nor_its_step_record(
    backend: Backend,
) -> None:
    """Invariant 10, G5.1: the caller gets fn's own exception; its writes are rolled back."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    backend.db_step(guard, KEY, "schema", create_invoices, ())

    def insert_then_fail(conn: Any, order_id: int) -> None:
        insert_invoice(conn, order_id)
        raise ConnectionError("mail server hung up")

    with pytest.raises(ConnectionError, match="hung up"):
        backend.db_step(guard, KEY, "invoice", insert_then_fail, (42,))
    assert "invoice" not in stored(backend).steps
    assert count_invoices(backend, guard) == 0
    # The failed step can run again, and then commits once.
    assert backend.db_step(guard, KEY, "invoice", insert_invoice, (42,))[0] is True
    assert count_invoices(backend, guard) == 1


def test_db_step_with_a_result_that_is_not_json_commits_nothing(backend: Backend) -> None:
    """Invariant 10: the step record must store the result, so an unstorable one undoes fn."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    backend.db_step(guard, KEY, "schema", create_invoices, ())

    def insert_returning_a_set(conn: Any, order_id: int) -> set[int]:
        insert_invoice(conn, order_id)
        return {order_id}

    with pytest.raises(TypeError):
        backend.db_step(guard, KEY, "invoice", insert_returning_a_set, (42,))
    assert "invoice" not in stored(backend).steps
    assert count_invoices(backend, guard) == 0


ENDING_STATEMENTS = [
    "COMMIT",
    "ROLLBACK",
    "BEGIN",
    "/* c */ COMMIT",
    "/* a /* nested */ comment */ commit",
    "-- a line comment\nCOMMIT",
    "  ; ;COMMIT",
    "\tEnd",
    "ABORT",
    "PREPARE TRANSACTION 'step'",
    "SAVEPOINT mine",
    "COMMIT AND CHAIN",
    "INSERT INTO {invoices} (order_id) VALUES (7); COMMIT; BEGIN",
    "INSERT INTO {invoices} (order_id) VALUES (7); COMMIT",
    "SELECT 1; ROLLBACK",
]


@pytest.mark.parametrize("statement", ENDING_STATEMENTS)
@pytest.mark.parametrize("many", [False, True])
def test_db_step_fn_cannot_end_the_step_transaction(
    backend: Backend, statement: str, many: bool
) -> None:
    """Invariant 10: fn may not commit (or roll back) on its own, whatever the SQL text looks
    like (comments, several statements in one text); its rows commit only with the step
    record, so an attempt to end the transaction fails the step and commits nothing."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    backend.db_step(guard, KEY, "schema", create_invoices, ())
    text = statement.format(invoices=INVOICES)

    def insert_then_end_transaction(conn: Any, order_id: int) -> None:
        insert_invoice(conn, order_id)
        if many:
            conn.executemany(text, [()])
        else:
            conn.execute(text)
        raise ConnectionError("crashed after the early commit")

    with pytest.raises(StepSQLError):
        backend.db_step(guard, KEY, "invoice", insert_then_end_transaction, (42,))
    assert "invoice" not in stored(backend).steps
    assert count_invoices(backend, guard) == 0
    assert backend.db_step(guard, KEY, "invoice", insert_invoice, (42,))[0] is True


def test_db_step_business_unique_constraint_rejects_a_second_invoice(backend: Backend) -> None:
    """G4.5: a one-per-order constraint stops a second invoice even under another step name."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    backend.db_step(guard, KEY, "schema", create_invoices, ())
    backend.db_step(guard, KEY, "invoice", insert_invoice, (42,))
    with pytest.raises(Exception, match=r"(?i)unique|primary|constraint"):
        backend.db_step(guard, KEY, "invoice-again", insert_invoice, (42,))
    assert "invoice-again" not in stored(backend).steps
    assert count_invoices(backend, guard) == 1


# -- begin: lock + claim together (the guarded pipeline) ------------------------------------


def request(**changes: Any) -> BeginRequest:
    """Lock ``order:42`` for 30 s and claim ``KEY``, unless changed."""
    fields: dict[str, Any] = {
        "resource_key": "order:42",
        "lock_owner": "w1/a",
        "lock_ttl_s": 30.0,
        "operation_key": KEY,
    }
    fields.update(changes)
    return BeginRequest(**fields)


def test_begin_grants_the_lock_and_claims_the_operation_in_one_call(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.1, G4.2: the grant's fence is on the attempt row and on the claimed operation."""
    guard = deliver(backend)
    begun = backend.begin(guard, request())
    assert begun.busy is None
    assert begun.grant == LockGrant("order:42", "w1/a", 1, clock() + 30.0)
    assert begun.operation is not None
    assert (begun.operation.status, begun.operation.fence) == (OperationStatus.PROCESSING, 1)
    (row,) = backend.attempts(job_id=guard.job_id)
    assert (row.lock_owner, row.fence) == ("w1/a", 1)
    assert backend.acquire_lock("order:42", "other", 5.0) is None


def test_begin_with_neither_lock_nor_operation_holds_nothing(backend: Backend) -> None:
    """A plain task: begin only checks the lease."""
    begun = backend.begin(deliver(backend, operation_key=None), BeginRequest())
    assert (begun.grant, begun.operation, begun.busy) == (None, None, None)


def test_begin_on_a_busy_resource_is_busy_and_claims_nothing(backend: Backend) -> None:
    """G3.4: lock busy means the job waits; no operation record is created meanwhile."""
    assert backend.acquire_lock("order:42", "someone", 30.0) is not None
    begun = backend.begin(deliver(backend), request())
    assert begun.busy is BusyReason.LOCK
    assert (begun.grant, begun.operation) == (None, None)
    assert backend.get_operation(KEY) is None


def test_begin_on_an_operation_claimed_elsewhere_is_busy_and_keeps_no_lock(
    backend: Backend,
) -> None:
    """Port contract: both hold or neither is kept; the lock taken for nothing is given back."""
    first = deliver(backend)
    assert backend.begin(first, request(resource_key="order:1", lock_owner="w1/a")).busy is None
    second = deliver(backend)
    begun = backend.begin(second, request(resource_key="order:2", lock_owner="w2/b"))
    assert begun.busy is BusyReason.OPERATION
    assert (begun.grant, begun.operation) == (None, None)
    assert backend.acquire_lock("order:2", "third", 5.0) is not None
    # The attempt log does not claim a lock this delivery gave straight back (G10.1).
    (attempt,) = backend.attempts(job_id=second.job_id)
    assert (attempt.lock_owner, attempt.fence) == (None, None)


def test_begin_of_a_completed_operation_returns_it_without_a_claim(backend: Backend) -> None:
    """G4.3: an already-processed operation comes back completed and unclaimed."""
    first = deliver(backend)
    locked_first = replace(first, lock=backend.begin(first, request()).grant)
    finish(backend, locked_first, CLOSING, operation_key=KEY, result_json='"done"')
    completed = stored(backend)
    again = backend.begin(deliver(backend), request(lock_owner="w2/b"))
    assert again.busy is None
    assert again.operation == completed
    assert stored(backend) == completed


def test_begin_with_a_stale_lease_is_refused_and_takes_no_lock(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 2: a redelivered lease cannot lock or claim; the fence counter is untouched."""
    stale = deliver(backend, visibility_timeout_s=5.0)
    clock.advance(5.0)
    fetch(backend, ["default"], 10, "w2")
    with pytest.raises(LeaseLostError):
        backend.begin(stale, request())
    assert backend.lock_fence("order:42") == 0
    assert backend.get_operation(KEY) is None


def test_fetch_prepared_begins_each_fetched_delivery_in_lock_order(backend: Backend) -> None:
    """Port contract: each delivery of a task in the rules gets its lock (an owner token of
    its own, the rule's length) and its claim, in the fetch's transaction; a later item of the
    batch finds the lock an earlier one took busy, and nothing is kept for it; a delivery asking
    for nothing, or of a task the rules do not name, is fetched unbegun."""
    plain = backend.enqueue(make_spec(operation_key=None))
    fresh = backend.enqueue(make_spec(operation_key="op:fresh", resource_key="r:shared"))
    busy = backend.enqueue(make_spec(operation_key="op:busy", resource_key="r:shared"))
    stranger = backend.enqueue(
        replace(make_spec(operation_key="op:stranger", resource_key="r:x"), task="tests.other")
    )
    rules = {make_spec().task: DeliveryRules(None, 3, lock_ttl_s=12.0)}

    prepared = {
        item.delivery.job_id: item for item in backend.fetch_prepared(["default"], 10, "w1", rules)
    }
    assert set(prepared) == {plain.id, fresh.id, busy.id, stranger.id}
    assert prepared[plain.id].request is None
    assert prepared[plain.id].begun is None
    assert prepared[stranger.id].begun is None
    assert backend.lock_fence("r:x") == 0
    got = prepared[fresh.id].begun
    assert got is not None
    assert got.busy is None
    assert got.grant is not None
    assert got.grant.owner.startswith("w1/")
    assert got.grant.expires_at == pytest.approx(backend.now() + 12.0, abs=1.0)
    assert got.operation is not None
    assert prepared[busy.id].begun == Begun(busy=BusyReason.LOCK)
    asked = prepared[busy.id].request
    assert asked is not None
    assert asked.lock_owner.startswith("w1/")
    assert asked.lock_owner != got.grant.owner
    assert backend.lock_fence("r:shared") == got.grant.fence == 1
    assert backend.get_operation("op:busy") is None
    assert stored(backend, "op:fresh").status == OperationStatus.PROCESSING
    # The grant is the delivery's: its fence proves the delivery's writes.
    guard = Guard(
        fresh.id,
        prepared[fresh.id].delivery.lease_token,
        prepared[fresh.id].delivery.attempt_id,
        got.grant,
    )
    backend.put_step(guard, "op:fresh", "one", "1")
    assert stored(backend, "op:fresh").steps == {"one": 1}


def test_an_error_of_the_steps_own_sql_reaches_the_handler_as_step_sql_error(
    backend: Backend,
) -> None:
    """Every backend raises one jobguard type for a failing statement of a db_step function,
    wrapping the driver's own error; nothing of the step commits."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    backend.db_step(guard, KEY, "schema", create_invoices, ())
    backend.db_step(guard, KEY, "first", insert_invoice, (7,))

    def insert_twice(conn: Any, order_id: int) -> None:
        insert_invoice(conn, order_id + 1)
        insert_invoice(conn, order_id)  # the primary key refuses it

    with pytest.raises(StepSQLError) as caught:
        backend.db_step(guard, KEY, "second", insert_twice, (7,))
    assert caught.value.__cause__ is not None
    assert type(caught.value.__cause__).__module__.split(".")[0] in ("sqlite3", "psycopg")
    assert count_invoices(backend, guard) == 1  # order 8 rolled back with the failed step
    operation = backend.get_operation(KEY)
    assert operation is not None
    assert "second" not in operation.steps

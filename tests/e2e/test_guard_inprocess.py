"""The guard layer in one process: ``app.lock()``, ``app.operation()`` and step memoisation.

Real store (a SQLite file per test), real mail service over HTTP, real worker (``drain``); the
multi-process fault versions live in ``tests/chaos/test_guard_faults.py``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App, Context, JobStatus, LockBusyError, OperationStatus, Outcome
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.context import InFlight
from jobguard.demo.mailserver import MailServer
from jobguard.hooks import Hooks
from jobguard.pipeline import Pipeline, guard_of
from jobguard.testing import drain
from tests.support import guard_app
from tests.support.guard_app import FULFILL, FULFILL_STEPS, Faults, query, read_events
from tests.support.ports import fetch
from tests.support.procs import wait_until

SKU = "widget"
STOCK = 100


@pytest.fixture
def mail() -> Iterator[MailServer]:
    """The local mail service honouring ``Idempotency-Key``."""
    with MailServer() as server:
        yield server


def fulfillment_app(store_url: str, mail: MailServer, faults: Faults | None = None) -> App:
    """The fulfillment app with one stocked product in the store's file."""
    guard_app.create_business_tables(store_url, {SKU: STOCK})
    return guard_app.make_app(store_url, faults=faults or Faults(), mail_url=mail.url)


def stock(store_url: str) -> int:
    return int(query(store_url, "SELECT stock FROM {products} WHERE sku = ?", [SKU])[0][0])


def test_operation_record_reports_completed_fulfillment(store_url: str, mail: MailServer) -> None:
    """``app.operation(key)`` returns status, result, external ref, attempts, fence and steps.

    G4.2; an unknown key gives ``None``.
    """
    app = fulfillment_app(store_url, mail)
    try:
        job = app.tasks[FULFILL].enqueue(order_id=42, sku=SKU)
        assert drain(app, timeout_s=30)[JobStatus.COMPLETED] == 1

        operation = app.operation("fulfill-order:42")
        assert operation is not None
        assert operation.status == OperationStatus.COMPLETED
        assert operation.result == {"invoice_id": 1, "message_id": "msg-1"}
        assert operation.external_ref == "msg-1"
        assert operation.attempts == 1
        [attempt] = app.attempts(job_id=job.id)
        assert attempt.outcome == Outcome.COMPLETED
        assert attempt.fence is not None
        assert operation.fence == attempt.fence
        assert attempt.lock_owner is not None
        assert set(operation.steps) == set(FULFILL_STEPS)
        assert operation.steps["cut-stock"] == STOCK - 1
        assert operation.steps["email"] == "msg-1"
        assert app.operation("fulfill-order:43") is None
    finally:
        app.close()


def test_failed_db_step_rolls_back_its_business_rows_and_reruns_once(
    store_url: str, mail: MailServer
) -> None:
    """A ``db_step`` whose function raised after writing leaves no row and no step record.

    Invariant 10, G5.1 "a step that raised is not recorded as done", G4.5: the retry skips the
    committed step (cut stock), reruns the failed one (invoice) and the invoice exists once.
    """
    faults = Faults(raise_points=("invoice-inserted",), attempts=(1,))
    app = fulfillment_app(store_url, mail, faults)
    try:
        job = app.tasks[FULFILL].enqueue(order_id=7, sku=SKU)
        drain(app, timeout_s=30)

        assert app.get_job(job.id).status == JobStatus.COMPLETED
        first, second = app.attempts(job_id=job.id)
        assert (first.outcome, first.steps_run, first.error_type) == (
            Outcome.RETRY,
            1,
            "InjectedFault",
        )
        assert (second.outcome, second.steps_skipped, second.steps_run) == (
            Outcome.COMPLETED,
            1,
            2,
        )
        kinds = [event.kind for event in read_events(store_url)]
        assert kinds.count("ran:invoice") == 2  # the function ran twice...
        assert query(store_url, "SELECT count(*) FROM {invoices} WHERE order_id = 7") == [(1,)]
        assert kinds.count("ran:cut-stock") == 1  # ...but the committed step did not
        assert stock(store_url) == STOCK - 1
        assert len(mail.sent) == 1
    finally:
        app.close()


def test_step_that_raised_is_retried_with_the_same_idempotency_key(
    store_url: str, mail: MailServer
) -> None:
    """An email step that raised after the service sent the mail is not recorded; its retry
    calls again with the same ``Idempotency-Key`` and the service sends nothing more.

    G5.1, G4.4 (the key is stable across attempts), the demo "zero double emails".
    """
    faults = Faults(raise_points=("email-sent",), attempts=(1,))
    app = fulfillment_app(store_url, mail, faults)
    try:
        job = app.tasks[FULFILL].enqueue(order_id=8, sku=SKU)
        drain(app, timeout_s=30)

        assert app.get_job(job.id).status == JobStatus.COMPLETED
        keys = [request["key"] for request in mail.requests]
        assert len(keys) == 2
        assert keys[0] == keys[1]
        assert [request["applied"] for request in mail.requests] == [True, False]
        assert len(mail.sent) == 1
        operation = app.operation("fulfill-order:8")
        assert operation is not None
        assert operation.external_ref == mail.sent[0]["message_id"]
    finally:
        app.close()


def test_app_lock_busy_raises_and_fences_increase(app: App) -> None:
    """A held lock refuses a second owner with ``LockBusyError``; each grant's fence is larger.

    G3.1, G3.2, G3.5: a standalone ``app.lock(resource, ttl_s=…)``.
    """
    with app.lock("order:42", ttl_s=30) as first:
        with pytest.raises(LockBusyError) as busy, app.lock("order:42", ttl_s=30):
            pytest.fail("a second owner entered a held lock")
        assert busy.value.resource == "order:42"
        with app.lock("order:43", ttl_s=30) as other:  # another resource has its own lock
            assert other.fence == 1
    fences = [first.fence]
    owners = {first.owner}
    for _ in range(3):
        with app.lock("order:42", ttl_s=30) as grant:
            fences.append(grant.fence)
            owners.add(grant.owner)
    assert fences == [1, 2, 3, 4]
    assert len(owners) == 4


def test_app_lock_is_renewed_while_held(app: App) -> None:
    """A lock held past twice its TTL is still ours: the renewer keeps extending it.

    G3.3; the next grant after release continues the fence sequence.
    """
    with app.lock("order:42", ttl_s=1.0) as grant:
        past_ttl = grant.expires_at + 1.0
        wait_until(lambda: time.time() > past_ttl, timeout_s=10)
        assert app.backend.acquire_lock("order:42", "intruder", 1.0) is None
        with pytest.raises(LockBusyError), app.lock("order:42", ttl_s=1.0):
            pytest.fail("the renewed lock was granted to someone else")
    with app.lock("order:42", ttl_s=1.0) as after:
        assert after.fence == grant.fence + 1


def test_app_lock_without_renewal_expires_and_the_old_owner_cannot_touch_the_new_grant(
    app: App,
) -> None:
    """Without renewal the TTL ends the lock: a new owner gets a higher fence, and the old
    owner can neither renew nor release the new owner's lock.

    G3.2 (release and extend only by the owner), G3.5; also shows the renewal test above can
    fail (a lock that is not renewed does expire).
    """
    with app.lock("order:42", ttl_s=0.3, renew=False) as old:
        wait_until(lambda: time.time() > old.expires_at + 0.05, timeout_s=10)
        with app.lock("order:42", ttl_s=30) as new:
            assert new.fence == old.fence + 1
            assert app.backend.renew_lock(old, 30) is False
            assert app.backend.release_lock(old) is False
            assert app.backend.acquire_lock("order:42", "third", 30) is None
    assert app.backend.lock_fence("order:42") == old.fence + 1


def test_an_error_in_the_locked_block_is_not_hidden_by_a_failed_release(tmp_path: Path) -> None:
    """If the store is locked when ``app.lock`` releases, the caller still sees its own error
    (the lock simply expires at its TTL)."""
    db = tmp_path / "locked.db"
    app = App(backend=SQLiteBackend(str(db), busy_timeout_s=0.2))
    blocker = sqlite3.connect(db, isolation_level=None)

    def work_while_the_store_gets_locked() -> None:
        with app.lock("order:7", ttl_s=5):
            blocker.execute("BEGIN IMMEDIATE")  # every writer now times out, the release too
            raise ValueError("from the block")

    try:
        with pytest.raises(ValueError, match="from the block"):
            work_while_the_store_gets_locked()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        app.close()
    assert app.backend.lock_fence("order:7") == 1


def test_a_delivery_not_prepared_with_its_batch_locks_and_claims_on_its_own(app: App) -> None:
    """When the batched lock-and-claim of a fetch failed, the pipeline takes them itself."""

    @app.task(operation_key="ship:{order_id}", resource_key="order:{order_id}")
    def ship(ctx: Context, order_id: int) -> int:
        assert ctx.fence is not None
        return ctx.fence

    ship.enqueue(order_id=3)
    (delivery,) = fetch(app.backend, ["default"], 1, "w1")
    inflight = InFlight(delivery, guard_of(delivery), None)
    pipeline = Pipeline(app.backend, app.tasks, "w1", Hooks())
    ending = pipeline.run(inflight)
    assert ending.outcome == Outcome.COMPLETED
    assert app.backend.settle([ending]) == [None]
    operation = app.operation("ship:3")
    assert operation is not None
    assert (operation.status, operation.result) == (OperationStatus.COMPLETED, 1)
    (attempt,) = app.attempts(job_id=delivery.job_id)
    assert attempt.fence == 1

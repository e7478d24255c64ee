"""Conformance tests of the queue port: enqueue, dedup, fetch, leases and the dead letter queue.

Every test runs against every backend in ``conftest.BACKENDS`` with a :class:`ControlledClock`
(). Time only moves when a test advances it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobguard.backends.base import (
    Backend,
    Closing,
    DeliveryRules,
    ErrorInfo,
    Renewal,
)
from jobguard.exceptions import (
    DuplicateJobError,
    JobGuardError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
)
from jobguard.models import DeadCode, Guard, Job, JobSpec, JobStatus, OperationStatus, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import (
    begin_operation,
    bury,
    defer,
    fetch,
    fetch_one,
    finish,
    guard_of,
    locked_delivery,
    record_refusal,
    release,
    retry,
    success,
)

CLOSING = Closing(duration_s=0.25)
ERROR = ErrorInfo(type="TimeoutError", message="upstream slow", traceback="tb", signature="s1")


def make_spec(**changes: Any) -> JobSpec:
    """A job spec with test defaults: queue ``default``, 3 attempts, 30 s lease."""
    fields: dict[str, Any] = {
        "task": "tests.noop",
        "queue": "default",
        "payload": '{"n":1}',
        "max_attempts": 3,
        "visibility_timeout_s": 30.0,
    }
    fields.update(changes)
    return JobSpec(**fields)


def snapshot(backend: Backend, job_id: int) -> tuple[Job, list[Any]]:
    """Everything a refused write must leave untouched: the job and its attempt rows."""
    return backend.get_job(job_id), backend.attempts(job_id=job_id)


# -- enqueue and dedup (G6) ---------------------------------------------------------------------


def test_enqueue_stores_a_queued_job_with_every_field_of_its_spec(
    backend: Backend, clock: ControlledClock
) -> None:
    """G1.1: a stored job is queued, uncharged, and keeps its spec (payload, keys, limits)."""
    spec = make_spec(
        queue="mail",
        priority=4,
        max_attempts=7,
        visibility_timeout_s=12.0,
        operation_key="op:1",
        resource_key="res:1",
        lock_ttl_s=9.0,
        dedup_key="dd:1",
    )
    job = backend.enqueue(spec)
    assert job.deduplicated is False
    assert job.status == JobStatus.QUEUED
    assert (job.attempts, job.deferrals) == (0, 0)
    assert (job.task, job.queue, job.payload, job.priority) == ("tests.noop", "mail", '{"n":1}', 4)
    assert (job.max_attempts, job.visibility_timeout_s, job.lock_ttl_s) == (7, 12.0, 9.0)
    assert (job.operation_key, job.resource_key, job.dedup_key) == ("op:1", "res:1", "dd:1")
    assert job.created_at == clock()
    assert job.run_at == clock()
    assert job.finished_at is None
    assert backend.get_job(job.id) == job


def test_dedup_key_returns_the_existing_job_while_it_is_queued_or_running(
    backend: Backend,
) -> None:
    """G6.1, G6.2, G6.1: a duplicate inside the live window returns the first job."""
    first = backend.enqueue(make_spec(dedup_key="click:1", payload='{"n":1}'))
    again = backend.enqueue(make_spec(dedup_key="click:1", payload='{"n":2}'))
    assert again.id == first.id
    assert again.deduplicated is True
    assert again.payload == '{"n":1}'  # the duplicate does not overwrite the stored job
    fetch_one(backend)
    while_running = backend.enqueue(make_spec(dedup_key="click:1"))
    assert while_running.id == first.id
    assert while_running.deduplicated is True
    assert while_running.status == JobStatus.RUNNING
    assert sum(backend.count_jobs().values()) == 1


def test_dedup_key_is_free_once_the_job_completed_without_a_window(backend: Backend) -> None:
    """G6.2: with ``dedup_window_s=0`` the key is held only while the job is pending or running."""
    first = backend.enqueue(make_spec(dedup_key="k"))
    finish(backend, guard_of(fetch_one(backend)), CLOSING)
    second = backend.enqueue(make_spec(dedup_key="k"))
    assert second.id != first.id
    assert second.deduplicated is False


def test_dedup_window_holds_the_key_for_n_seconds_after_completion_then_frees_it(
    backend: Backend, clock: ControlledClock
) -> None:
    """G6.2: ``dedup_window_s=60`` keeps returning the completed job for 60 s, then not."""
    first = backend.enqueue(make_spec(dedup_key="hook:7", dedup_window_s=60.0))
    finish(backend, guard_of(fetch_one(backend)), CLOSING)
    clock.advance(59.0)
    inside = backend.enqueue(make_spec(dedup_key="hook:7", dedup_window_s=60.0))
    assert inside.id == first.id
    assert inside.deduplicated is True
    assert inside.status == JobStatus.COMPLETED
    clock.advance(1.0)
    after = backend.enqueue(make_spec(dedup_key="hook:7", dedup_window_s=60.0))
    assert after.id != first.id
    assert after.deduplicated is False


def test_a_dead_job_does_not_hold_its_dedup_key(backend: Backend) -> None:
    """G6.2: a job in the dead letter queue is not a live duplicate; a new enqueue is stored."""
    first = backend.enqueue(make_spec(dedup_key="k", dedup_window_s=600.0))
    bury(
        backend,
        guard_of(fetch_one(backend)),
        CLOSING,
        code=DeadCode.FATAL,
        reason="fatal",
        error=ERROR,
    )
    second = backend.enqueue(make_spec(dedup_key="k", dedup_window_s=600.0))
    assert second.id != first.id
    assert second.deduplicated is False


def test_enqueue_many_stores_each_job_and_deduplicates_within_the_batch(backend: Backend) -> None:
    """G6.1: a batch enqueue dedups against stored jobs and against earlier specs in the batch."""
    stored = backend.enqueue(make_spec(dedup_key="old"))
    jobs = backend.enqueue_many(
        [make_spec(dedup_key="new"), make_spec(dedup_key="new"), make_spec(dedup_key="old")]
    )
    assert [job.deduplicated for job in jobs] == [False, True, True]
    assert jobs[1].id == jobs[0].id
    assert jobs[2].id == stored.id
    assert backend.count_jobs()[JobStatus.QUEUED] == 2


def test_enqueue_many_is_all_or_nothing(backend: Backend) -> None:
    """Port docstring: a batch the store refuses in part stores nothing."""
    broken = make_spec(queue=None)  # violates the store's schema, so the batch must fail
    with pytest.raises(JobGuardError):
        backend.enqueue_many([make_spec(), broken])
    assert sum(backend.count_jobs().values()) == 0


def test_delay_s_keeps_a_job_from_being_fetched_until_it_is_due(
    backend: Backend, clock: ControlledClock
) -> None:
    """G7.2 (scheduling): a job enqueued with ``delay_s=10`` is invisible for 10 s."""
    job = backend.enqueue(make_spec(delay_s=10.0))
    assert job.run_at == clock() + 10.0
    clock.advance(9.5)
    assert fetch(backend, ["default"], 10, "w1") == []
    clock.advance(0.5)
    assert fetch_one(backend).job_id == job.id


# -- fetch and leases (G1, G2) ------------------------------------------------------------------


def test_fetch_takes_earlier_queues_first(backend: Backend) -> None:
    """G2.3: with several queues, the first named queue is drained first."""
    late = backend.enqueue(make_spec(queue="slow"))
    early = backend.enqueue(make_spec(queue="fast"))
    assert fetch_one(backend, ["fast", "slow"]).job_id == early.id
    assert fetch_one(backend, ["fast", "slow"]).job_id == late.id


def test_fetch_takes_higher_priority_first_then_oldest(backend: Backend) -> None:
    """Port contract: within a queue, higher priority first; equal priority in enqueue order."""
    low = backend.enqueue(make_spec(priority=0))
    high = backend.enqueue(make_spec(priority=9))
    mid_a = backend.enqueue(make_spec(priority=5))
    mid_b = backend.enqueue(make_spec(priority=5))
    found = fetch(backend, ["default"], 10, "w1")
    assert [d.job_id for d in found] == [high.id, mid_a.id, mid_b.id, low.id]


def test_fetch_honours_the_limit_and_only_the_named_queues(backend: Backend) -> None:
    """Port contract: ``fetch`` leases at most ``limit`` jobs and none from other queues."""
    for _ in range(3):
        backend.enqueue(make_spec())
    other = backend.enqueue(make_spec(queue="other"))
    assert len(fetch(backend, ["default"], 2, "w1")) == 2
    assert len(fetch(backend, ["default"], 5, "w1")) == 1
    assert fetch(backend, ["default"], 5, "w1") == []
    assert backend.get_job(other.id).status == JobStatus.QUEUED


def test_fetch_charges_the_attempt_at_delivery_and_opens_an_attempt_row(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 7, G2.1: delivery counts the attempt, leases for the visibility timeout."""
    job = backend.enqueue(make_spec(visibility_timeout_s=20.0))
    delivery = fetch_one(backend, worker="worker-a")
    assert (delivery.job_id, delivery.attempt, delivery.max_attempts) == (job.id, 1, 3)
    assert delivery.lease_expires_at == clock() + 20.0
    stored = backend.get_job(job.id)
    assert stored.status == JobStatus.RUNNING
    assert stored.attempts == 1
    (row,) = backend.attempts(job_id=job.id)
    assert row.id == delivery.attempt_id
    assert (row.outcome, row.lease_token, row.worker_id) == (
        Outcome.RUNNING,
        delivery.lease_token,
        "worker-a",
    )


def test_a_leased_job_is_not_delivered_again_while_its_lease_lives(
    backend: Backend, clock: ControlledClock
) -> None:
    """G2.1: the lease hides the job from other workers until it expires."""
    backend.enqueue(make_spec(visibility_timeout_s=30.0))
    fetch_one(backend, worker="w1")
    clock.advance(29.5)
    assert fetch(backend, ["default"], 10, "w2") == []


def test_an_expired_lease_is_redelivered_with_a_new_token_and_the_old_attempt_closed_lost(
    backend: Backend, clock: ControlledClock
) -> None:
    """G1.1, G2.4: after expiry the job is delivered again; the silent delivery is ``lost``."""
    job = backend.enqueue(make_spec(visibility_timeout_s=30.0))
    first = fetch_one(backend, worker="w1")
    clock.advance(30.0)
    second = fetch_one(backend, worker="w2")
    assert second.job_id == job.id
    assert second.lease_token != first.lease_token
    assert second.attempt == 2
    assert second.attempt_id != first.attempt_id
    old, new = backend.attempts(job_id=job.id)
    assert (old.outcome, old.ended_at) == (Outcome.LOST, clock())
    assert (new.outcome, new.worker_id) == (Outcome.RUNNING, "w2")


def test_a_job_whose_last_allowed_delivery_expired_goes_dead_with_a_reason(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 7, G8.2: a job that kills its worker every time still reaches the DLQ."""
    job = backend.enqueue(make_spec(max_attempts=2, visibility_timeout_s=5.0))
    fetch_one(backend)
    clock.advance(5.0)
    fetch_one(backend)
    clock.advance(5.0)
    assert fetch(backend, ["default"], 10, "w1") == []
    dead = backend.get_job(job.id)
    assert dead.status == JobStatus.DEAD
    assert dead.attempts == 2
    assert dead.dead_reason
    assert "attempts" in dead.dead_reason
    assert [a.outcome for a in backend.attempts(job_id=job.id)] == [Outcome.LOST, Outcome.LOST]
    assert [j.id for j in backend.dead_jobs()] == [job.id]


# -- renew (G2.2, G3.3) -------------------------------------------------------------------------


def test_renew_extends_the_lease_and_the_lock_of_a_current_delivery(
    backend: Backend, clock: ControlledClock
) -> None:
    """G2.2, G3.3: a heartbeat keeps both the lease and the lock beyond their first expiry."""
    backend.enqueue(make_spec(visibility_timeout_s=10.0, resource_key="r", lock_ttl_s=10.0))
    delivery = fetch_one(backend)
    grant = backend.acquire_lock("r", "owner-1", 10.0, attempt_id=delivery.attempt_id)
    assert grant is not None
    guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id, grant)
    for _ in range(3):  # 24 s in total under 10 s timeouts
        clock.advance(8.0)
        (result,) = backend.renew([Renewal(guard, 10.0, 10.0)])
        assert (result.lease_ok, result.lock_ok) == (True, True)
    clock.advance(9.5)
    assert fetch(backend, ["default"], 10, "w2") == []
    assert backend.acquire_lock("r", "owner-2", 10.0) is None


def test_renew_reports_a_stale_lease_and_a_stale_lock_as_not_ok_and_extends_neither(
    backend: Backend, clock: ControlledClock
) -> None:
    """G2.4, G3.2: a superseded delivery or lock grant cannot be extended; per-item results."""
    backend.enqueue(make_spec(visibility_timeout_s=10.0))
    stale = fetch_one(backend, worker="w1")
    clock.advance(10.0)
    current = fetch_one(backend, worker="w2")
    old_grant = backend.acquire_lock("r", "old", 5.0)
    assert old_grant is not None
    clock.advance(5.0)
    new_grant = backend.acquire_lock("r", "new", 5.0)
    assert new_grant is not None
    stale_guard = Guard(stale.job_id, stale.lease_token, stale.attempt_id, old_grant)
    current_guard = Guard(current.job_id, current.lease_token, current.attempt_id)
    results = backend.renew([Renewal(stale_guard, 60.0, 60.0), Renewal(current_guard, 10.0, None)])
    assert [(r.lease_ok, r.lock_ok) for r in results] == [(False, False), (True, True)]
    # Neither the stale lease nor the stale lock stretched the current holders' deadlines.
    clock.advance(10.0)
    assert [d.job_id for d in fetch(backend, ["default"], 10, "w3")] == [current.job_id]
    assert backend.acquire_lock("r", "third", 5.0) is not None


# -- writes with a stale lease (G2.4) ----------------------------------------------------

StaleWrite = Callable[[Backend, Guard], object]

STALE_WRITES: dict[str, StaleWrite] = {
    "finish": lambda b, g: finish(b, g, CLOSING, operation_key="op", result_json="1"),
    "retry": lambda b, g: retry(b, g, CLOSING, delay_s=1.0, error=ERROR, operation_key="op"),
    "defer": lambda b, g: defer(b, g, CLOSING, delay_s=1.0, reason="busy"),
    "bury": lambda b, g: bury(
        b, g, CLOSING, code=DeadCode.FATAL, reason="fatal", error=ERROR, operation_key="op"
    ),
}


@pytest.mark.parametrize("write", sorted(STALE_WRITES))
def test_a_write_with_a_redelivered_lease_is_refused_and_changes_nothing(
    backend: Backend, clock: ControlledClock, write: str
) -> None:
    """Invariant 2, G2.4: finish/retry/defer/bury with a superseded lease raise LeaseLostError."""
    job = backend.enqueue(make_spec(visibility_timeout_s=10.0, operation_key="op"))
    stale = fetch_one(backend, worker="w1")
    clock.advance(10.0)
    current = fetch_one(backend, worker="w2")
    assert begin_operation(backend, guard_of(current), "op", None) is not None
    before = snapshot(backend, job.id), backend.get_operation("op")
    with pytest.raises(LeaseLostError):
        STALE_WRITES[write](backend, guard_of(stale))
    assert (snapshot(backend, job.id), backend.get_operation("op")) == before
    # The current delivery still owns the job and can finish it.
    finish(backend, guard_of(current), CLOSING, operation_key="op", result_json="1")
    assert backend.get_job(job.id).status == JobStatus.COMPLETED


@pytest.mark.parametrize("write", sorted(STALE_WRITES))
def test_a_second_write_after_the_delivery_settled_is_refused(backend: Backend, write: str) -> None:
    """Invariant 2: once finished, the same lease cannot ack, retry, defer or bury again."""
    job = backend.enqueue(make_spec())
    delivery = fetch_one(backend)
    finish(backend, guard_of(delivery), CLOSING)
    before = snapshot(backend, job.id)
    with pytest.raises(LeaseLostError):
        STALE_WRITES[write](backend, guard_of(delivery))
    assert snapshot(backend, job.id) == before


def test_release_skips_a_stale_lease_and_changes_nothing(
    backend: Backend, clock: ControlledClock
) -> None:
    """Invariant 2: ``release`` of a superseded lease releases nothing (0) and is not an error."""
    job = backend.enqueue(make_spec(visibility_timeout_s=10.0))
    stale = fetch_one(backend)
    clock.advance(10.0)
    fetch_one(backend)
    before = snapshot(backend, job.id)
    assert release(backend, [guard_of(stale)]) == 0
    assert snapshot(backend, job.id) == before


# -- the settling writes ------------------------------------------------------------------------


def test_finish_completes_the_job_and_closes_its_attempt(
    backend: Backend, clock: ControlledClock
) -> None:
    """G1.2: the job is acked only by the call that stores its final state."""
    job = backend.enqueue(make_spec())
    delivery = fetch_one(backend)
    clock.advance(2.0)
    finish(backend, guard_of(delivery), CLOSING)
    done = backend.get_job(job.id)
    assert (done.status, done.finished_at, done.attempts) == (JobStatus.COMPLETED, clock(), 1)
    (row,) = backend.attempts(job_id=job.id)
    assert (row.outcome, row.ended_at, row.duration_s) == (Outcome.COMPLETED, clock(), 0.25)
    assert fetch(backend, ["default"], 10, "w1") == []


def test_retry_requeues_after_the_delay_with_the_attempt_still_charged(
    backend: Backend, clock: ControlledClock
) -> None:
    """G7.2: a retry waits ``delay_s``, keeps the charged attempt and records the error."""
    job = backend.enqueue(make_spec())
    retry(backend, guard_of(fetch_one(backend)), CLOSING, delay_s=5.0, error=ERROR)
    queued = backend.get_job(job.id)
    assert (queued.status, queued.attempts, queued.run_at) == (JobStatus.QUEUED, 1, clock() + 5.0)
    assert queued.last_error == "TimeoutError: upstream slow"
    (row,) = backend.attempts(job_id=job.id)
    assert (row.outcome, row.error_type, row.error_message) == (
        Outcome.RETRY,
        "TimeoutError",
        "upstream slow",
    )
    clock.advance(4.5)
    assert fetch(backend, ["default"], 10, "w1") == []
    clock.advance(0.5)
    assert fetch_one(backend).attempt == 2


def test_retry_hands_the_error_signature_to_the_next_delivery(backend: Backend) -> None:
    """G8.2: poison detection needs the last error signature and its run length next time."""
    backend.enqueue(make_spec())
    poisoned = ErrorInfo(type="KeyError", message="x", signature="abc", same_count=2)
    retry(backend, guard_of(fetch_one(backend)), CLOSING, delay_s=0.0, error=poisoned)
    again = fetch_one(backend)
    assert (again.error_signature, again.same_error_count) == ("abc", 2)


def test_defer_requeues_without_charging_the_attempt(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.4: a busy resource hands the attempt back and counts a deferral instead."""
    job = backend.enqueue(make_spec(max_attempts=1))
    defer(backend, guard_of(fetch_one(backend)), CLOSING, delay_s=2.0, reason="resource busy")
    queued = backend.get_job(job.id)
    assert (queued.status, queued.attempts, queued.deferrals) == (JobStatus.QUEUED, 0, 1)
    (row,) = backend.attempts(job_id=job.id)
    assert row.outcome == Outcome.DEFERRED
    clock.advance(2.0)
    again = fetch_one(backend)
    assert (again.attempt, again.deferrals) == (1, 1)  # still inside max_attempts=1


def test_release_hands_leases_back_uncharged_and_ready_at_once(backend: Backend) -> None:
    """Invariant 9: graceful shutdown releases leases without charging attempts."""
    jobs = [backend.enqueue(make_spec(max_attempts=1)) for _ in range(2)]
    deliveries = fetch(backend, ["default"], 2, "w1")
    assert release(backend, [guard_of(d) for d in deliveries]) == 2
    for job in jobs:
        released = backend.get_job(job.id)
        assert (released.status, released.attempts) == (JobStatus.QUEUED, 0)
        assert [a.outcome for a in backend.attempts(job_id=job.id)] == [Outcome.RELEASED]
    assert [d.attempt for d in fetch(backend, ["default"], 2, "w2")] == [1, 1]


def test_bury_moves_the_job_to_the_dead_letter_queue_with_reason_and_error(
    backend: Backend, clock: ControlledClock
) -> None:
    """G8.1: a buried job keeps its payload, reason and error; its attempt closes as dead."""
    job = backend.enqueue(make_spec())
    bury(
        backend,
        guard_of(fetch_one(backend)),
        CLOSING,
        code=DeadCode.FATAL,
        reason="fatal error: bad",
        error=ERROR,
    )
    dead = backend.get_job(job.id)
    assert (dead.status, dead.dead_reason, dead.finished_at) == (
        JobStatus.DEAD,
        "fatal error: bad",
        clock(),
    )
    assert dead.last_error == "TimeoutError: upstream slow"
    assert dead.payload == job.payload
    (row,) = backend.attempts(job_id=job.id)
    assert (row.outcome, row.traceback) == (Outcome.DEAD, "tb")
    assert fetch(backend, ["default"], 10, "w1") == []


def test_record_refusal_marks_the_stale_delivery_own_attempt_row(
    backend: Backend, clock: ControlledClock
) -> None:
    """G10.1: a refused write is visible on the stale delivery's attempt, not on the job."""
    job = backend.enqueue(make_spec(visibility_timeout_s=10.0))
    stale = fetch_one(backend)
    clock.advance(10.0)
    fetch_one(backend)
    job_before = backend.get_job(job.id)
    record_refusal(backend, guard_of(stale), Outcome.LEASE_REFUSED, CLOSING, "lease is stale")
    old, new = backend.attempts(job_id=job.id)
    assert (old.outcome, old.error_type, old.error_message) == (
        Outcome.LEASE_REFUSED,
        "LeaseLostError",
        "lease is stale",
    )
    assert new.outcome == Outcome.RUNNING
    assert backend.get_job(job.id) == job_before


# -- the dead letter queue (G8.3) ---------------------------------------------------------------


def test_replay_keeps_id_payload_and_keys_and_resets_attempts(
    backend: Backend, clock: ControlledClock
) -> None:
    """G8.3: replay queues the same job again with its operation key."""
    job = backend.enqueue(
        make_spec(operation_key="op:9", resource_key="res:9", lock_ttl_s=5.0, dedup_key="d:9")
    )
    bury(
        backend,
        guard_of(fetch_one(backend)),
        CLOSING,
        code=DeadCode.FATAL,
        reason="fatal",
        error=ERROR,
    )
    clock.advance(100.0)
    replayed = backend.replay(job.id)
    assert replayed.id == job.id
    assert replayed.status == JobStatus.QUEUED
    assert (replayed.payload, replayed.operation_key, replayed.resource_key) == (
        job.payload,
        "op:9",
        "res:9",
    )
    assert (replayed.dedup_key, replayed.attempts, replayed.dead_reason) == ("d:9", 0, None)
    again = fetch_one(backend)
    assert (again.job_id, again.attempt, again.operation_key) == (job.id, 1, "op:9")


def test_replay_of_a_job_that_is_not_dead_is_not_found(backend: Backend) -> None:
    """G8.3: only dead jobs can be replayed; queued, running and missing jobs are refused."""
    queued = backend.enqueue(make_spec())
    with pytest.raises(NotFoundError):
        backend.replay(queued.id)
    fetch_one(backend)
    with pytest.raises(NotFoundError):
        backend.replay(queued.id)
    with pytest.raises(NotFoundError):
        backend.replay(queued.id + 1000)
    assert backend.get_job(queued.id).status == JobStatus.RUNNING


def test_purge_deletes_one_dead_job_or_all_of_them_with_their_attempts(
    backend: Backend,
) -> None:
    """G8.3: purge removes dead jobs and their attempt rows; live jobs are never purged."""
    dead = []
    for _ in range(3):
        job = backend.enqueue(make_spec())
        bury(
            backend,
            guard_of(fetch_one(backend)),
            CLOSING,
            code=DeadCode.FATAL,
            reason="fatal",
            error=ERROR,
        )
        dead.append(job)
    live = backend.enqueue(make_spec())
    assert backend.purge(live.id) == 0
    assert backend.purge(dead[0].id) == 1
    with pytest.raises(NotFoundError):
        backend.get_job(dead[0].id)
    assert backend.attempts(job_id=dead[0].id) == []
    assert {j.id for j in backend.dead_jobs()} == {dead[1].id, dead[2].id}
    assert backend.purge() == 2
    assert backend.dead_jobs() == []
    assert backend.get_job(live.id).status == JobStatus.QUEUED


# -- reads --------------------------------------------------------------------------------------


def test_get_job_of_an_unknown_id_is_not_found(backend: Backend) -> None:
    """Port contract: ``get_job`` raises NotFoundError instead of returning nothing."""
    with pytest.raises(NotFoundError):
        backend.get_job(424242)


def test_list_count_and_dead_jobs_report_what_is_stored(
    backend: Backend, clock: ControlledClock
) -> None:
    """Port contract: newest first, filtered by status, counts for every state, DLQ order."""
    assert backend.count_jobs() == dict.fromkeys(JobStatus, 0)
    a, b, c, d = (backend.enqueue(make_spec()) for _ in range(4))
    bury(
        backend,
        guard_of(fetch_one(backend)),
        CLOSING,
        code=DeadCode.FATAL,
        reason="first",
        error=None,
    )  # a
    clock.advance(1.0)
    bury(
        backend,
        guard_of(fetch_one(backend)),
        CLOSING,
        code=DeadCode.FATAL,
        reason="second",
        error=None,
    )  # b
    finish(backend, guard_of(fetch_one(backend)), CLOSING)  # c
    assert backend.count_jobs() == {
        JobStatus.QUEUED: 1,
        JobStatus.RUNNING: 0,
        JobStatus.COMPLETED: 1,
        JobStatus.DEAD: 2,
    }
    assert [j.id for j in backend.find_jobs()] == [d.id, c.id, b.id, a.id]
    assert [j.id for j in backend.find_jobs(limit=2)] == [d.id, c.id]
    assert [j.id for j in backend.find_jobs(status=JobStatus.DEAD)] == [b.id, a.id]
    assert [j.id for j in backend.dead_jobs()] == [b.id, a.id]  # most recently buried first


def test_now_is_the_store_clock_that_leases_expire_on(
    backend: Backend, clock: ControlledClock
) -> None:
    """Leases use the store's clock, which ``now()`` exposes."""
    assert backend.now() == clock()
    backend.enqueue(make_spec(visibility_timeout_s=7.0))
    lease = fetch_one(backend)
    clock.advance(3.0)
    assert backend.now() == clock()
    assert lease.lease_expires_at == backend.now() + 4.0


# -- batched acks ------------------------------------------------------------------------------


def test_finish_many_acks_current_deliveries_and_refuses_stale_ones_without_writing_them(
    backend: Backend, clock: ControlledClock
) -> None:
    """One commit acks a batch (the worker's throughput lever); a stale delivery inside it is
    refused on its own and changes nothing, while the others are acked (G1.2, G2.4)."""
    first = backend.enqueue(make_spec(payload='{"n":1}'))
    second = backend.enqueue(make_spec(payload='{"n":2}', visibility_timeout_s=5.0))
    third = backend.enqueue(make_spec(payload='{"n":3}'))
    deliveries = {d.job_id: d for d in fetch(backend, ["default"], 3, "w1")}
    clock.advance(6)  # only the second job's 5 s lease expires...
    stale = deliveries[second.id]
    redelivered = fetch_one(backend, worker="w2")  # ...and another worker takes it over
    assert redelivered.job_id == second.id
    before = snapshot(backend, second.id)

    refusals = backend.settle(
        [
            success(guard_of(deliveries[first.id]), CLOSING),
            success(guard_of(stale), CLOSING),
            success(guard_of(deliveries[third.id]), CLOSING, outcome=Outcome.COMPLETED),
        ]
    )

    assert refusals[0] is None
    assert isinstance(refusals[1], LeaseLostError)
    assert refusals[2] is None
    assert backend.get_job(first.id).status == JobStatus.COMPLETED
    assert backend.get_job(third.id).status == JobStatus.COMPLETED
    assert snapshot(backend, second.id) == before
    assert backend.settle([]) == []


def test_replay_is_refused_while_another_live_job_holds_the_dedup_key(
    backend: Backend, clock: ControlledClock
) -> None:
    """A job enqueued again while the first one was dead holds the key; replaying the dead one
    would give two live jobs for one dedup key (G6, G6.1). Once the live one is gone, the
    replay goes through."""
    first = backend.enqueue(make_spec(dedup_key="invoice:9", max_attempts=1))
    delivery = fetch_one(backend)
    bury(backend, guard_of(delivery), CLOSING, code=DeadCode.FATAL, reason="broken", error=ERROR)
    second = backend.enqueue(make_spec(dedup_key="invoice:9"))
    assert second.id != first.id
    before = snapshot(backend, first.id)

    with pytest.raises(DuplicateJobError, match=str(second.id)):
        backend.replay(first.id)
    assert snapshot(backend, first.id) == before

    finish(backend, guard_of(fetch_one(backend)), CLOSING)  # the live job completes
    clock.advance(1)
    assert backend.replay(first.id).status == JobStatus.QUEUED


# -- retention ---------------------------------------------------------------------------------


def test_prune_deletes_old_completed_jobs_in_batches_and_keeps_everything_else(
    backend: Backend, clock: ControlledClock
) -> None:
    """Retention removes completed jobs past the age and their attempts, batch by batch; live,
    dead, recent and dedup-holding jobs and every operation record stay (G4.3, G6.2)."""
    old = [backend.enqueue(make_spec(payload=f'{{"n":{n}}}')) for n in range(5)]
    for delivery in fetch(backend, ["default"], 5, "w1"):
        finish(backend, guard_of(delivery), CLOSING)
    held = backend.enqueue(make_spec(dedup_key="held", dedup_window_s=1000))
    finish(backend, guard_of(fetch_one(backend)), CLOSING)
    dead = backend.enqueue(make_spec(max_attempts=1))
    bury(
        backend, guard_of(fetch_one(backend)), CLOSING, code=DeadCode.FATAL, reason="x", error=ERROR
    )
    clock.advance(100)
    recent = backend.enqueue(make_spec())
    finish(backend, guard_of(fetch_one(backend)), CLOSING)
    queued = backend.enqueue(make_spec())

    assert backend.prune_completed(50, batch_size=2) == 5

    for job in old:
        with pytest.raises(NotFoundError):
            backend.get_job(job.id)
        assert backend.attempts(job_id=job.id) == []
    assert backend.get_job(held.id).status == JobStatus.COMPLETED  # dedup window still open
    assert backend.get_job(dead.id).status == JobStatus.DEAD
    assert backend.get_job(recent.id).status == JobStatus.COMPLETED
    assert backend.get_job(queued.id).status == JobStatus.QUEUED
    assert backend.prune_completed(50) == 0
    with pytest.raises(JobGuardError):
        backend.prune_completed(-1)


def test_the_fetching_workers_rules_decide_the_lease_not_the_stored_copy(
    backend: Backend, clock: ControlledClock
) -> None:
    """A producer still on old code stored a 30 s lease; the worker's own definition says 90 s:
    the delivery gets 90 s. Jobs of tasks the worker has no rule for keep what was stored."""
    backend.enqueue(make_spec())
    backend.enqueue(make_spec(task="tests.other"))
    rules = {"tests.noop": DeliveryRules(visibility_timeout_s=90.0, max_attempts=3)}
    mine, other = fetch(backend, ["default"], 10, "w1", rules)
    now = backend.now()
    assert mine.visibility_timeout_s == 90.0
    assert mine.lease_expires_at == pytest.approx(now + 90.0, abs=1.0)
    assert other.visibility_timeout_s == 30.0
    clock.advance(60.0)  # past the stored 30 s, within the worker's 90 s
    redelivered = fetch(backend, ["default"], 10, "w2", rules)
    assert [d.job_id for d in redelivered] == [other.job_id]


def test_the_fetching_workers_attempt_limit_decides_when_a_lost_job_is_buried(
    backend: Backend, clock: ControlledClock
) -> None:
    """Stored with 1 attempt by an old producer, allowed 3 by the worker's definition: a delivery
    that never reported back is delivered again instead of being buried, and the row shows the
    limit the worker enforces (a fetch without rules then goes by it)."""
    job = backend.enqueue(make_spec(max_attempts=1, visibility_timeout_s=5.0))
    rules = {"tests.noop": DeliveryRules(visibility_timeout_s=5.0, max_attempts=3)}
    fetch(backend, ["default"], 1, "w1", rules)
    assert backend.get_job(job.id).max_attempts == 3
    clock.advance(6.0)
    [again] = fetch(backend, ["default"], 1, "w2", rules)
    assert (again.job_id, again.attempt, again.max_attempts) == (job.id, 2, 3)
    clock.advance(6.0)
    [third] = fetch(backend, ["default"], 1, "w3")  # without rules: the limit the row holds
    assert (third.attempt, third.max_attempts) == (3, 3)
    clock.advance(6.0)
    assert fetch(backend, ["default"], 1, "w4") == []
    assert backend.get_job(job.id).status == JobStatus.DEAD


def test_a_batch_of_acks_with_a_stale_and_the_current_lease_of_one_job_acks_only_the_current(
    backend: Backend, clock: ControlledClock
) -> None:
    """Both deliveries of a redelivered job can sit in one worker's ack batch: the current one
    is acked, the stale one refused, and the stale one's attempt keeps its own outcome."""
    job = backend.enqueue(make_spec(visibility_timeout_s=5.0))
    stale = fetch_one(backend)
    clock.advance(6.0)
    current = fetch_one(backend, worker="w2")
    refusals = backend.settle(
        [success(guard_of(stale), CLOSING), success(guard_of(current), CLOSING)]
    )
    assert isinstance(refusals[0], LeaseLostError)
    assert refusals[1] is None
    assert backend.get_job(job.id).status == JobStatus.COMPLETED
    outcomes = [attempt.outcome for attempt in backend.attempts(job_id=job.id)]
    assert outcomes == [Outcome.LOST, Outcome.COMPLETED]


def test_a_batch_of_acks_refuses_each_stale_proof_on_its_own_and_acks_the_rest(
    backend: Backend, clock: ControlledClock
) -> None:
    """One ack batch: a delivery with its lock and claim in place, one whose lock was granted
    anew after its TTL (stale fence), one whose operation was claimed by another delivery after
    its lease ran out (claim lost), one whose job was leased again (stale lease). The first is
    acked with its operation completed and its lock released; each other is refused with its
    own reason, and nothing of it changes."""

    def delivered(name: str, lease_s: float, lock_ttl_s: float) -> Guard:
        spec = make_spec(queue=name, visibility_timeout_s=lease_s)
        return locked_delivery(backend, spec, name, lock_ttl_s)

    ok = delivered("ok", 60.0, 60.0)
    fenced = delivered("fenced", 60.0, 5.0)
    unclaimed = delivered("unclaimed", 5.0, 60.0)
    stale = delivered("stale", 5.0, 60.0)
    clock.advance(6.0)
    assert backend.acquire_lock("res:fenced", "someone-else", 30.0) is not None
    backend.enqueue(make_spec(queue="thief", visibility_timeout_s=60.0))
    thief = fetch_one(backend, ["thief"])
    assert begin_operation(backend, guard_of(thief), "op:unclaimed", None) is not None
    fetch_one(backend, ["stale"])  # the job is leased again
    refused_before = {g.job_id: snapshot(backend, g.job_id) for g in (fenced, unclaimed, stale)}

    requests = [
        success(guard, CLOSING, operation_key=f"op:{name}", result_json="1")
        for guard, name in (
            (ok, "ok"),
            (fenced, "fenced"),
            (unclaimed, "unclaimed"),
            (stale, "stale"),
        )
    ]
    refusals = backend.settle(requests)

    assert refusals[0] is None
    assert isinstance(refusals[1], StaleFenceError)
    assert isinstance(refusals[2], LeaseLostError)
    assert "no longer claimed" in str(refusals[2])
    assert isinstance(refusals[3], LeaseLostError)
    assert backend.get_job(ok.job_id).status == JobStatus.COMPLETED
    operation = backend.get_operation("op:ok")
    assert operation is not None
    assert operation.status == OperationStatus.COMPLETED
    assert backend.acquire_lock("res:ok", "next", 30.0) is not None  # released with the ack
    for job_id, before in refused_before.items():
        assert snapshot(backend, job_id) == before


def test_one_finish_the_store_cannot_write_does_not_undo_the_others(backend: Backend) -> None:
    """A batch of acks with one unstorable value (a lone surrogate in its external reference):
    the others are acked, the bad one is left running on its lease, and its error names it."""
    for n in range(3):
        backend.enqueue(make_spec(operation_key=f"op:{n}"))
    deliveries = fetch(backend, ["default"], 3, "w1")
    for delivery in deliveries:
        begin_operation(backend, guard_of(delivery), delivery.operation_key or "", None)
    first, bad, last = deliveries
    requests = [
        success(guard_of(d), CLOSING, operation_key=d.operation_key, external_ref=ref)
        for d, ref in ((first, "ok-1"), (bad, "bad \ud800 ref"), (last, "ok-3"))
    ]
    refusals = backend.settle(requests)
    assert refusals[0] is None
    assert refusals[2] is None
    assert isinstance(refusals[1], JobGuardError)
    assert f"job {bad.job_id}" in str(refusals[1])
    assert backend.get_job(first.job_id).status == JobStatus.COMPLETED
    assert backend.get_job(last.job_id).status == JobStatus.COMPLETED
    assert backend.get_job(bad.job_id).status == JobStatus.RUNNING

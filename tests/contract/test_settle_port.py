"""Conformance tests of ``settle``: every way a delivery ends, written in one batch.

A worker's settler hands the store whatever ended since its last commit: successes, retries,
deferrals, burials, releases and refusals side by side. Each item is refused or written on its
own; what one item is refused for never changes what another writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobguard.backends.base import Backend, Closing, Ending, ErrorInfo
from jobguard.exceptions import LeaseLostError, StaleFenceError
from jobguard.models import DeadCode, Guard, Job, JobSpec, JobStatus, OperationStatus, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import (
    begin_operation,
    burying,
    deferring,
    fetch_one,
    guard_of,
    locked_delivery,
    refusing,
    releasing,
    retrying,
    success,
)

CLOSING = Closing(duration_s=0.5, steps_run=2, steps_skipped=1)
ERROR = ErrorInfo(type="TimeoutError", message="upstream slow", traceback="tb", signature="s1")


def spec(queue: str, lease_s: float = 60.0, **changes: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "task": "tests.noop",
        "queue": queue,
        "payload": "{}",
        "max_attempts": 3,
        "visibility_timeout_s": lease_s,
    }
    fields.update(changes)
    return JobSpec(**fields)


def snapshot(backend: Backend, job_id: int) -> tuple[Job, list[Any]]:
    return backend.get_job(job_id), backend.attempts(job_id=job_id)


def delivered(
    backend: Backend, name: str, *, lease_s: float = 60.0, lock_ttl_s: float = 60.0
) -> Guard:
    """A delivery of queue ``name`` holding lock ``res:name`` and claim ``op:name``."""
    keyed = spec(name, lease_s, operation_key=f"op:{name}", resource_key=f"res:{name}")
    return locked_delivery(backend, keyed, name, lock_ttl_s)


def plain(backend: Backend, name: str) -> Guard:
    """A delivery of queue ``name`` holding nothing."""
    backend.enqueue(spec(name))
    return guard_of(fetch_one(backend, [name]))


def test_one_batch_of_every_ending_refuses_or_writes_each_on_its_own(
    backend: Backend, clock: ControlledClock
) -> None:
    """A stale lease, a stale fence, a lost claim, a retry, a burial, a deferral, a release, a
    refusal mark and a success in one settle: the three stale ones are refused with their own
    reasons and change nothing; every other is written as if it were alone."""
    done = delivered(backend, "done")
    retried = delivered(backend, "retried")
    buried = delivered(backend, "buried")
    deferred = plain(backend, "deferred")
    released = delivered(backend, "released")
    fenced = delivered(backend, "fenced", lock_ttl_s=5.0)
    unclaimed = delivered(backend, "unclaimed", lease_s=5.0)
    stale = delivered(backend, "stale", lease_s=5.0)
    marked = plain(backend, "marked")
    clock.advance(6.0)
    assert backend.acquire_lock("res:fenced", "someone-else", 30.0) is not None
    backend.enqueue(spec("thief"))
    thief = fetch_one(backend, ["thief"])
    assert begin_operation(backend, guard_of(thief), "op:unclaimed", None) is not None
    fetch_one(backend, ["stale"])  # the job is leased again
    refused_before = {g.job_id: snapshot(backend, g.job_id) for g in (fenced, unclaimed, stale)}

    endings: list[Ending] = [
        retrying(stale, CLOSING, delay_s=1.0, error=ERROR, operation_key="op:stale"),
        success(fenced, CLOSING, operation_key="op:fenced", result_json="1"),
        success(unclaimed, CLOSING, operation_key="op:unclaimed", result_json="1"),
        retrying(retried, CLOSING, delay_s=5.0, error=ERROR, operation_key="op:retried"),
        burying(
            buried,
            CLOSING,
            code=DeadCode.FATAL,
            reason="fatal error: bad card",
            error=ERROR,
            operation_key="op:buried",
        ),
        deferring(deferred, CLOSING, delay_s=2.0, reason="resource busy"),
        releasing(released, "op:released"),
        refusing(marked, Outcome.LEASE_REFUSED, CLOSING, "lease is stale"),
        success(done, CLOSING, operation_key="op:done", result_json='{"ok": true}'),
    ]
    refusals = backend.settle(endings)

    assert isinstance(refusals[0], LeaseLostError)
    assert isinstance(refusals[1], StaleFenceError)
    assert isinstance(refusals[2], LeaseLostError)
    assert "no longer claimed" in str(refusals[2])
    assert refusals[3:] == [None] * 6
    for guard in (fenced, unclaimed, stale):
        assert snapshot(backend, guard.job_id) == refused_before[guard.job_id]
    now = backend.now()

    job = backend.get_job(done.job_id)
    assert (job.status, job.last_error) == (JobStatus.COMPLETED, None)
    operation = backend.get_operation("op:done")
    assert operation is not None
    assert (operation.status, operation.result) == (OperationStatus.COMPLETED, {"ok": True})
    assert backend.acquire_lock("res:done", "next", 5.0) is not None  # released

    job = backend.get_job(retried.job_id)
    assert (job.status, job.attempts, job.run_at) == (JobStatus.QUEUED, 1, now + 5.0)
    assert job.last_error == "TimeoutError: upstream slow"
    operation = backend.get_operation("op:retried")
    assert operation is not None
    assert (operation.status, operation.last_error) == (
        OperationStatus.PROCESSING,
        "TimeoutError: upstream slow",
    )

    job = backend.get_job(buried.job_id)
    assert (job.status, job.dead_code, job.dead_reason) == (
        JobStatus.DEAD,
        DeadCode.FATAL,
        "fatal error: bad card",
    )
    operation = backend.get_operation("op:buried")
    assert operation is not None
    assert (operation.status, operation.last_error) == (
        OperationStatus.FAILED,
        "fatal error: bad card",
    )

    job = backend.get_job(deferred.job_id)
    assert (job.status, job.attempts, job.deferrals) == (JobStatus.QUEUED, 0, 1)

    job = backend.get_job(released.job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    operation = backend.get_operation("op:released")
    assert operation is not None
    assert operation.status == OperationStatus.PROCESSING

    attempts = {
        guard.job_id: backend.attempts(job_id=guard.job_id)[-1]
        for guard in (done, retried, buried, deferred, released, marked)
    }
    assert attempts[done.job_id].outcome == Outcome.COMPLETED
    assert (attempts[done.job_id].steps_run, attempts[done.job_id].steps_skipped) == (2, 1)
    assert (attempts[retried.job_id].outcome, attempts[retried.job_id].error_type) == (
        Outcome.RETRY,
        "TimeoutError",
    )
    assert attempts[retried.job_id].traceback == "tb"
    assert attempts[buried.job_id].outcome == Outcome.DEAD
    assert (attempts[deferred.job_id].outcome, attempts[deferred.job_id].error_type) == (
        Outcome.DEFERRED,
        "ResourceBusy",
    )
    assert attempts[released.job_id].outcome == Outcome.RELEASED
    assert (attempts[marked.job_id].outcome, attempts[marked.job_id].error_type) == (
        Outcome.LEASE_REFUSED,
        "LeaseLostError",
    )


def test_a_fence_refused_delivery_whose_lease_holds_is_handed_back_uncharged(
    backend: Backend, clock: ControlledClock
) -> None:
    """Its work is discarded: the job runs again under a fresh lock, the attempt is handed back,
    and the stale attempt row says it was refused for its fence."""
    fenced = delivered(backend, "fenced", lock_ttl_s=5.0)
    clock.advance(6.0)
    assert backend.acquire_lock("res:fenced", "someone-else", 30.0) is not None
    ending = Ending(fenced, CLOSING, Outcome.FENCE_REFUSED, delay_s=1.0, reason="fence 1 is stale")
    assert backend.settle([ending]) == [None]
    job = backend.get_job(fenced.job_id)
    assert (job.status, job.attempts, job.deferrals) == (JobStatus.QUEUED, 0, 1)
    (attempt,) = backend.attempts(job_id=fenced.job_id)
    assert (attempt.outcome, attempt.error_type, attempt.error_message) == (
        Outcome.FENCE_REFUSED,
        "StaleFenceError",
        "fence 1 is stale",
    )


def test_a_fence_refusal_whose_lease_is_gone_too_only_marks_its_attempt(
    backend: Backend, clock: ControlledClock
) -> None:
    """The job belongs to its new delivery: settling the refusal leaves it alone."""
    fenced = delivered(backend, "fenced", lease_s=5.0, lock_ttl_s=5.0)
    clock.advance(6.0)
    current = fetch_one(backend, ["fenced"])
    before = backend.get_job(fenced.job_id)
    ending = Ending(fenced, CLOSING, Outcome.FENCE_REFUSED, delay_s=1.0, reason="stale")
    assert backend.settle([ending]) == [None]
    assert backend.get_job(fenced.job_id) == before
    assert before.status == JobStatus.RUNNING
    outcomes = [a.outcome for a in backend.attempts(job_id=fenced.job_id)]
    assert outcomes == [Outcome.FENCE_REFUSED, Outcome.RUNNING]
    assert current.attempt == 2


@pytest.mark.parametrize("outcome", [Outcome.LOST])
def test_an_ending_that_writes_nothing_is_never_refused(backend: Backend, outcome: Outcome) -> None:
    """A ``lost`` ending (the store failed under its delivery) writes nothing and is not an
    error: the lease expires and the next fetch closes the attempt."""
    backend.enqueue(spec("q"))
    guard = guard_of(fetch_one(backend, ["q"]))
    before = snapshot(backend, guard.job_id)
    assert backend.settle([Ending(guard, CLOSING, outcome)]) == [None]
    assert snapshot(backend, guard.job_id) == before

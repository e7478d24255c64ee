"""The queue port's cancel, the renewal that reports it, and a timed-out ending (#17).

Every backend: a queued job is buried at once; a running one keeps its lease and carries the
request, which each renewal reports and a later lease of the job shows; a replay forgets it.
"""

from __future__ import annotations

from jobguard.backends.base import Backend, Closing, Ending, ErrorInfo, Renewal
from jobguard.models import DeadCode, JobSpec, JobStatus, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import fetch_one, guard_of, settle_one

SPEC = JobSpec(task="t", queue="default", payload="{}", max_attempts=3, visibility_timeout_s=30.0)


def test_a_queued_job_is_buried_at_once_and_audited(backend: Backend) -> None:
    job = backend.enqueue(SPEC)
    cancelled = backend.cancel(job.id, "ops", "cancelled by ops")
    assert cancelled is not None
    assert (cancelled.status, cancelled.dead_code) == (JobStatus.DEAD, DeadCode.CANCELLED)
    assert cancelled.dead_reason == "cancelled by ops"
    assert backend.fetch_prepared(["default"], 10, "w1") == []
    assert backend.cancel(job.id, "ops", "again") is None  # dead: nothing written
    assert backend.cancel(job.id + 100, "ops", "unknown") is None
    (entry,) = backend.audit_trail()
    assert (entry.actor, entry.action, entry.target) == ("ops", "cancel job", f"job {job.id}")
    replayed = backend.replay(job.id)
    assert (replayed.status, replayed.cancel_requested_by) == (JobStatus.QUEUED, None)


def test_a_running_job_keeps_its_lease_and_every_renewal_reports_the_cancel(
    backend: Backend, clock: ControlledClock
) -> None:
    job = backend.enqueue(SPEC)
    delivery = fetch_one(backend)
    assert delivery.cancel_requested_by is None
    renewal = Renewal(guard_of(delivery), 30.0, None)
    assert backend.renew([renewal])[0].cancel_requested_by is None
    running = backend.cancel(job.id, "ops", "cancelled by ops")
    assert running is not None
    assert (running.status, running.cancel_requested_by) == (JobStatus.RUNNING, "ops")
    assert backend.cancel(job.id, "someone else", "x") is not None  # the first request is kept
    (result,) = backend.renew([renewal])
    assert (result.lease_ok, result.cancel_requested_by) == (True, "ops")
    # Its worker died: the next lease of the job carries the request (it is not run).
    clock.advance(31.0)
    again = fetch_one(backend, worker="w2")
    assert (again.job_id, again.cancel_requested_by) == (job.id, "ops")


def test_a_timed_out_ending_requeues_or_buries_and_records_the_attempt(backend: Backend) -> None:
    error = ErrorInfo("TimeLimitExceeded", "ran past 1s", signature="sig", same_count=1)
    job = backend.enqueue(SPEC)
    first = fetch_one(backend)
    settle_one(backend, Ending(guard_of(first), Closing(1.0), Outcome.TIMED_OUT, error=error))
    assert backend.get_job(job.id).status == JobStatus.QUEUED
    second = fetch_one(backend)
    buried = Ending(
        guard_of(second),
        Closing(1.0),
        Outcome.TIMED_OUT,
        code=DeadCode.EXHAUSTED,
        reason="attempts exhausted",
        error=error,
    )
    settle_one(backend, buried)
    got = backend.get_job(job.id)
    assert (got.status, got.dead_code) == (JobStatus.DEAD, DeadCode.EXHAUSTED)
    assert [a.outcome for a in backend.attempts(job_id=job.id)] == [Outcome.TIMED_OUT] * 2
    assert [a.error_type for a in backend.attempts(job_id=job.id)] == ["TimeLimitExceeded"] * 2

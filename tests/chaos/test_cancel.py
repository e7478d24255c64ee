"""Cancelling queued, scheduled and running jobs with real worker processes (#17, acceptance 2).

One worker process runs two jobs at once (a cooperative handler that works in steps, and one
that hangs and never looks at ``ctx``), so jobs enqueued next wait in the queue. Cancels reach
the running ones through their leases' renewals; the queued and scheduled ones are buried on the
spot. Handlers record what ran in their own event log, so "never ran" is what they did, not
what the store says.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from jobguard import App
from jobguard.exceptions import JobFinishedError, NotFoundError
from jobguard.models import DeadCode, JobStatus, Outcome
from tests.support.limits_app import COOP, NOOP, STUBBORN, release, start_worker
from tests.support.procs import wait_until, workers
from tests.support.queue_app import read_events

pytestmark = pytest.mark.chaos


def started(store_url: str) -> Counter[int]:
    return Counter(e.job_id for e in read_events(store_url) if e.kind == "start")


def cancelled(app: App, job_id: int) -> bool:
    job = app.get_job(job_id)
    return job.status == JobStatus.DEAD and job.dead_code == DeadCode.CANCELLED


def test_cancelled_jobs_never_run_afterwards_and_nothing_else_is_lost_or_run_twice(
    lapp: App, store_url: str
) -> None:
    coop = lapp.tasks[COOP].enqueue(n=1)
    stubborn = lapp.tasks[STUBBORN].enqueue()
    with workers(start_worker(store_url, "w1", 2)) as (proc,):
        wait_until(lambda: started(store_url).keys() >= {coop.id, stubborn.id})
        # Both slots are busy: these wait in the queue, one of them scheduled for later.
        queued = lapp.tasks[NOOP].enqueue(n=1)
        scheduled = lapp.tasks[NOOP].options(delay_s=60).enqueue(n=2)
        for job in (queued, scheduled):
            assert lapp.cancel(job.id, actor="operator").status == JobStatus.DEAD
            assert cancelled(lapp, job.id)
        # Running: told through the renewal; the cooperative one stops at its next step, the
        # stubborn one is given up a heartbeat later (its thread still hangs).
        for job in (coop, stubborn):
            assert lapp.cancel(job.id, actor="operator").status == JobStatus.RUNNING
        wait_until(lambda: cancelled(lapp, coop.id) and cancelled(lapp, stubborn.id))
        # The worker goes on: a job enqueued now runs, on the slot the stubborn one left.
        after = lapp.tasks[NOOP].enqueue(n=3)
        wait_until(lambda: lapp.get_job(after.id).status == JobStatus.COMPLETED)
        release(store_url, stubborn.id)
        wait_until(lambda: len(read_events(store_url, stubborn.id)) == 2)
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    # Nothing cancelled ran afterwards; what ran, ran once.
    assert started(store_url) == {coop.id: 1, stubborn.id: 1, after.id: 1}
    assert [e.kind for e in read_events(store_url, stubborn.id)] == ["start", "woke:cancel=True"]
    for job in (coop, stubborn):
        (attempt,) = lapp.attempts(job_id=job.id)
        assert attempt.outcome == Outcome.DEAD
        assert attempt.error_type == "JobCancelled"
        assert attempt.error_message == f"job {job.id} was cancelled by operator"
        assert lapp.get_job(job.id).attempts == 1  # not retried
    for job in (queued, scheduled):
        assert lapp.attempts(job_id=job.id) == []
        assert lapp.get_job(job.id).dead_reason == f"job {job.id} was cancelled by operator"
    # Audited: who cancelled what, and what the job was doing then.
    trail = [(e.action, e.target, e.actor, e.detail) for e in reversed(lapp.audit_trail())]
    assert trail == [
        ("cancel job", f"job {queued.id}", "operator", "was queued"),
        ("cancel job", f"job {scheduled.id}", "operator", "was queued"),
        ("cancel job", f"job {coop.id}", "operator", "was running: told to stop"),
        ("cancel job", f"job {stubborn.id}", "operator", "was running: told to stop"),
    ]
    # A cancelled job is dead: it can be replayed, and then it runs.
    lapp.dlq.replay(queued.id, actor="operator")
    lapp.worker(install_signal_handlers=False).run(burst=True)
    assert lapp.get_job(queued.id).status == JobStatus.COMPLETED
    assert started(store_url)[queued.id] == 1


def test_a_job_cancelled_while_its_worker_is_stopped_is_not_run_by_the_next_worker(
    lapp: App, store_url: str
) -> None:
    """The cancel lands while the worker cannot renew (SIGSTOP) and that worker then dies
    (SIGKILL): the worker that takes the job over buries it instead of running it."""
    job = lapp.tasks[COOP].enqueue(n=2)
    with workers(start_worker(store_url, "w1", 1)) as (first,):
        wait_until(lambda: started(store_url)[job.id] == 1)
        first.pause_between_writes(store_url)  # a SQLite write lock would block the cancel
        lapp.cancel(job.id, actor="operator")
        first.signal(signal.SIGKILL)
        first.wait()
        with workers(start_worker(store_url, "w2", 1)):
            wait_until(lambda: cancelled(lapp, job.id))
    assert started(store_url)[job.id] == 1  # the second worker never ran it
    lost, buried = lapp.attempts(job_id=job.id)
    assert lost.outcome == Outcome.LOST
    assert (buried.outcome, buried.worker_id, buried.error_type) == (
        Outcome.DEAD,
        "w2",
        "JobCancelled",
    )


def test_cancel_of_an_unknown_or_finished_job_is_refused_and_changes_nothing(
    lapp: App, store_url: str
) -> None:
    done = lapp.tasks[NOOP].enqueue(n=1)
    lapp.worker(install_signal_handlers=False).run(burst=True)
    assert lapp.get_job(done.id).status == JobStatus.COMPLETED
    with pytest.raises(JobFinishedError, match=f"job {done.id} is completed"):
        lapp.cancel(done.id, actor="operator")
    with pytest.raises(NotFoundError):
        lapp.cancel(done.id + 1000, actor="operator")
    gone = lapp.tasks[NOOP].enqueue(n=2)
    lapp.cancel(gone.id, actor="operator")
    before = lapp.get_job(gone.id)
    with pytest.raises(JobFinishedError, match=f"job {gone.id} is dead"):
        lapp.cancel(gone.id, actor="someone else")
    assert lapp.get_job(gone.id) == before
    assert [e.target for e in lapp.audit_trail()] == [f"job {gone.id}"]
    assert lapp.get_job(done.id).status == JobStatus.COMPLETED

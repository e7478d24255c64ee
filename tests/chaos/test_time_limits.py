"""Soft time limits with real worker processes on both stores (#17, acceptance 1).

A thread-mode worker runs a handler that hangs past its soft limit and never looks at ``ctx``:
the worker gives the run up one heartbeat after telling it, so its lock is released (the next
job on the resource runs, with a newer fence) while the handler still hangs; the stuck attempt
is recorded as timed out and the retry continues from its recorded step. When the test wakes
the handler, its stale write is refused by its fence and its next step raises.
"""

from __future__ import annotations

import signal

import pytest

from jobguard import App
from jobguard.exceptions import GuardLost
from jobguard.models import Guard, JobStatus, LockGrant, Outcome
from tests.support.limits_app import (
    FOLLOW,
    HANG,
    LEASE_S,
    SOFT_S,
    ledger,
    release,
    start_worker,
)
from tests.support.procs import SCHEDULING_SLACK_S, wait_until, workers
from tests.support.queue_app import read_events

pytestmark = pytest.mark.chaos

HEARTBEAT_S = LEASE_S / 3  # the renewal interval of these leases and locks


def kinds(store_url: str, job_id: int) -> list[str]:
    return [e.kind for e in read_events(store_url, job_id)]


def test_a_soft_limit_frees_the_lock_of_a_handler_that_hangs_and_refuses_its_late_write(
    lapp: App, store_url: str
) -> None:
    stuck = lapp.tasks[HANG].enqueue(res="r1")
    nxt = lapp.tasks[FOLLOW].enqueue(res="r1")
    with workers(start_worker(store_url, "w1")) as (proc,):
        # The next job on the resource and the stuck job's retry both finish while the first
        # run's handler still hangs (nothing has woken it).
        wait_until(
            lambda: (
                lapp.get_job(nxt.id).status == JobStatus.COMPLETED
                and lapp.get_job(stuck.id).status == JobStatus.COMPLETED
            )
        )
        assert "woke:passed=True" not in kinds(store_url, stuck.id)
        # (The retry may have waited for the lock while the next job held it: deferred.)
        first, *retry_waits, retry = lapp.attempts(job_id=stuck.id)
        assert {a.outcome for a in retry_waits} <= {Outcome.DEFERRED}
        assert first.outcome == Outcome.TIMED_OUT
        assert first.error_type == "TimeLimitExceeded"
        assert "soft time limit of 0.5s" in (first.error_message or "")
        # Given up within the limit plus one heartbeat (the bound, plus scheduling room).
        assert first.duration_s is not None
        assert SOFT_S <= first.duration_s <= SOFT_S + HEARTBEAT_S + SCHEDULING_SLACK_S
        assert first.duration_s < LEASE_S + SOFT_S  # not freed by an expiry: never expired
        # Retried as a transient failure: the retry skipped the step the stuck run recorded.
        assert retry.outcome == Outcome.COMPLETED
        assert (retry.steps_run, retry.steps_skipped) == (0, 1)
        # (It may have waited for the lock while the retry held it: deferred, uncharged.)
        *waits, follower = lapp.attempts(job_id=nxt.id)
        assert {a.outcome for a in waits} <= {Outcome.DEFERRED}
        assert follower.outcome == Outcome.COMPLETED
        assert first.fence is not None
        assert follower.fence is not None
        assert follower.fence > first.fence  # the lock was granted again, fence advanced
        assert kinds(store_url, nxt.id) == ["start", "write:accepted"]

        # Wake the stuck handler: its write with the old fence is refused by the fenced
        # system, and its next step by jobguard.
        release(store_url, stuck.id)
        wait_until(lambda: any(k.startswith("step:") for k in kinds(store_url, stuck.id)))
        late = [e.kind for e in read_events(store_url, stuck.id) if e.attempt == 1]
        assert late == [
            "start",
            "woke:passed=True",
            "stale-write:refused",
            "step:refused:TimeLimitExceeded",
        ]
        # The store refuses a write proven by the stuck run's lease and fence too.
        grant = LockGrant("res:r1", first.lock_owner or "", first.fence, 0.0)
        stale = Guard(stuck.id, first.lease_token, first.id, grant)
        with pytest.raises(GuardLost):
            lapp.backend.put_step(stale, "hang:r1", "late", "1")
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    # The late run's own ending was discarded: the attempt log is as it was.
    assert lapp.attempts(job_id=stuck.id) == [first, *retry_waits, retry]
    assert ledger(store_url) == [("res:r1", follower.fence, FOLLOW)]
    operation = lapp.operation("hang:r1")
    assert operation is not None
    assert set(operation.steps) == {"first"}

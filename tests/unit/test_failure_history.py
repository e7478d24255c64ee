"""Unit tests of what ``jobguard.failures`` reads from the attempt log for the poison rule."""

from __future__ import annotations

import itertools
from typing import Any

from jobguard.failures import peers_failing, streak_start
from jobguard.models import Attempt, Delivery, Outcome

_ids = itertools.count(1)


def attempt(
    job_id: int, outcome: Outcome, at: float, error: str | None = None, **more: Any
) -> Attempt:
    """One attempt row as the store returns it."""
    fields: dict[str, Any] = {
        "id": next(_ids),
        "job_id": job_id,
        "attempt": 1,
        "task": "mail",
        "queue": "default",
        "operation_key": None,
        "worker_id": "w",
        "lease_token": "t",
        "lock_owner": None,
        "fence": None,
        "started_at": at,
        "ended_at": None if outcome is Outcome.RUNNING else at + 1,
        "duration_s": None,
        "outcome": outcome,
        "error_type": error,
        "error_message": None,
        "traceback": None,
        "steps_run": 0,
        "steps_skipped": 0,
    }
    fields.update(more)
    return Attempt(**fields)


def delivery(job_id: int = 1, task: str = "mail") -> Delivery:
    """A delivery of ``job_id`` (only its identity matters here)."""
    return Delivery(
        job_id=job_id,
        task=task,
        queue="default",
        payload="{}",
        attempt=4,
        max_attempts=9,
        deferrals=0,
        created_at=0.0,
        lease_token="t",
        attempt_id=9,
        lease_expires_at=0.0,
        visibility_timeout_s=30.0,
        operation_key=None,
        resource_key=None,
        lock_ttl_s=None,
        error_signature="s",
        same_error_count=2,
    )


def test_the_streak_starts_at_its_first_failure_of_that_error() -> None:
    own = [
        attempt(1, Outcome.RETRY, 0.0, "KeyError"),
        attempt(1, Outcome.RETRY, 10.0, "HTTPStatusError"),
        attempt(1, Outcome.LOST, 20.0),  # lost with its worker: neither counts nor breaks
        attempt(1, Outcome.RETRY, 30.0, "HTTPStatusError"),
        attempt(1, Outcome.RUNNING, 40.0),
    ]
    assert streak_start(own, "HTTPStatusError", same=3, now=41.0) == 10.0
    assert streak_start(own, "HTTPStatusError", same=2, now=41.0) == 30.0
    assert streak_start([], "HTTPStatusError", same=1, now=41.0) == 41.0


def test_peers_are_other_jobs_of_the_task_failing_alike_since_the_streak_began() -> None:
    recent = [
        attempt(1, Outcome.RETRY, 12.0, "HTTPStatusError"),  # the job itself
        attempt(2, Outcome.RETRY, 12.0, "HTTPStatusError"),
        attempt(2, Outcome.RETRY, 14.0, "HTTPStatusError"),  # one job, counted once
        attempt(3, Outcome.DEAD, 15.0, "HTTPStatusError"),
        attempt(4, Outcome.RETRY, 15.0, "KeyError"),  # another error
        attempt(5, Outcome.RETRY, 2.0, "HTTPStatusError"),  # before the streak
        attempt(6, Outcome.RETRY, 15.0, "HTTPStatusError", task="other"),
        attempt(7, Outcome.COMPLETED, 15.0),
    ]
    assert peers_failing(recent, delivery(), "HTTPStatusError", since=10.0) == 2
    assert peers_failing(recent, delivery(), "KeyError", since=10.0) == 1
    assert peers_failing(recent, delivery(), "ValueError", since=10.0) == 0

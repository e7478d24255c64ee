"""Conformance tests of the queue port's retry-now (#17): a job waiting on its run time is due
now on the store's clock, and nothing else of it changes; any other job is left as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobguard.backends.base import Backend, Closing, ErrorInfo
from jobguard.models import DeadCode, Guard, Job
from jobguard.testing import ControlledClock
from tests.contract.test_queue_port import make_spec
from tests.support.ports import bury, fetch, fetch_one, finish, guard_of, retry

CLOSING = Closing(duration_s=0.25)
ERROR = ErrorInfo(type="TimeoutError", message="upstream slow", traceback="tb", signature="s1")


def test_a_job_in_its_retry_backoff_is_due_now_with_its_attempts_kept(
    backend: Backend, clock: ControlledClock
) -> None:
    job = backend.enqueue(make_spec(max_attempts=4))
    retry(backend, guard_of(fetch_one(backend)), CLOSING, delay_s=3600.0, error=ERROR)
    waiting = backend.get_job(job.id)
    clock.advance(10.0)
    assert fetch(backend, ["default"], 10, "w1") == []

    moved = backend.retry_now(job.id)

    assert moved is not None
    assert moved.run_at == clock()
    assert moved == backend.get_job(job.id)
    # Only the run time moved: the attempt charged, the limit, the error and the keys stay.
    assert {**vars_of(moved), "run_at": waiting.run_at} == vars_of(waiting)
    again = fetch_one(backend)
    assert (again.job_id, again.attempt) == (job.id, 2)


def test_a_job_enqueued_with_a_delay_is_due_now(backend: Backend, clock: ControlledClock) -> None:
    job = backend.enqueue(make_spec(delay_s=600.0))
    moved = backend.retry_now(job.id)
    assert moved is not None
    assert (moved.run_at, moved.attempts) == (clock(), 0)
    assert fetch_one(backend).job_id == job.id


def _leased(backend: Backend) -> Guard:
    backend.enqueue(make_spec())
    return guard_of(fetch_one(backend))


def _due(backend: Backend, clock: ControlledClock) -> int:
    return backend.enqueue(make_spec()).id


def _running(backend: Backend, clock: ControlledClock) -> int:
    return _leased(backend).job_id


def _completed(backend: Backend, clock: ControlledClock) -> int:
    guard = _leased(backend)
    finish(backend, guard, CLOSING)
    return guard.job_id


def _dead(backend: Backend, clock: ControlledClock) -> int:
    guard = _leased(backend)
    bury(backend, guard, CLOSING, code=DeadCode.FATAL, reason="fatal", error=ERROR)
    return guard.job_id


def _backoff_passed(backend: Backend, clock: ControlledClock) -> int:
    guard = _leased(backend)
    retry(backend, guard, CLOSING, delay_s=5.0, error=ERROR)
    clock.advance(5.0)
    return guard.job_id


@pytest.mark.parametrize(
    "make",
    [_due, _running, _completed, _dead, _backoff_passed],
    ids=["due", "running", "completed", "dead", "backoff-passed"],
)
def test_any_other_job_is_refused_and_left_as_it_was(
    backend: Backend, clock: ControlledClock, make: Callable[[Backend, ControlledClock], int]
) -> None:
    job_id = make(backend, clock)
    before = backend.get_job(job_id)
    assert backend.retry_now(job_id) is None
    assert backend.get_job(job_id) == before


def test_an_unknown_job_is_refused(backend: Backend) -> None:
    assert backend.retry_now(424242) is None
    assert sum(backend.count_jobs().values()) == 0


def vars_of(job: Job) -> dict[str, object]:
    """The job's fields by name (a frozen slotted dataclass)."""
    return {name: getattr(job, name) for name in job.__dataclass_fields__}

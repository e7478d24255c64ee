"""Conformance tests of the attempt log: one row per delivery with the G10.1 metadata.

Runs against every backend in ``conftest.BACKENDS``; the diagnostics read only this port.
"""

from __future__ import annotations

from typing import Any

from jobguard.backends.base import Backend, Closing, ErrorInfo
from jobguard.models import Guard, JobSpec, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import (
    begin_operation,
    defer,
    fetch,
    fetch_one,
    finish,
    guard_of,
    release,
    retry,
)


def make_spec(**changes: Any) -> JobSpec:
    """A job with test defaults: queue ``default``, 5 attempts, 10 s lease."""
    fields: dict[str, Any] = {
        "task": "tests.fulfill",
        "queue": "default",
        "payload": '{"order_id":7}',
        "max_attempts": 5,
        "visibility_timeout_s": 10.0,
    }
    fields.update(changes)
    return JobSpec(**fields)


def test_a_finished_attempt_row_carries_every_r8_1_field(
    backend: Backend, clock: ControlledClock
) -> None:
    """G10.1: operation key, attempt number, worker id, lease token, lock owner, fence, start,
    end, duration, outcome and step counts are on the attempt row."""
    job = backend.enqueue(make_spec(operation_key="fulfill-order:7", resource_key="order:7"))
    started_at = clock()
    delivery = fetch_one(backend, worker="host-a/123")
    grant = backend.acquire_lock("order:7", "host-a/123/x", 30.0, attempt_id=delivery.attempt_id)
    assert grant is not None
    guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id, grant)
    (running,) = backend.attempts(job_id=job.id)
    assert (running.lock_owner, running.fence, running.ended_at) == ("host-a/123/x", 1, None)
    assert running.outcome == Outcome.RUNNING
    begin_operation(backend, guard, "fulfill-order:7", "order:7")
    clock.advance(3.0)
    finish(
        backend,
        guard,
        Closing(duration_s=2.75, steps_run=2, steps_skipped=1),
        operation_key="fulfill-order:7",
    )
    (row,) = backend.attempts(job_id=job.id)
    assert row.id == delivery.attempt_id
    assert (row.job_id, row.attempt, row.task, row.queue) == (
        job.id,
        1,
        "tests.fulfill",
        "default",
    )
    assert (row.operation_key, row.worker_id, row.lease_token) == (
        "fulfill-order:7",
        "host-a/123",
        delivery.lease_token,
    )
    assert (row.lock_owner, row.fence) == ("host-a/123/x", grant.fence)
    assert (row.started_at, row.ended_at, row.duration_s) == (started_at, clock(), 2.75)
    assert (row.outcome, row.error_type, row.error_message) == (Outcome.COMPLETED, None, None)
    assert (row.steps_run, row.steps_skipped) == (2, 1)


def test_a_failed_attempt_records_error_type_message_and_traceback(backend: Backend) -> None:
    """G8.1, G10.1: the error class, message and traceback of a failed delivery are kept."""
    job = backend.enqueue(make_spec())
    error = ErrorInfo(
        type="ConnectionError",
        message="reset by peer",
        traceback="Traceback (most recent call last)",
    )
    retry(backend, guard_of(fetch_one(backend)), Closing(0.5), delay_s=0.0, error=error)
    (row,) = backend.attempts(job_id=job.id)
    assert (row.outcome, row.error_type, row.error_message, row.traceback) == (
        Outcome.RETRY,
        "ConnectionError",
        "reset by peer",
        "Traceback (most recent call last)",
    )
    assert row.duration_s == 0.5


def test_every_delivery_gets_its_own_row_whatever_its_outcome(
    backend: Backend, clock: ControlledClock
) -> None:
    """G10.1, G8.2: retry, lost, deferred, released and completed deliveries each leave one
    row with its own lease token; deferral and release do not advance the attempt number."""
    job = backend.enqueue(make_spec())
    error = ErrorInfo(type="TimeoutError", message="slow")
    retry(backend, guard_of(fetch_one(backend)), Closing(0.1), delay_s=0.0, error=error)
    fetch_one(backend)
    clock.advance(10.0)  # that delivery's worker died: the lease expires
    defer(backend, guard_of(fetch_one(backend)), Closing(0.1), delay_s=0.0, reason="busy")
    release(backend, [guard_of(fetch_one(backend))])
    final = fetch_one(backend)
    finish(backend, guard_of(final), Closing(0.1))
    rows = backend.attempts(job_id=job.id)
    assert [r.outcome for r in rows] == [
        Outcome.RETRY,
        Outcome.LOST,
        Outcome.DEFERRED,
        Outcome.RELEASED,
        Outcome.COMPLETED,
    ]
    assert [r.attempt for r in rows] == [1, 2, 3, 3, 3]
    assert len({r.lease_token for r in rows}) == 5
    assert rows[-1].lease_token == final.lease_token
    assert all(r.ended_at is not None for r in rows)
    assert backend.get_job(job.id).attempts == 3


def test_attempts_of_an_operation_span_every_job_that_carried_its_key(backend: Backend) -> None:
    """G10.2: overlap detection reads every attempt of one operation key, across jobs, in order."""
    first = backend.enqueue(make_spec(operation_key="op:1"))
    backend.enqueue(make_spec(operation_key="op:2"))
    second = backend.enqueue(make_spec(operation_key="op:1"))
    for delivery in fetch(backend, ["default"], 10, "w1"):
        finish(backend, guard_of(delivery), Closing(0.1))
    rows = backend.attempts(operation_key="op:1")
    assert [r.job_id for r in rows] == [first.id, second.id]
    assert {r.operation_key for r in rows} == {"op:1"}
    assert backend.attempts(operation_key="op:none") == []


def test_recent_attempts_are_the_last_n_in_order(backend: Backend) -> None:
    """G10 diagnostics: without a filter, the most recent ``limit`` rows, oldest of them first."""
    jobs = [backend.enqueue(make_spec()) for _ in range(4)]
    fetch(backend, ["default"], 10, "w1")
    rows = backend.attempts(limit=3)
    assert [r.job_id for r in rows] == [j.id for j in jobs[1:]]
    assert len(backend.attempts()) == 4

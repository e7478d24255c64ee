"""Retries with backoff, the dead letter queue and replay, end to end ().

In-process workers (``jobguard.testing.drain``) on a real store of each backend: the handlers and
the store are real, only the process boundary is left out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from jobguard import App, Context, Fatal, JobStatus, OperationStatus, Outcome
from jobguard.testing import drain

# Longest a retried job may wait past its scheduled time before a draining worker picks it up.
SCHEDULING_SLACK_S = 1.0
# Store timestamps are epoch floats; sums and differences of them are exact to about 1e-6 s.
FLOAT_EPS_S = 1e-5


def test_transient_error_is_retried_with_capped_full_jitter_backoff(app: App) -> None:
    """Each retry is scheduled ``uniform(0, min(cap, base * 2**(n-1)))`` after attempt ``n``
    failed, never runs before that time, and the job completes once the error clears.

    G7.1, G7.2.
    """
    base_s, cap_s, failures = 0.1, 0.15, 5
    scheduled_at: dict[int, float] = {}

    @app.task(
        name="flaky",
        max_attempts=failures + 1,
        backoff_base_s=base_s,
        backoff_cap_s=cap_s,
        poison_threshold=failures + 1,  # the same error every time: keep it from looking poisoned
    )
    def flaky(ctx: Context, order_id: int) -> None:
        # run_at is when the store scheduled this delivery: for a retry, failure time + backoff.
        scheduled_at[ctx.attempt] = app.get_job(ctx.job_id).run_at
        if ctx.attempt <= failures:
            raise ConnectionError(f"upstream unavailable for order {order_id}")

    job = flaky.enqueue(order_id=7)
    drain(app, timeout_s=30)

    final = app.get_job(job.id)
    assert final.status == JobStatus.COMPLETED
    assert final.attempts == failures + 1
    attempts = app.attempts(job_id=job.id)
    assert [(a.attempt, a.outcome) for a in attempts] == [
        *((n, Outcome.RETRY) for n in range(1, failures + 1)),
        (failures + 1, Outcome.COMPLETED),
    ]
    for failed, following in itertools.pairwise(attempts):
        n = failed.attempt
        assert failed.error_type == "ConnectionError"
        assert failed.error_message == "upstream unavailable for order 7"
        assert failed.ended_at is not None
        ceiling_s = min(cap_s, base_s * 2 ** (n - 1))
        delay_s = scheduled_at[n + 1] - failed.ended_at
        assert -FLOAT_EPS_S <= delay_s <= ceiling_s + FLOAT_EPS_S, (n, delay_s, ceiling_s)
        # Never delivered early, and picked up promptly once due.
        assert following.started_at >= scheduled_at[n + 1] - FLOAT_EPS_S
        assert following.started_at - failed.ended_at <= ceiling_s + SCHEDULING_SLACK_S


def test_transient_error_that_never_clears_is_buried_after_max_attempts(app: App) -> None:
    """A transient error on every delivery ends in the DLQ after exactly ``max_attempts``, with
    each attempt's error and traceback; purging removes the job and its attempt rows.

    G7.2, G8.1, G8.3 (purge).
    """

    @app.task(name="down", max_attempts=3, backoff_base_s=0.01, backoff_cap_s=0.02,
              poison_threshold=10)  # fmt: skip
    def down(ctx: Context) -> None:
        raise TimeoutError("gateway timed out")

    job = down.enqueue()
    drain(app, timeout_s=30)

    dead = app.dlq.show(job.id)
    assert dead.job.status == JobStatus.DEAD
    assert dead.reason == "attempts exhausted (3/3): TimeoutError"
    assert [(a.attempt, a.outcome) for a in dead.attempts] == [
        (1, Outcome.RETRY),
        (2, Outcome.RETRY),
        (3, Outcome.DEAD),
    ]
    for attempt in dead.attempts:
        assert attempt.error_type == "TimeoutError"
        assert attempt.traceback is not None
        assert "gateway timed out" in attempt.traceback

    assert app.dlq.purge(job.id) == 1
    assert app.dlq.list() == []
    assert app.attempts(job_id=job.id) == []


def _raise_configured_fatal(order_id: int) -> None:
    raise ValueError(f"card number of order {order_id} is malformed")


def _raise_explicit_fatal(order_id: int) -> None:
    raise Fatal(f"order {order_id} was cancelled by the customer")


@pytest.mark.parametrize(
    ("fail", "error_type"),
    [(_raise_configured_fatal, "ValueError"), (_raise_explicit_fatal, "Fatal")],
    ids=["fatal-class", "raise-Fatal"],
)
def test_fatal_error_goes_to_the_dlq_at_once_and_replay_reruns_it_with_the_same_keys(
    app: App, fail: Callable[[int], None], error_type: str
) -> None:
    """A fatal error buries the job after one attempt (no retry); after a fix, replay from the
    DLQ runs the same job again: same id, payload, dedup key and operation key.

    G7.1, G8.1, G8.3 (replay keeps the operation key).
    """
    fixed = False
    runs: list[tuple[int, int, str | None]] = []

    @app.task(name="charge", max_attempts=5, fatal=(ValueError,),
              operation_key="charge:{order_id}")  # fmt: skip
    def charge(ctx: Context, order_id: int) -> str:
        runs.append((ctx.job_id, ctx.attempt, ctx.operation_key))
        if not fixed:
            fail(order_id)
        return f"charged {order_id}"

    job = charge.options(dedup_key="charge-order-42").enqueue(order_id=42)
    drain(app, timeout_s=30)

    dead = app.dlq.show(job.id)
    assert dead.job.status == JobStatus.DEAD
    assert dead.job.attempts == 1  # at once: no retry was scheduled
    assert dead.reason.startswith(f"fatal error: {error_type}: ")
    [attempt] = dead.attempts
    assert (attempt.outcome, attempt.error_type) == (Outcome.DEAD, error_type)
    assert attempt.traceback is not None
    assert [j.id for j in app.dlq.list()] == [job.id]
    operation = app.operation("charge:42")
    assert operation is not None
    assert operation.status == OperationStatus.FAILED

    fixed = True  # the bug is fixed; the operator replays the job
    replayed = app.dlq.replay(job.id)
    assert replayed.status == JobStatus.QUEUED
    assert (replayed.id, replayed.payload, replayed.dedup_key, replayed.operation_key) == (
        job.id,
        job.payload,
        job.dedup_key,
        job.operation_key,
    )
    assert app.dlq.list() == []
    drain(app, timeout_s=30)

    final = app.get_job(job.id)
    assert final.status == JobStatus.COMPLETED
    assert runs == [(job.id, 1, "charge:42"), (job.id, 1, "charge:42")]
    assert [(a.outcome, a.operation_key) for a in app.attempts(job_id=job.id)] == [
        (Outcome.DEAD, "charge:42"),
        (Outcome.COMPLETED, "charge:42"),
    ]
    operation = app.operation("charge:42")
    assert operation is not None
    assert operation.status == OperationStatus.COMPLETED
    assert operation.result == "charged 42"


def test_a_handler_returning_non_json_is_buried_at_once_and_its_steps_are_kept(app: App) -> None:
    """A result that cannot be stored is a bug every rerun repeats: fatal, one attempt, a clear
    reason; the step it completed stays recorded so a replay after the fix does not redo it."""
    calls: list[int] = []

    @app.task(operation_key="report:{n}", max_attempts=5, backoff_base_s=0.01)
    def build_report(ctx: Context, n: int) -> object:
        ctx.step("render", lambda: calls.append(n) or n)
        return {1, 2, 3}  # a set is not JSON

    job = build_report.enqueue(n=7)
    drain(app, timeout_s=10)

    dead = app.dlq.show(job.id)
    assert "not JSON" in dead.reason
    assert [a.outcome for a in dead.attempts] == [Outcome.DEAD]
    operation = app.operation("report:7")
    assert operation is not None
    assert operation.status == OperationStatus.FAILED
    assert operation.steps == {"render": 7}
    assert calls == [7]

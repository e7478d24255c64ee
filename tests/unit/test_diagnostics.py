"""The diagnostics checks (G10.2-G10.5) over constructed attempt, job and operation values.

Every check is a pure function, so each branch is driven here with hand-built values; the
end-to-end versions against a real store and real workers are in ``tests/e2e/test_doctor.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from jobguard.diagnostics import Diagnosis, Severity, Snapshot, diagnose
from jobguard.diagnostics.audit import audit
from jobguard.diagnostics.completions import completion_findings, short_completions
from jobguard.diagnostics.crashes import crash_findings, find_crash_loops
from jobguard.diagnostics.dedup import dedup_findings, split_operations, unstable_keys
from jobguard.diagnostics.durations import (
    HEADROOM,
    TaskDurations,
    advise,
    percentile,
    recommended_s,
    task_durations,
    timeout_findings,
)
from jobguard.diagnostics.findings import Kind
from jobguard.diagnostics.outages import WINDOW_S, find_outages, outage_findings
from jobguard.diagnostics.overlaps import Run, find_overlaps, likely_causes, run_of
from jobguard.diagnostics.poison import poison_findings, repeated_errors, signature_of
from jobguard.diagnostics.resources import (
    fence_refusals,
    find_resource_overlaps,
    find_slot_overruns,
    resource_findings,
    resource_use,
    slot_use,
)
from jobguard.diagnostics.retries import retry_rates
from jobguard.diagnostics.snapshot import attempt_in_scope
from jobguard.models import Attempt, Job, JobStatus, Operation, OperationStatus, Outcome

T0 = 1_700_000_000.0

_ids = iter(range(1, 1_000_000))


def attempt(**fields: Any) -> Attempt:
    """An attempt row; every field not given has a plain default (a fresh id and token)."""
    number = next(_ids)
    values: dict[str, Any] = {
        "id": number,
        "job_id": 1,
        "attempt": 1,
        "task": "sync",
        "queue": "default",
        "operation_key": "op:1",
        "worker_id": "w1",
        "lease_token": f"lease-{number}",
        "lock_owner": None,
        "fence": None,
        "started_at": T0,
        "ended_at": T0 + 1,
        "duration_s": 1.0,
        "outcome": Outcome.COMPLETED,
        "error_type": None,
        "error_message": None,
        "traceback": None,
        "steps_run": 0,
        "steps_skipped": 0,
    }
    values.update(fields)
    return Attempt(**values)


def job(**fields: Any) -> Job:
    """A job row with a 30 s lease, no lock and an operation key unless told otherwise."""
    values: dict[str, Any] = {
        "id": 1,
        "task": "sync",
        "queue": "default",
        "payload": "{}",
        "status": JobStatus.COMPLETED,
        "priority": 0,
        "attempts": 1,
        "max_attempts": 5,
        "deferrals": 0,
        "run_at": T0,
        "created_at": T0,
        "finished_at": T0 + 1,
        "visibility_timeout_s": 30.0,
        "operation_key": "op:1",
        "resource_key": None,
        "lock_ttl_s": None,
        "dedup_key": None,
        "last_error": None,
        "dead_reason": None,
    }
    values.update(fields)
    return Job(**values)


def operation(key: str, **fields: Any) -> Operation:
    """A completed operation record without an external reference unless told otherwise."""
    values: dict[str, Any] = {
        "key": key,
        "status": OperationStatus.COMPLETED,
        "resource_key": None,
        "result": None,
        "external_ref": None,
        "attempts": 1,
        "fence": None,
        "created_at": T0,
        "updated_at": T0 + 1,
        "completed_at": T0 + 1,
        "last_error": None,
    }
    values.update(fields)
    return Operation(**values)


def traceback_text(line: int, error: str = "TimeoutError: the ERP did not answer") -> str:
    """A traceback as the worker stores it, failing at ``erp.py:LINE``."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 12, in sync_order\n'
        "    erp.fetch(order_id)\n"
        f'  File "/srv/app/erp.py", line {line}, in fetch\n'
        "    raise TimeoutError(...)\n"
        f"{error}\n"
    )


# -- G10.2 overlaps ------------------------------------------------------------------------------


def test_no_attempts_means_no_overlaps() -> None:
    """G10.2, "no data": an empty log has nothing to report."""
    assert find_overlaps([], {}, T0) == []


def test_stale_delivery_that_ran_on_after_its_lease_was_taken_over_overlaps_its_successor() -> None:
    """G10.2: the old attempt was closed as lost at the take-over (``ended_at``), but it reported
    later how long it really ran (``duration_s``): that run, not the row's end, overlaps."""
    stale = attempt(
        worker_id="w1",
        started_at=T0,
        ended_at=T0 + 1.0,
        duration_s=1.5,
        outcome=Outcome.LEASE_REFUSED,
    )
    fresh = attempt(
        attempt=2, worker_id="w2", started_at=T0 + 1.0, ended_at=T0 + 1.2, duration_s=0.2
    )
    jobs = {1: job(visibility_timeout_s=1.0)}

    [overlap] = find_overlaps([fresh, stale], jobs, now=T0 + 10)

    assert overlap.key == overlap.operation_key == "op:1"
    assert (overlap.first.attempt_id, overlap.second.attempt_id) == (stale.id, fresh.id)
    assert (overlap.first.worker_id, overlap.second.worker_id) == ("w1", "w2")
    assert overlap.first.lease_token == stale.lease_token
    assert overlap.second.lease_token == fresh.lease_token
    assert overlap.first.ended_at == pytest.approx(T0 + 1.5)
    assert overlap.overlap_s == pytest.approx(0.2)
    assert overlap.causes[0].startswith("lease shorter than the job")
    assert "visibility_timeout_s=1" in overlap.causes[0]
    # A lock renewed with that lease would have expired with it: not offered as a cause.
    assert not any(cause.startswith("no resource lock") for cause in overlap.causes)


def test_crashed_delivery_ends_when_its_lease_was_taken_over_so_no_overlap() -> None:
    """G10.2: a ``lost`` attempt with no reported duration ends at the take-over; the next
    delivery starts at that very instant, which is a hand-over, not an overlap."""
    lost = attempt(ended_at=T0 + 1.0, duration_s=None, outcome=Outcome.LOST)
    fresh = attempt(attempt=2, worker_id="w2", started_at=T0 + 1.0, ended_at=T0 + 2.0)
    assert find_overlaps([lost, fresh], {1: job()}, now=T0 + 10) == []


def test_running_attempt_ends_now_and_two_jobs_of_one_operation_are_named() -> None:
    """G10.2: a still-running attempt counts up to the store clock; two jobs with one operation
    key that ran together are reported with that as a cause."""
    running = attempt(job_id=1, ended_at=None, duration_s=None, outcome=Outcome.RUNNING)
    other = attempt(job_id=2, worker_id="w2", started_at=T0 + 5, ended_at=T0 + 6, duration_s=1)
    jobs = {1: job(id=1), 2: job(id=2)}

    [overlap] = find_overlaps([running, other], jobs, now=T0 + 20)

    assert overlap.first.ended_at == T0 + 20
    assert overlap.overlap_s == pytest.approx(1.0)
    assert any(cause.startswith("two jobs (1 and 2)") for cause in overlap.causes)


def test_deliveries_that_never_ran_the_handler_cannot_overlap() -> None:
    """G10.2: ``deferred`` and ``already_processed`` attempts ended before the handler."""
    first = attempt(started_at=T0, ended_at=T0 + 10, duration_s=10)
    deferred = attempt(worker_id="w2", started_at=T0 + 1, outcome=Outcome.DEFERRED)
    acked = attempt(worker_id="w3", started_at=T0 + 2, outcome=Outcome.ALREADY_PROCESSED)
    assert run_of(deferred, T0) is None
    assert run_of(acked, T0) is None
    assert find_overlaps([first, deferred, acked], {1: job()}, now=T0 + 20) == []


def test_attempts_of_different_operations_do_not_overlap_but_one_job_without_a_key_does() -> None:
    """G10.2: overlaps are per operation key; a job without one is grouped by its own id."""
    a = attempt(operation_key="op:1", started_at=T0, ended_at=T0 + 5, duration_s=5)
    b = attempt(operation_key="op:2", job_id=2, started_at=T0 + 1, ended_at=T0 + 2)
    c = attempt(operation_key=None, job_id=7, started_at=T0, ended_at=T0 + 5, duration_s=5)
    d = attempt(operation_key=None, job_id=7, attempt=2, started_at=T0 + 4, ended_at=T0 + 6)
    e = attempt(operation_key=None, job_id=8, started_at=T0 + 1, ended_at=T0 + 2)
    jobs = {n: job(id=n, operation_key=None) for n in (7, 8)}

    [overlap] = find_overlaps([a, b, c, d, e], jobs, now=T0 + 10)

    assert (overlap.key, overlap.operation_key) == ("job 7", None)
    assert (overlap.first.attempt_id, overlap.second.attempt_id) == (c.id, d.id)


def test_closed_attempt_without_an_end_proves_no_overlap() -> None:
    """G10.2: a closed row with neither ``ended_at`` nor a duration has no known run; a
    zero-length run that starts inside another is not counted as an overlap."""
    long_run = attempt(started_at=T0, ended_at=T0 + 10, duration_s=10)
    unknown = attempt(
        worker_id="w2", started_at=T0 + 3, ended_at=None, duration_s=None, outcome=Outcome.RELEASED
    )
    run = run_of(unknown, now=T0 + 100)
    assert run is not None
    assert run.ended_at == run.started_at
    assert find_overlaps([long_run, unknown], {1: job()}, now=T0 + 100) == []


def test_every_intersecting_pair_is_reported_earliest_first() -> None:
    """G10.2: a long run overlapping two later ones gives two pairs; runs that merely follow
    each other, or start after the long one ended, give none."""
    long_run = attempt(started_at=T0, ended_at=T0 + 10, duration_s=10)
    b = attempt(worker_id="w2", started_at=T0 + 1, ended_at=T0 + 2, duration_s=1)
    c = attempt(worker_id="w3", started_at=T0 + 5, ended_at=T0 + 6, duration_s=1)
    later = attempt(worker_id="w4", started_at=T0 + 11, ended_at=T0 + 12, duration_s=1)

    found = find_overlaps([later, c, b, long_run], {1: job()}, now=T0 + 20)

    assert [(o.first.attempt_id, o.second.attempt_id) for o in found] == [
        (long_run.id, b.id),
        (long_run.id, c.id),
    ]


def _run(attempt_id: int, started_at: float, ended_at: float, fence: int | None) -> Run:
    return Run(
        attempt_id=attempt_id,
        job_id=1,
        attempt=attempt_id,
        worker_id=f"w{attempt_id}",
        lease_token=f"t{attempt_id}",
        lock_owner=None,
        fence=fence,
        outcome=Outcome.COMPLETED,
        started_at=started_at,
        ended_at=ended_at,
    )


def test_lock_ttl_shorter_than_the_job_is_the_cause_when_the_lease_was_long_enough() -> None:
    """G10.2 causes: a lease longer than the run and a lock TTL shorter than it point at the lock,
    with both fences named."""
    first, second = _run(1, T0, T0 + 5, fence=1), _run(2, T0 + 2, T0 + 3, fence=2)
    locked = job(visibility_timeout_s=60.0, resource_key="order:1", lock_ttl_s=2.0)
    [cause] = likely_causes(first, second, locked)
    assert cause.startswith("lock TTL shorter than the job: lock_ttl_s=2 on 'order:1'")
    assert "fence 1 then 2" in cause


def test_overlap_within_lease_and_lock_is_unexplained_and_a_missing_job_unknown() -> None:
    """G10.2 causes: nothing in the job explains it (say so); no job row, no judgement."""
    first, second = _run(1, T0, T0 + 5, fence=1), _run(2, T0 + 2, T0 + 3, fence=2)
    locked = job(visibility_timeout_s=60.0, resource_key="order:1", lock_ttl_s=60.0)
    [cause] = likely_causes(first, second, locked)
    assert cause.startswith("unexplained")
    [cause] = likely_causes(first, second, None)
    assert cause.startswith("unknown: the job row is gone")


# -- G10.3 durations -----------------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    """G10.3: p50/p95/p99/max of 1..100 are 50, 95, 99 and 100; one value is every percentile;
    no value is an error."""
    values = [float(n) for n in range(1, 101)]
    assert [percentile(values, p) for p in (50, 95, 99, 100)] == [50.0, 95.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_no_measured_runs_means_no_duration_report() -> None:
    """G10.3, "no data": no attempts, or only ones without a measured handler run."""
    assert task_durations([], {}) == []
    unmeasured = [
        attempt(outcome=Outcome.RUNNING, ended_at=None, duration_s=None),
        attempt(outcome=Outcome.LOST, duration_s=None),
        attempt(outcome=Outcome.DEFERRED, duration_s=0.01),
        attempt(outcome=Outcome.ALREADY_PROCESSED, duration_s=0.01),
        attempt(outcome=Outcome.RELEASED, duration_s=0.5),
    ]
    assert task_durations(unmeasured, {1: job()}) == []


def test_durations_count_every_run_of_the_handler_including_refused_stale_ones() -> None:
    """G10.3: completed, retried, buried and refused deliveries all ran the handler; the task's
    timeouts are the shortest among its jobs."""
    attempts = [
        attempt(job_id=1, duration_s=1.0),
        attempt(job_id=1, duration_s=2.0, outcome=Outcome.RETRY),
        attempt(job_id=2, duration_s=3.0, outcome=Outcome.DEAD),
        attempt(job_id=2, duration_s=4.0, outcome=Outcome.FENCE_REFUSED),
        attempt(job_id=3, duration_s=9.0, outcome=Outcome.LEASE_REFUSED),
        attempt(job_id=4, task="other", duration_s=0.1),
    ]
    jobs = {
        1: job(id=1, visibility_timeout_s=60.0, resource_key="r:1", lock_ttl_s=40.0),
        2: job(id=2, visibility_timeout_s=45.0, resource_key="r:2", lock_ttl_s=50.0),
        3: job(id=3, visibility_timeout_s=90.0),
    }

    other, sync = task_durations(attempts, jobs)  # by task name

    assert (sync.task, sync.runs) == ("sync", 5)
    assert (sync.p50_s, sync.p95_s, sync.p99_s, sync.max_s) == (3.0, 9.0, 9.0, 9.0)
    assert (sync.visibility_timeout_s, sync.lock_ttl_s) == (45.0, 40.0)
    assert sync.advice == ()
    # Job 4 was never read (purged): its timeouts are unknown, so nothing is advised.
    assert (other.task, other.runs, other.visibility_timeout_s, other.lock_ttl_s) == (
        "other",
        1,
        None,
        None,
    )
    assert other.advice == ()


def stats(**fields: Any) -> TaskDurations:
    """A distribution of 100 runs: p50 1 s, p95 2 s, p99 4 s, max 5 s, 30 s lease, no lock."""
    values: dict[str, Any] = {
        "task": "sync",
        "runs": 100,
        "p50_s": 1.0,
        "p95_s": 2.0,
        "p99_s": 4.0,
        "max_s": 5.0,
        "visibility_timeout_s": 30.0,
        "lock_ttl_s": None,
        "lease_refused": 0,
        "lock_lost": 0,
        "advice": (),
    }
    values.update(fields)
    return TaskDurations(**values)


def test_timeout_below_the_longest_run_is_a_problem_with_a_recommended_value() -> None:
    """G10.3, : a visibility timeout under the max duration is a problem once a delivery was
    refused for a stale lease; the advice names a value above both twice p99 and the max,
    says how many renewals may be missed, and suggests a queue of its own."""
    [advice] = advise(stats(visibility_timeout_s=4.5, runs=5, lease_refused=1))
    assert advice.severity == Severity.PROBLEM
    assert "renews it every 1.50 s, so 2 missed renewals in a row" in advice.message
    assert "1 delivery was refused after it expired" in advice.message
    assert advice.setting == "visibility_timeout_s"
    assert advice.recommended_s == recommended_s(4.0, 5.0) == 9.0
    assert "raise visibility_timeout_s to at least 9" in advice.message
    assert "their own queue" in advice.message


def test_timeout_below_the_longest_run_kept_alive_by_the_heartbeat_is_only_a_hint() -> None:
    """Runs longer than the timeout with no delivery refused lived on the heartbeat, as
    docs/operations.md recommends for a long task on its own queue: a hint, not a problem."""
    [advice] = advise(stats(visibility_timeout_s=4.5, runs=5))
    assert (advice.severity, advice.setting) == (Severity.HINT, "visibility_timeout_s")
    assert "no delivery lost it, so the heartbeat kept up" in advice.message
    [advice] = advise(stats(visibility_timeout_s=6.0, runs=5))
    assert advice.severity == Severity.HINT


def test_timeout_near_p99_is_a_warning_and_a_comfortable_one_says_nothing() -> None:
    """G10.3: above the max but under HEADROOM x p99 warns; at or above it, no advice."""
    [advice] = advise(stats(visibility_timeout_s=6.0, runs=5, lease_refused=2))
    assert advice.severity == Severity.WARNING
    assert advice.recommended_s == 9.0
    assert f"less than {HEADROOM:g}x the p99 duration (4.00 s)" in advice.message
    assert advise(stats(visibility_timeout_s=HEADROOM * 4.0)) == ()


def test_lock_ttl_is_judged_like_the_visibility_timeout() -> None:
    """The lock TTL gets its own advice, judged on deliveries that lost their lock; the
    advice says the lock, not the job, passes to another worker; no lock (``None``) gets none."""
    [advice] = advise(stats(visibility_timeout_s=60.0, lock_ttl_s=3.0, runs=5, lock_lost=1))
    assert (advice.severity, advice.setting) == (Severity.PROBLEM, "lock_ttl_s")
    assert "the lock, not the job, passes to another worker" in advice.message
    assert "renews it every 1.00 s, so 2 missed renewals in a row" in advice.message
    [advice] = advise(stats(visibility_timeout_s=60.0, lock_ttl_s=7.0, runs=5, lock_lost=1))
    assert (advice.severity, advice.setting) == (Severity.WARNING, "lock_ttl_s")
    [advice] = advise(stats(visibility_timeout_s=60.0, lock_ttl_s=3.0, runs=5, lease_refused=1))
    assert (advice.severity, advice.setting) == (Severity.HINT, "lock_ttl_s")
    assert advise(stats(visibility_timeout_s=60.0, lock_ttl_s=None)) == ()


def host_headers(host: str, timeout_s: Any) -> str:
    return json.dumps({"jobguard.host": host, "jobguard.host_timeout_s": timeout_s})


def test_a_host_task_is_judged_against_its_hosts_limit_not_its_shadow_lease() -> None:
    """A guarded Celery task whose runs outlast the broker's 2 s visibility timeout is a
    problem though its shadow job's lease (renewed by the heartbeat) is comfortable; each run
    longer than the limit is counted as evidence, and the finding names Celery's setting."""
    attempts = [attempt(job_id=n, duration_s=d) for n, d in ((1, 0.5), (2, 5.0), (3, 5.2))]
    jobs = {
        n: job(id=n, visibility_timeout_s=60.0, headers=host_headers("celery", 2))
        for n in (1, 2, 3)
    }
    (stats,) = task_durations(attempts, jobs)
    assert stats.host_limit is not None
    assert (stats.host_limit.host, stats.host_limit.timeout_s) == ("celery", 2.0)
    assert stats.host_outlasted == 2
    (advice,) = stats.advice
    assert (advice.severity, advice.setting) == (Severity.PROBLEM, "host_timeout")
    assert "celery's broker_transport_options['visibility_timeout']=2 is below" in advice.message
    assert "2 runs outlasted it" in advice.message
    assert advice.recommended_s == recommended_s(5.2, 5.2)
    (finding,) = timeout_findings([stats])
    assert (finding.kind, finding.numbers["timeout_s"], finding.numbers["refused"]) == (
        Kind.LEASE,
        2.0,
        2,
    )


def test_a_host_limit_with_room_says_nothing_even_over_a_short_shadow_lease() -> None:
    """RQ's job timeout far above the runs: no advice, although the shadow lease is below the
    longest run and a delivery was refused on it (that would be a problem for a task of
    jobguard's own); a limit near p99 warns, naming the host's setting."""
    attempts = [attempt(job_id=1, duration_s=5.0), attempt(job_id=1, duration_s=4.0)]
    attempts.append(attempt(job_id=1, duration_s=None, outcome=Outcome.LEASE_REFUSED))
    short_lease = job(id=1, visibility_timeout_s=3.0, headers=host_headers("rq", 180))
    (stats,) = task_durations(attempts, {1: short_lease})
    assert stats.lease_refused == 1
    assert stats.advice == ()
    near = job(id=1, visibility_timeout_s=3.0, headers=host_headers("dramatiq", 6))
    (stats,) = task_durations(attempts, {1: near})
    (advice,) = stats.advice
    assert (advice.severity, advice.setting) == (Severity.WARNING, "host_timeout")
    assert "dramatiq's time_limit=6 is less than 2x the p99" in advice.message


@pytest.mark.parametrize(
    "headers",
    [None, "not json", "[1]", json.dumps({"jobguard.host_id": "m1"}), host_headers("celery", 0),
     host_headers("celery", "2"), host_headers("sidekiq", 2), host_headers("rq", True)],
)  # fmt: skip
def test_headers_without_a_usable_host_limit_leave_the_shadow_lease_judged(
    headers: str | None,
) -> None:
    """A job of jobguard's own, a host reporting no limit, or stored headers that do not hold a
    usable one: the task is judged on its lease as before."""
    attempts = [attempt(duration_s=5.0), attempt(duration_s=None, outcome=Outcome.LEASE_REFUSED)]
    (stats,) = task_durations(attempts, {1: job(visibility_timeout_s=3.0, headers=headers)})
    assert stats.host_limit is None
    assert [a.setting for a in stats.advice] == ["visibility_timeout_s"]


def test_long_tail_hint_needs_a_timeout_finding_and_enough_runs() -> None:
    """G10.3 / G2.3: "move slow jobs to their own queue" follows a timeout finding on a task whose
    slowest runs take many times its median, once there are enough runs to tell."""
    problem, hint = advise(stats(visibility_timeout_s=4.5, runs=10, lease_refused=1))
    assert problem.severity == Severity.PROBLEM
    assert (hint.severity, hint.setting) == (Severity.HINT, "queue")
    assert "queue_visibility_timeouts_s={'slow': 9}" in hint.message
    few = stats(visibility_timeout_s=4.5, runs=9, lease_refused=1)
    assert [a.severity for a in advise(few)] == [Severity.PROBLEM]
    assert advise(stats(visibility_timeout_s=60.0, p50_s=0.1, runs=1000)) == ()
    narrow = stats(visibility_timeout_s=4.5, p50_s=4.0, runs=1000, lease_refused=1)
    assert [a.severity for a in advise(narrow)] == [Severity.PROBLEM]


def test_recommended_timeout_is_a_whole_second_above_both_bounds() -> None:
    """G10.3: twice p99 when that dominates, else just above the longest run."""
    assert recommended_s(p99_s=2.0, max_s=3.0) == 5.0
    assert recommended_s(p99_s=1.0, max_s=7.5) == 8.0
    assert recommended_s(p99_s=0.001, max_s=0.002) == 1.0
    assert all(
        recommended_s(p, m) > max(HEADROOM * p, m)
        and recommended_s(p, m) == math.floor(recommended_s(p, m))
        for p, m in ((0.3, 0.4), (1.5, 3.0), (10.0, 10.0))
    )


# -- G10.4 retries and repeating errors ----------------------------------------------------------


def test_no_runs_means_no_retry_report() -> None:
    """G10.4, "no data": nothing ran the handler to a verdict."""
    assert retry_rates([]) == []
    assert retry_rates([attempt(outcome=Outcome.LOST), attempt(outcome=Outcome.DEFERRED)]) == []


def test_retry_rate_counts_retries_over_runs_per_task() -> None:
    """G10.4: only completed, retry and dead are runs; the rate is retries over runs."""
    outcomes = [Outcome.RETRY] * 3 + [Outcome.DEAD] + [Outcome.COMPLETED] * 6
    attempts = [attempt(started_at=T0 + n, outcome=outcome) for n, outcome in enumerate(outcomes)]
    attempts += [attempt(outcome=Outcome.LEASE_REFUSED), attempt(task="other")]

    other, sync_rates = retry_rates(attempts)  # by task name

    assert (sync_rates.task, sync_rates.runs, sync_rates.retries, sync_rates.dead) == (
        "sync",
        10,
        3,
        1,
    )
    assert sync_rates.retry_rate == pytest.approx(0.3)
    assert sync_rates.recent_runs == 10
    assert sync_rates.spike
    assert (other.task, other.runs, other.retry_rate, other.spike) == ("other", 1, 0.0, False)


def test_spike_is_judged_on_the_most_recent_runs_with_enough_of_them() -> None:
    """G10.4: many retries long ago are no spike now; a burst of retries among few runs is not
    judged; recent retries among enough runs are."""
    old_trouble = [
        attempt(started_at=T0 + n, outcome=Outcome.RETRY if n < 10 else Outcome.COMPLETED)
        for n in range(20)
    ]
    [calm] = retry_rates(old_trouble, recent_runs=10)
    assert calm.retry_rate == 0.5
    assert (calm.recent_runs, calm.recent_failure_rate, calm.spike) == (10, 0.0, False)

    few = [attempt(started_at=T0 + n, outcome=Outcome.RETRY) for n in range(4)]
    [unjudged] = retry_rates(few)
    assert (unjudged.recent_failure_rate, unjudged.spike) == (1.0, False)

    rising = old_trouble[10:] + [
        attempt(started_at=T0 + 100 + n, outcome=Outcome.RETRY) for n in range(3)
    ]
    [spike] = retry_rates(rising, recent_runs=10, spike_rate=0.25, min_runs=5)
    assert (spike.recent_failure_rate, spike.spike) == (pytest.approx(0.3), True)


def test_signature_follows_the_stack_not_the_message() -> None:
    """G10.4 / G8.2: one stack trace is one signature whatever ids its message carries; another
    line or class is another signature; the innermost frame is where it struck."""
    first, where = signature_of("TimeoutError", "order 17", traceback_text(40))
    again, _ = signature_of("TimeoutError", "order 18", traceback_text(40))
    elsewhere, _ = signature_of("TimeoutError", "order 17", traceback_text(41))
    other_type, _ = signature_of("ValueError", "order 17", traceback_text(40))
    assert first == again
    assert len({first, elsewhere, other_type}) == 3
    assert where == "erp.py:40 in fetch"


def test_signature_without_a_traceback_uses_the_message_prefix_with_digits_masked() -> None:
    """G10.4: errors raised before the handler (no traceback) group by class and message
    prefix, so ``order 17`` and ``order 18`` are one error and ``bad payload`` another."""
    a, where = signature_of("Unrunnable", "order 17 has no handler", None)
    b, _ = signature_of("Unrunnable", "order 18 has no handler", None)
    c, _ = signature_of("Unrunnable", "bad payload", None)
    assert where is None
    assert a == b != c


def test_no_failures_means_no_repeating_errors() -> None:
    """G10.4, "no data": no failed attempt, failures seen only once, or without an error class."""
    assert repeated_errors([]) == []
    once = attempt(outcome=Outcome.RETRY, error_type="KeyError", traceback=traceback_text(5))
    assert repeated_errors([attempt(), once]) == []
    unnamed = [attempt(outcome=Outcome.RETRY, error_type=None) for _ in range(3)]
    assert repeated_errors(unnamed) == []


def test_repeating_error_groups_count_attempts_jobs_and_name_poison_candidates() -> None:
    """G10.4: one stack trace failing job 4 three times is a poison candidate; the same trace on
    several jobs once each is a repeating error but not poison; refusals are not errors."""
    poison = [
        attempt(
            job_id=4,
            started_at=T0 + n,
            outcome=Outcome.RETRY if n < 2 else Outcome.DEAD,
            error_type="TimeoutError",
            error_message=f"order 4 try {n}",
            traceback=traceback_text(40),
        )
        for n in range(3)
    ]
    spread = [
        attempt(
            job_id=job_id,
            started_at=T0 + 10 + job_id,
            outcome=Outcome.RETRY,
            error_type="KeyError",
            error_message="'sku'",
            traceback=traceback_text(77, "KeyError: 'sku'"),
        )
        for job_id in (10, 11, 12, 13)
    ]
    refused = [
        attempt(outcome=Outcome.LEASE_REFUSED, error_type="LeaseLostError", error_message="x")
        for _ in range(5)
    ]

    spread_group, poison_group = repeated_errors([*poison, *spread, *refused])

    assert (spread_group.error_type, spread_group.attempts, spread_group.jobs) == ("KeyError", 4, 4)
    assert spread_group.job_ids == (10, 11, 12, 13)
    assert (spread_group.max_per_job, spread_group.poison, spread_group.dead) == (1, False, 0)
    assert spread_group.where == "erp.py:77 in fetch"

    assert (poison_group.error_type, poison_group.attempts, poison_group.jobs) == (
        "TimeoutError",
        3,
        1,
    )
    assert (poison_group.job_ids, poison_group.max_per_job, poison_group.poison) == ((4,), 3, True)
    assert poison_group.dead == 1
    assert poison_group.message == "order 4 try 2"
    assert poison_group.last_seen_at == T0 + 2


def test_repeating_errors_are_per_task_and_only_the_top_ones_are_listed() -> None:
    """G10.4: one trace in two tasks is two groups; ``top`` keeps the most frequent; example job
    ids are the most affected first and at most five."""
    failures = [
        attempt(
            task=task,
            job_id=job_id,
            outcome=Outcome.RETRY,
            error_type="OSError",
            traceback=traceback_text(9),
        )
        for task, job_ids in (("a", [1, 1, 2, 3, 4, 5, 6]), ("b", [9, 9]))
        for job_id in job_ids
    ]
    [top] = repeated_errors(failures, top=1)
    assert (top.task, top.attempts, top.jobs) == ("a", 7, 6)
    assert top.job_ids == (1, 2, 3, 4, 5)
    assert [g.task for g in repeated_errors(failures)] == ["a", "b"]


# -- G10.5 audit ---------------------------------------------------------------------------------


def test_audit_of_nothing_is_all_zero() -> None:
    """G10.5, "no data"."""
    empty = audit([], [], {}, T0)
    assert (empty.completed_jobs_with_key, empty.operations_completed) == (0, 0)
    assert (empty.with_external_ref, empty.without_external_ref) == (0, 0)
    assert empty.by_task == empty.missing_records == empty.stuck_processing == ()


def test_audit_counts_external_references_and_lists_examples_only_for_mixed_tasks() -> None:
    """G10.5: per task, how many completed operations left an external reference; a task where
    some did and some did not names the ones that did not."""
    jobs = [
        job(id=1, task="email", operation_key="email:1"),
        job(id=2, task="email", operation_key="email:2"),
        job(id=3, task="email", operation_key="email:3"),
        job(id=4, task="stock", operation_key="stock:1"),
        job(id=5, task="plain", operation_key=None),
    ]
    operations = {
        "email:1": operation("email:1", external_ref="msg-1"),
        "email:2": operation("email:2", external_ref="msg-2"),
        "email:3": operation("email:3"),
        "stock:1": operation("stock:1"),
    }

    found = audit(jobs, jobs, operations, T0 + 10)

    assert found.completed_jobs_with_key == 4
    assert (found.operations_completed, found.with_external_ref, found.without_external_ref) == (
        4,
        2,
        2,
    )
    email, stock = found.by_task
    assert (email.task, email.completed, email.with_external_ref, email.without_external_ref) == (
        "email",
        3,
        2,
        1,
    )
    assert email.examples_without == ("email:3",)
    assert (stock.task, stock.without_external_ref, stock.examples_without) == ("stock", 1, ())
    assert found.missing_records == found.stuck_processing == ()


def test_audit_lists_completed_jobs_whose_operation_record_is_missing_or_not_completed() -> None:
    """G10.5, G4.3: a completed job with an operation key must have a completed record."""
    jobs = [
        job(id=1, operation_key="gone"),
        job(id=2, operation_key="half"),
        job(id=3, operation_key="ok"),
        job(id=4, operation_key="later", status=JobStatus.QUEUED),
    ]
    operations = {
        "gone": None,
        "half": operation("half", status=OperationStatus.FAILED),
        "ok": operation("ok"),
        "later": None,
    }
    assert audit(jobs, jobs, operations, T0 + 10).missing_records == (1, 2)


def test_audit_lists_operations_stuck_in_processing_that_nothing_will_finish() -> None:
    """G10.5: ``processing`` with no queued or running job for its key is stuck; a queued or
    running job (of any task, outside the window too) will finish it; a claim newer than the
    snapshot is not judged; failed records are not stuck."""
    processing = {"status": OperationStatus.PROCESSING, "completed_at": None}
    in_scope = [
        job(id=1, operation_key="dead-end", status=JobStatus.DEAD),
        job(id=2, operation_key="retrying", status=JobStatus.QUEUED),
        job(id=3, operation_key="fresh", status=JobStatus.DEAD),
        job(id=4, operation_key="failed", status=JobStatus.DEAD),
        job(id=5, operation_key="elsewhere", status=JobStatus.DEAD),
    ]
    outside = [job(id=9, task="other", operation_key="elsewhere", status=JobStatus.RUNNING)]
    operations = {
        "dead-end": operation("dead-end", **processing),
        "retrying": operation("retrying", **processing),
        "fresh": operation("fresh", **{**processing, "updated_at": T0 + 50}),
        "failed": operation("failed", status=OperationStatus.FAILED),
        "elsewhere": operation("elsewhere", **processing),
    }
    found = audit(in_scope, [*in_scope, *outside], operations, now=T0 + 10)
    assert found.stuck_processing == ("dead-end",)
    assert found.operations_completed == 0


# -- scope and the whole report -----------------------------------------------------------------


def test_scope_keeps_the_task_and_what_was_active_in_the_window() -> None:
    """``--task`` and ``--since-s``: attempts still running or ending inside the window count,
    jobs created or finished inside it count, and queued or running jobs always do."""
    assert attempt_in_scope(attempt(), task=None, since=None)
    assert not attempt_in_scope(attempt(task="other"), task="sync", since=None)
    assert attempt_in_scope(attempt(ended_at=T0 + 5), task="sync", since=T0 + 5)
    assert not attempt_in_scope(attempt(ended_at=T0 + 4), task=None, since=T0 + 5)
    assert attempt_in_scope(attempt(ended_at=None), task=None, since=T0 + 5)

    snapshot = Snapshot(now=T0 + 100, attempts=(), task="sync", since=T0 + 50)
    assert snapshot.job_in_scope(job(created_at=T0, finished_at=T0 + 60))
    assert not snapshot.job_in_scope(job(created_at=T0, finished_at=T0 + 40))
    assert snapshot.job_in_scope(job(status=JobStatus.QUEUED, finished_at=None))
    assert not snapshot.job_in_scope(job(task="other", status=JobStatus.QUEUED))
    snapshot = replace(snapshot, jobs={2: job(id=2), 1: job(id=1, task="other")})
    assert [j.id for j in replace(snapshot, since=None).jobs_in_scope()] == [2]


def test_diagnosis_of_an_empty_store_finds_nothing() -> None:
    """G10.2-G10.5, "no data": every section empty, no problem, no warning."""
    found = diagnose(Snapshot(now=T0, attempts=()))
    assert isinstance(found, Diagnosis)
    assert found.attempts == 0
    assert found.overlaps == found.durations == found.retries == found.errors == ()
    assert found.problems == found.warnings == []


def test_only_overlaps_and_timeouts_below_the_longest_run_are_problems() -> None:
    """``jobguard doctor`` exit code: overlaps and a timeout under the max duration are
    problems; a timeout near p99, a retry spike, a poison candidate, a missing operation record
    and a stuck operation are warnings."""
    overlapping = [
        attempt(
            job_id=1, started_at=T0, ended_at=T0 + 1, duration_s=3.0, outcome=Outcome.LEASE_REFUSED
        ),
        attempt(job_id=1, worker_id="w2", attempt=2, started_at=T0 + 1, ended_at=T0 + 2),
    ]
    failing = [
        attempt(
            task="flaky",
            job_id=2,
            operation_key="flaky:2",
            started_at=T0 + n,
            ended_at=T0 + n + 0.1,
            duration_s=0.1,
            outcome=Outcome.RETRY,
            error_type="OSError",
            traceback=traceback_text(3),
        )
        for n in range(5)
    ]
    jobs = {
        1: job(id=1, visibility_timeout_s=2.0),
        2: job(id=2, task="flaky", operation_key="flaky:2", status=JobStatus.DEAD),
        3: job(id=3, task="flaky", operation_key="flaky:3"),
    }
    operations = {
        "op:1": operation("op:1"),
        "flaky:2": operation("flaky:2", status=OperationStatus.PROCESSING),
        "flaky:3": None,
    }
    snapshot = Snapshot(
        now=T0 + 100, attempts=(*overlapping, *failing), jobs=jobs, operations=operations
    )

    found = diagnose(snapshot)

    assert len(found.overlaps) == 1
    assert len(found.problems) == 2
    assert found.problems[0].startswith(f"operation op:1: attempts {overlapping[0].id} and")
    assert "overlapped for 1.00 s; likely cause: lease shorter than the job" in found.problems[0]
    assert found.problems[1].startswith("task sync: visibility_timeout_s=2 is below the longest")
    warnings = "\n".join(found.warnings)
    assert "task flaky: visibility_timeout_s=30 is less than" not in warnings
    assert "task flaky: retry spike, 100% of the last 5 runs failed (5 retried, 0 buried)" in (
        warnings
    )
    assert (
        "task flaky: poison candidate OSError at erp.py:3 in fetch: job(s) 2 failed the same "
        "way 5 times"
    ) in warnings
    assert "job 3: completed with an operation key but no completed operation record" in warnings
    assert "operation flaky:2: stuck in processing with no queued or running job" in warnings


# -- findings: outages, crash loops, unstable keys, resources, completions ----------------------


def failure(job_id: int, at: float, outcome: Outcome = Outcome.RETRY, **fields: Any) -> Attempt:
    """A failed delivery of ``job_id`` at ``at`` with the ERP's timeout traceback."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "started_at": at,
        "ended_at": at + 0.1,
        "duration_s": 0.1,
        "outcome": outcome,
        "error_type": "TimeoutError",
        "error_message": f"order {job_id}",
        "traceback": traceback_text(40),
    }
    values.update(fields)
    return attempt(**values)


def test_many_jobs_failing_together_are_an_outage_not_poison() -> None:
    """Five jobs failing with one signature within the window are an outage; buried en masse it
    is a problem, retried only it is a warning; the same signature is then no poison candidate,
    however often each job failed."""
    buried = [
        failure(job_id, T0 + job_id + n, Outcome.DEAD if n == 2 else Outcome.RETRY)
        for job_id in range(1, 6)
        for n in range(3)
    ]
    [outage] = find_outages(buried)
    assert (outage.task, outage.failures, outage.retried, outage.dead) == ("sync", 15, 10, 5)
    assert outage.job_ids == outage.dead_job_ids == (1, 2, 3, 4, 5)
    dead = {n: job(id=n, status=JobStatus.DEAD) for n in range(1, 6)}
    [finding] = outage_findings([outage], dead)
    assert (finding.kind, finding.severity, finding.keys.job_ids) == (
        Kind.OUTAGE,
        Severity.PROBLEM,
        (1, 2, 3, 4, 5),
    )
    [replayed] = outage_findings([outage], {n: job(id=n) for n in range(1, 6)})
    assert replayed.severity == Severity.HINT
    [group] = repeated_errors(buried, outages={("sync", outage.signature)})
    assert (group.outage, group.poison, group.max_per_job) == (True, False, 3)
    assert poison_findings([group]) == []

    retried = [failure(job_id, T0 + job_id) for job_id in range(1, 6)]
    [warning] = outage_findings(find_outages(retried), {})
    assert warning.severity == Severity.WARNING


def test_failures_far_apart_or_on_few_jobs_are_no_outage() -> None:
    """A burst needs MIN_JOBS jobs within WINDOW_S of each other: the same error spread over
    hours, or one job failing again and again, is not an outage."""
    spread = [failure(job_id, T0 + job_id * (WINDOW_S + 1)) for job_id in range(1, 8)]
    assert find_outages(spread) == []
    one_job = [failure(4, T0 + n) for n in range(10)]
    assert find_outages(one_job) == []
    [group] = repeated_errors(one_job)
    [poison] = poison_findings([group])
    assert (poison.kind, poison.keys.job_ids) == (Kind.POISON, (4,))
    assert "job(s) 4 failed the same way 10 times" in poison.summary


def lost(job_id: int, worker: str, at: float) -> Attempt:
    """A delivery whose worker died: closed as lost, no duration."""
    return attempt(
        job_id=job_id, worker_id=worker, started_at=at, duration_s=None, outcome=Outcome.LOST
    )


def test_the_job_present_at_every_crash_is_the_culprit_and_the_others_collateral() -> None:
    """Job 1 was lost in three workers' crashes, jobs 2, 3 and 4 in one or two of them: job 1 is
    the culprit, the others collateral; a crash with no repeat (job 9) is no loop."""
    attempts = [
        lost(1, "w1", T0),
        lost(2, "w1", T0),
        lost(1, "w2", T0 + 2),
        lost(3, "w2", T0 + 2),
        lost(2, "w2", T0 + 2),
        lost(1, "w3", T0 + 4),
        lost(4, "w3", T0 + 4),
        lost(9, "w9", T0 + 9),
        attempt(job_id=5, worker_id="w3", outcome=Outcome.COMPLETED),
    ]
    jobs = {1: job(id=1, task="crash", status=JobStatus.DEAD), 2: job(id=2)}
    [loop] = find_crash_loops(attempts, jobs)
    assert (loop.task, loop.culprit_job_ids, loop.collateral_job_ids) == ("crash", (1,), (2, 3, 4))
    assert (loop.workers, loop.buried_job_ids) == (("w1", "w2", "w3"), (1,))
    [finding] = crash_findings([loop])
    assert (finding.kind, finding.severity) == (Kind.CRASH_LOOP, Severity.PROBLEM)
    assert (finding.keys.job_ids, finding.keys.other_job_ids) == ((1,), (2, 3, 4))


def test_workers_killed_once_each_are_no_crash_loop() -> None:
    """A few workers killed, each with different jobs, recovered by the leases: nothing."""
    attempts = [lost(1, "w1", T0), lost(2, "w1", T0), lost(3, "w2", T0 + 1)]
    assert find_crash_loops(attempts, {}) == []
    stalled = attempt(job_id=1, worker_id="w3", duration_s=5.0, outcome=Outcome.LOST)
    assert find_crash_loops([lost(1, "w1", T0), stalled], {}) == []


def test_dedup_keys_that_differ_only_in_a_timestamp_or_a_fresh_id_are_unstable() -> None:
    """Keys with an epoch time, a UUID or an ISO time in them are unstable; keys that differ
    in an order id, or in a calendar date (a period), are not."""
    jobs = [
        job(id=1, task="mail", dedup_key="mail:7:1733051234.125", operation_key=None),
        job(id=2, task="mail", dedup_key="mail:7:1733051299.5", operation_key=None),
        job(id=3, task="ping", dedup_key="ping:c9f1e5a2-0d1b-4b8e-9a51-3c3f0e2b7d11"),
        job(id=4, task="ping", dedup_key="ping:0d6f5f0e-7e0a-4a55-8f14-2b8e1e6a2c90"),
        job(id=5, task="sync", dedup_key="sync:2026-12-01T10:00:00Z", operation_key=None),
        job(id=6, task="sync", dedup_key="sync:2026-12-01T10:05:00Z", operation_key=None),
        job(id=7, task="order", dedup_key="order:1"),
        job(id=8, task="order", dedup_key="order:2"),
        job(id=9, task="daily", dedup_key="daily:2026-12-01"),
        job(id=10, task="daily", dedup_key="daily:2026-12-02"),
        job(id=11, task="mail", dedup_key="mail:8:1733051234", operation_key=None),
    ]
    mail, ping, sync = unstable_keys(jobs)
    assert (mail.task, mail.pattern, mail.job_ids, mail.absorbed) == (
        "mail",
        "mail:7:<volatile>",
        (1, 2),
        False,
    )
    assert (ping.pattern, ping.job_ids, ping.absorbed) == ("ping:<volatile>", (3, 4), True)
    assert (sync.job_ids, sync.absorbed) == ((5, 6), False)
    severity = {f.task: f.severity for f in dedup_findings([], [mail, ping, sync])}
    assert severity == {
        "mail": Severity.PROBLEM,
        "ping": Severity.WARNING,
        "sync": Severity.PROBLEM,
    }


def test_an_operation_key_carried_by_several_jobs_is_a_split_operation() -> None:
    """Two jobs of one operation key are named with their ids; one job per key is fine."""
    jobs = [job(id=3), job(id=1), job(id=2, operation_key="op:2")]
    [split] = split_operations(jobs)
    assert (split.operation_key, split.job_ids) == ("op:1", (1, 3))
    [finding] = dedup_findings([split], [])
    assert (finding.kind, finding.severity) == (Kind.SPLIT_OPERATION, Severity.WARNING)


def _busy(job_id: int, at: float, task: str = "touch") -> Attempt:
    return attempt(
        job_id=job_id,
        task=task,
        started_at=at,
        ended_at=at + 0.001,
        duration_s=0.001,
        outcome=Outcome.DEFERRED,
        error_type="ResourceBusy",
        error_message="resource is busy: ledger:1",
    )


def test_a_short_task_waiting_behind_another_tasks_long_hold_is_starved() -> None:
    """Deferrals, wait against run time and the longest holder, per resource key and task: the
    short task behind the long one is starved; the long one, and a task contending only with
    itself, are not."""
    jobs = {
        1: job(id=1, task="report", resource_key="ledger:1"),
        2: job(id=2, task="touch", resource_key="ledger:1"),
        3: job(id=3, task="touch", resource_key="ledger:1"),
        4: job(id=4, task="self", resource_key="own:1"),
        5: job(id=5, task="self", resource_key="own:1"),
    }
    attempts = [
        attempt(job_id=1, task="report", started_at=T0, ended_at=T0 + 3, duration_s=3.0),
        *(_busy(job_id, T0 + n * 0.5) for job_id in (2, 3) for n in range(4)),
        attempt(job_id=2, task="touch", started_at=T0 + 3, ended_at=T0 + 3.01, duration_s=0.01),
        attempt(job_id=3, task="touch", started_at=T0 + 3, ended_at=T0 + 3.01, duration_s=0.01),
        attempt(job_id=4, task="self", started_at=T0, ended_at=T0 + 3, duration_s=3.0),
        *(_busy(5, T0 + n * 0.5, task="self") for n in range(6)),
        attempt(job_id=5, task="self", started_at=T0 + 3, ended_at=T0 + 6, duration_s=3.0),
    ]
    uses = {(u.resource_key, u.task): u for u in resource_use(attempts, jobs, T0 + 10)}
    touch = uses[("ledger:1", "touch")]
    assert (touch.jobs, touch.deferrals, touch.longest_holder, touch.starved) == (
        2,
        8,
        "report",
        True,
    )
    assert touch.wait_s == pytest.approx(6.0)
    assert touch.run_s == pytest.approx(0.02)
    assert not uses[("ledger:1", "report")].starved
    assert not uses[("own:1", "self")].starved
    [finding] = resource_findings(uses.values(), [], [], jobs, [])
    assert (finding.kind, finding.task, finding.keys.resource_keys) == (
        Kind.STARVATION,
        "touch",
        ("ledger:1",),
    )


def test_slot_contention_counts_slot_busy_deferrals_per_concurrency_key_and_task() -> None:
    """The same contention for concurrency keys, from the deferrals that found every slot
    held (not those of a busy resource lock); the key's limit is the smallest its jobs were
    enqueued with."""
    slotted = {"concurrency_key": "api:acme"}
    jobs = {
        1: job(id=1, task="sync", concurrency_limit=2, **slotted),
        2: job(id=2, task="sync", concurrency_limit=1, **slotted),
        3: job(id=3, task="touch", concurrency_limit=1, resource_key="ledger:1", **slotted),
        4: job(id=4, task="plain"),
    }
    slot_busy = {
        "outcome": Outcome.DEFERRED,
        "error_type": "ResourceBusy",
        "error_message": "concurrency limit reached: 1 running for api:acme",
    }
    attempts = [
        attempt(job_id=1, task="sync", started_at=T0, ended_at=T0 + 2, duration_s=2.0),
        attempt(job_id=2, task="sync", started_at=T0, ended_at=T0 + 0.001, **slot_busy),
        attempt(job_id=2, task="sync", started_at=T0 + 2, ended_at=T0 + 3, duration_s=1.0),
        _busy(3, T0 + 0.5),  # its resource lock was busy: not a slot's deferral
        attempt(job_id=3, task="touch", started_at=T0 + 4, ended_at=T0 + 4.5, duration_s=0.5),
        attempt(job_id=4, task="plain", started_at=T0, ended_at=T0 + 1, duration_s=1.0),
    ]
    uses = {(u.concurrency_key, u.task): u for u in slot_use(attempts, jobs, T0 + 10)}
    assert set(uses) == {("api:acme", "sync"), ("api:acme", "touch")}
    sync = uses[("api:acme", "sync")]
    assert (sync.limit, sync.jobs, sync.deferrals, sync.longest_holder) == (1, 2, 1, "sync")
    assert sync.wait_s == pytest.approx(2.0)
    assert sync.run_s == pytest.approx(3.0)
    assert sync.longest_hold_s == pytest.approx(2.0)
    assert (uses[("api:acme", "touch")].deferrals, uses[("api:acme", "touch")].wait_s) == (0, 0)


def test_a_slot_overrun_is_more_runs_at_once_than_the_limit_after_a_lost_slot() -> None:
    """Under a concurrency key with a limit of 2, a third operation running while a delivery
    that lost its slot ran on is an overrun, reported once while it lasts; runs that only touch
    at a hand-over, a crashed delivery, a stale and a fresh delivery of one operation, and more
    runs within the limit are not."""

    def slotted(job_id: int, limit: int = 2) -> Job:
        return job(
            id=job_id,
            operation_key=f"op:{job_id}",
            concurrency_key="api",
            concurrency_limit=limit,
            lock_ttl_s=1.0,
        )

    jobs = {n: slotted(n) for n in (1, 2, 3, 4)}

    def ran(job_id: int, start: float, end: float, **fields: Any) -> Attempt:
        return attempt(
            job_id=job_id,
            operation_key=f"op:{job_id}",
            started_at=T0 + start,
            ended_at=T0 + end,
            duration_s=end - start,
            **fields,
        )

    stale = ran(1, 0, 5, outcome=Outcome.FENCE_REFUSED)
    other = ran(2, 0.5, 4)
    third = ran(3, 2, 3)  # took the slot stale lost: three at once for 1 s
    fourth = ran(4, 2.5, 3.5)  # still during the same overrun: not a second one
    [overrun] = find_slot_overruns([stale, other, third, fourth], jobs, T0 + 10)
    assert (overrun.concurrency_key, overrun.limit) == ("api", 2)
    assert [r.attempt_id for r in overrun.runs] == [stale.id, other.id, third.id]
    assert overrun.operation_keys == ("op:1", "op:2", "op:3")
    assert overrun.overrun_s == pytest.approx(1.0)
    [finding] = [
        f for f in resource_findings([], [], [], jobs, [overrun]) if f.kind == Kind.SLOT_OVERRUN
    ]
    assert finding.keys.attempt_ids == (stale.id, other.id, third.id)
    assert finding.numbers == {"limit": 2, "runs": 3, "overrun_s": 1.0}
    assert "where its limit is 2" in finding.summary

    handed = replace(stale, outcome=Outcome.COMPLETED, ended_at=T0 + 2.1, duration_s=2.1)
    assert find_slot_overruns([handed, other, third], jobs, T0 + 10) == []
    crashed = replace(stale, outcome=Outcome.LOST, duration_s=None)
    assert find_slot_overruns([crashed, other, third], jobs, T0 + 10) == []
    again = ran(1, 2, 3)  # the same operation as stale, delivered again: one slot's work
    assert find_slot_overruns([stale, other, again], jobs, T0 + 10) == []
    roomy = {n: slotted(n, limit=3) for n in (1, 2, 3)}
    assert find_slot_overruns([stale, other, third], roomy, T0 + 10) == []


def test_a_resource_overlap_needs_a_first_delivery_that_lost_its_lock() -> None:
    """Two operations under one resource key overlap when the first ran on after losing its lock
    (refused); a completed first that merely touches the next lease (leased a moment before it
    took the lock) is a hand-over; a crashed delivery proves nothing."""
    jobs = {
        1: job(id=1, operation_key="a", resource_key="r", lock_ttl_s=1.0),
        2: job(id=2, operation_key="b", resource_key="r", lock_ttl_s=1.0),
    }
    stale = attempt(
        job_id=1,
        operation_key="a",
        fence=1,
        started_at=T0,
        ended_at=T0 + 3,
        duration_s=3.0,
        outcome=Outcome.FENCE_REFUSED,
    )
    fresh = attempt(
        job_id=2, operation_key="b", fence=2, started_at=T0 + 1.5, ended_at=T0 + 2, duration_s=0.5
    )
    [overlap] = find_resource_overlaps([stale, fresh], jobs, T0 + 10)
    assert (overlap.resource_key, overlap.first.attempt_id, overlap.second.attempt_id) == (
        "r",
        stale.id,
        fresh.id,
    )
    assert overlap.cause.startswith("lock TTL shorter than the job: lock_ttl_s=1")
    handed = replace(stale, outcome=Outcome.COMPLETED, ended_at=T0 + 1.6, duration_s=1.6)
    assert find_resource_overlaps([handed, fresh], jobs, T0 + 10) == []
    crashed = replace(stale, outcome=Outcome.LOST, duration_s=None)
    assert find_resource_overlaps([crashed, fresh], jobs, T0 + 10) == []
    kinds = [f.kind for f in resource_findings([], [overlap], fence_refusals([stale]), jobs, [])]
    assert kinds == [Kind.RESOURCE_OVERLAP, Kind.FENCE_REFUSED]


def test_a_fence_refusal_names_the_resource_and_the_concurrency_key_its_jobs_held() -> None:
    """A fence guards a lock and a slot alike: the finding names each job's resource key and
    concurrency key, not a resource that is not there."""
    jobs = {
        1: job(id=1, task="t", resource_key="order:1"),
        2: job(id=2, task="t", concurrency_key="api:acme", concurrency_limit=2),
    }
    refused = [
        attempt(job_id=job_id, task="t", fence=1, outcome=Outcome.FENCE_REFUSED)
        for job_id in (1, 2)
    ]
    [finding] = resource_findings([], [], fence_refusals(refused), jobs, [])
    assert finding.kind == Kind.FENCE_REFUSED
    assert "lost its lock or slot" in finding.summary
    assert "resource(s) order:1; concurrency key(s) api:acme" in finding.summary
    [only_lock] = resource_findings([], [], fence_refusals(refused[:1]), jobs, [])
    assert "lost the resource lock" in only_lock.summary
    assert only_lock.summary.endswith("(job(s) 1, resource(s) order:1)")


def test_completions_with_fewer_steps_than_usual_are_named() -> None:
    """The usual step count is the most common among completions; fewer is short; a task whose
    completions vary half and half, or with too few completions, is not judged."""
    attempts = [
        *(attempt(job_id=n, steps_run=3) for n in range(1, 6)),
        attempt(job_id=6, steps_run=1, steps_skipped=0),
        attempt(job_id=7, steps_run=1, steps_skipped=2),  # a retry: skipped steps count
        *(attempt(task="even", job_id=n, steps_run=n % 2) for n in range(4)),
        attempt(task="few", job_id=9, steps_run=0),
        attempt(task="few", job_id=10, steps_run=3),
    ]
    [short] = short_completions(attempts)
    assert (short.task, short.usual_steps, short.short, short.job_ids) == ("sync", 3, 1, (6,))
    empty = audit([], [], {}, T0)
    [finding] = completion_findings([short], empty)
    assert (finding.kind, finding.severity, finding.keys.job_ids) == (
        Kind.SHORT_COMPLETION,
        Severity.WARNING,
        (6,),
    )


def test_most_completions_stopping_partway_through_the_full_run_are_short() -> None:
    """When most completions stopped partway (a swallowed error during an outage), the fullest
    run a quarter of them made is the usual one: the others recorded only steps the full runs
    recorded too, so they are short. Completions that took another branch (a step the full runs
    never recorded) are not."""
    full = {"render": 1, "send": 2}
    attempts = [attempt(job_id=n, operation_key=f"op:{n}", steps_run=2) for n in range(1, 4)]
    attempts += [attempt(job_id=n, operation_key=f"op:{n}", steps_run=1) for n in range(4, 8)]
    operations = {f"op:{n}": operation(f"op:{n}", steps=full) for n in range(1, 4)}
    operations.update({f"op:{n}": operation(f"op:{n}", steps={"render": 1}) for n in range(4, 8)})
    assert short_completions(attempts) == []  # by counts alone, the short ones are the usual
    [short] = short_completions(attempts, operations)
    assert (short.usual_steps, short.job_ids, short.fewest_steps) == (2, (4, 5, 6, 7), 1)

    operations.update({f"op:{n}": operation(f"op:{n}", steps={"skip": 1}) for n in range(4, 8)})
    assert short_completions(attempts, operations) == []


def test_audit_examples_are_the_most_recent_in_numeric_order() -> None:
    """Examples of operations without an external reference: the five most recent, listed
    op:2 before op:10; a task where most have a reference gets a warning."""
    keys = [f"op:{n}" for n in range(1, 13)]
    jobs = [job(id=n, operation_key=key) for n, key in enumerate(keys, start=1)]
    jobs += [job(id=100 + n, operation_key=f"ref:{n}") for n in range(20)]
    operations = {key: operation(key, completed_at=T0 + n) for n, key in enumerate(reversed(keys))}
    operations.update({f"ref:{n}": operation(f"ref:{n}", external_ref=f"m{n}") for n in range(20)})
    found = audit(jobs, jobs, operations, T0 + 100)
    [traces] = found.by_task
    assert traces.examples_without == ("op:1", "op:2", "op:3", "op:4", "op:5")
    [finding] = completion_findings([], found)
    assert (finding.kind, finding.keys.operation_keys) == (
        Kind.MISSING_EXTERNAL_REF,
        ("op:1", "op:2", "op:3", "op:4", "op:5"),
    )


def test_a_trickle_of_failures_among_many_successes_is_no_outage() -> None:
    """Five jobs failing with one signature among many more that ran fine at the same time is a
    busy task's background of transient errors, not an outage."""
    failures = [failure(job_id, T0 + job_id) for job_id in range(1, 6)]
    fine = [attempt(job_id=job_id, started_at=T0 + job_id % 5) for job_id in range(10, 30)]
    assert find_outages([*failures, *fine]) == []
    assert len(find_outages([*failures, *fine[:4]])) == 1

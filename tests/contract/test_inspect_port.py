"""Conformance tests of the operator views: per-queue stats, job search, timeline, audit trail.

Runs against every backend in ``conftest.BACKENDS``; the dashboard and the exporter read these.
"""

from __future__ import annotations

from typing import Any

from jobguard.backends.base import Backend, Closing, ErrorInfo
from jobguard.models import DeadCode, JobSpec, JobStatus, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import bury, fetch_one, finish, guard_of


def make_spec(**changes: Any) -> JobSpec:
    """A job with test defaults: queue ``default``, 5 attempts, 10 s lease."""
    fields: dict[str, Any] = {
        "task": "tests.ship",
        "queue": "default",
        "payload": "{}",
        "max_attempts": 5,
        "visibility_timeout_s": 10.0,
    }
    fields.update(changes)
    return JobSpec(**fields)


def bury_one(backend: Backend, queue: str) -> int:
    """Fetch the next job of ``queue`` and bury it; return its id."""
    delivery = fetch_one(backend, queues=[queue])
    bury(
        backend,
        guard_of(delivery),
        Closing(0.01),
        code=DeadCode.FATAL,
        reason="refused",
        error=ErrorInfo("ValueError", "bad order"),
    )
    return delivery.job_id


def test_queue_stats_count_ready_scheduled_running_and_dead_per_queue(
    backend: Backend, clock: ControlledClock
) -> None:
    first = backend.enqueue(make_spec(queue="mail"))
    clock.advance(5.0)
    backend.enqueue(make_spec(queue="mail"))
    backend.enqueue(make_spec(queue="mail", delay_s=60.0))
    backend.enqueue(make_spec(queue="bills"))
    backend.enqueue(make_spec(queue="bills", visibility_timeout_s=4.0))
    bury_one(backend, "bills")
    running_since = clock()
    fetch_one(backend, queues=["bills"])  # the 4 s one, now running
    clock.advance(1.0)

    stats = {s.queue: s for s in backend.queue_stats()}
    assert set(stats) == {"mail", "bills"}
    mail, bills = stats["mail"], stats["bills"]
    assert (mail.ready, mail.scheduled, mail.running, mail.dead) == (2, 1, 0, 0)
    assert mail.oldest_ready_at == first.run_at
    assert mail.oldest_running_since is None
    assert (bills.ready, bills.scheduled, bills.running, bills.dead) == (0, 0, 1, 1)
    assert bills.oldest_running_since == running_since
    assert bills.shortest_lease_s == 4.0


def test_find_jobs_filters_by_status_queue_and_task_newest_first_a_page_at_a_time(
    backend: Backend,
) -> None:
    ids = [backend.enqueue(make_spec(task=f"tests.t{n % 2}")).id for n in range(6)]
    backend.enqueue(make_spec(queue="other"))
    found = backend.find_jobs(queue="default", task="tests.t0", limit=2)
    assert [job.id for job in found] == [ids[4], ids[2]]
    assert [job.id for job in backend.find_jobs(queue="default", limit=2, offset=4)] == ids[1::-1]
    dead = bury_one(backend, "default")
    assert [job.id for job in backend.find_jobs(status=JobStatus.DEAD)] == [dead]
    assert backend.find_jobs(status=JobStatus.COMPLETED) == []


def test_the_outcome_timeline_counts_recent_attempts_per_bucket_and_outcome(
    backend: Backend, clock: ControlledClock
) -> None:
    since = clock()
    for _ in range(3):
        backend.enqueue(make_spec())
    finish(backend, guard_of(fetch_one(backend)), Closing(0.01))
    clock.advance(10.0)
    finish(backend, guard_of(fetch_one(backend)), Closing(0.01))
    bury_one(backend, "default")
    counts = {(c.start, c.outcome): c.count for c in backend.outcome_timeline(since, 5.0, 100)}
    assert counts == {
        (since, Outcome.COMPLETED): 1,
        (since + 10.0, Outcome.COMPLETED): 1,
        (since + 10.0, Outcome.DEAD): 1,
    }
    # Only the most recent attempts are read: a window of one sees the last.
    assert [c.outcome for c in backend.outcome_timeline(since, 5.0, 1)] == [Outcome.DEAD]


def test_the_audit_trail_keeps_who_did_what_newest_first(
    backend: Backend, clock: ControlledClock
) -> None:
    backend.record_audit("ana@127.0.0.1", "replay", "job 7", "tests.ship")
    clock.advance(1.0)
    backend.record_audit("bo@10.0.0.2", "purge", "all dead jobs", "3 purged")
    trail = backend.audit_trail()
    assert [(e.actor, e.action, e.target, e.detail) for e in trail] == [
        ("bo@10.0.0.2", "purge", "all dead jobs", "3 purged"),
        ("ana@127.0.0.1", "replay", "job 7", "tests.ship"),
    ]
    assert trail[0].at == trail[1].at + 1.0
    assert len(backend.audit_trail(limit=1)) == 1

"""Workers whose wall clocks disagree never hold one lease or one lock at the same time.

Lease and lock expiry are decided on the store's clock (the database server's on PostgreSQL;
on SQLite the host's time since boot, which no wall-clock step moves), never on a worker's own
``time.time()``. Here one worker process runs with its wall clock 60 s ahead of the other's.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from jobguard import JobStatus, Outcome
from tests.support import guard_app
from tests.support.guard_app import HOLD, read_events, worker_env
from tests.support.procs import spawn_worker, wait_until, workers
from tests.support.run_worker import SKEW_ENV

pytestmark = pytest.mark.chaos

JOBS = 12


@pytest.mark.parametrize("skew_s", [60.0, -60.0])
def test_a_worker_60_s_off_never_overlaps_another_on_a_lease_or_a_lock(
    store_url: str, skew_s: float
) -> None:
    """: every job runs once, one at a time on its resource, and no write
    is refused as stale (no lease or lock was taken from a live holder)."""
    guard_app.create_business_tables(store_url)
    app = guard_app.make_app(store_url, lease_s=1.0, lock_ttl_s=1.0)
    try:
        # All but two jobs on a queue both workers take from; one on a queue of each worker's
        # own, so that each surely runs a job (the one started second could otherwise find
        # every job run or taken), while every job waits for the same lock.
        queues = ["shared"] * (JOBS - 2) + ["on-time", "skewed"]
        hold = app.tasks[HOLD]
        jobs = [
            hold.options(queue=queue).enqueue(job_no=n, resource="dock", hold_s=0.25)
            for n, queue in enumerate(queues)
        ]
        on_time = spawn_worker(
            store_url,
            guard_app.__name__,
            queues=["on-time", "shared"],
            concurrency=2,
            worker_id="on-time",
        )
        skewed_env = {**worker_env(), SKEW_ENV: repr(skew_s)}
        skewed = spawn_worker(
            store_url,
            guard_app.__name__,
            queues=["skewed", "shared"],
            concurrency=2,
            worker_id="skewed",
            env=skewed_env,
        )
        with workers(on_time, skewed):
            wait_until(
                lambda: app.counts()[JobStatus.COMPLETED] == JOBS, timeout_s=60, interval_s=0.1
            )
        attempts = app.attempts(limit=10_000)
    finally:
        app.close()

    events = read_events(store_url)
    starts = Counter(e.job_id for e in events if e.kind == "start")
    assert starts == {job.id: 1 for job in jobs}  # each handler ran exactly once
    spans = sorted(
        (start.mono, end.mono, start.worker_id)
        for start in events
        if start.kind == "start"
        for end in events
        if end.kind == "end" and end.job_id == start.job_id
    )
    assert len(spans) == JOBS
    assert all(a_end <= b_start for (_, a_end, _), (b_start, _, _) in itertools.pairwise(spans))
    assert {worker for _, _, worker in spans} == {"on-time", "skewed"}  # both did take work
    outcomes = Counter(a.outcome for a in attempts)
    assert outcomes[Outcome.LEASE_REFUSED] == outcomes[Outcome.FENCE_REFUSED] == 0
    assert outcomes[Outcome.LOST] == 0

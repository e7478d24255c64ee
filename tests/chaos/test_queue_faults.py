"""Fault tests of the queue engine with real worker processes ().

Each test starts worker interpreters with :func:`spawn_worker` on one SQLite file, kills, pauses
or signals them, and then checks two independent records against each other: jobguard's attempt
log, and the event log the handlers of ``tests.support.queue_app`` write for themselves (which
process ran which attempt, when, and whether it learnt that its lease was lost).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App, JobStatus, Outcome
from tests.support.procs import (
    REPO_ROOT,
    WorkerProcess,
    clean_env,
    spawn_worker,
    wait_until,
    workers,
)
from tests.support.queue_app import (
    KILL_SELF,
    KILL_SELF_MAX_ATTEMPTS,
    NOOP,
    SLEEP,
    Event,
    make_app,
    read_events,
)

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.queue_app"
LEASE_S = 1.0  # the visibility timeout of queue_app's tasks unless a test says otherwise


@pytest.fixture
def qapp(store_url: str) -> Iterator[App]:
    """The producer side of ``queue_app`` on this test's store (schema created up front)."""
    application = make_app(store_url, visibility_timeout_s=LEASE_S)
    _ = application.backend
    yield application
    application.close()


def start_workers(
    store_url: str, *names: str, concurrency: int = 1, grace_s: float = 5.0
) -> list[WorkerProcess]:
    """Start one worker process per name (its worker id) and wait until all are fetching."""
    procs = [
        spawn_worker(
            store_url, APP_MODULE, worker_id=name, concurrency=concurrency, grace_s=grace_s
        )
        for name in names
    ]
    for proc in procs:
        proc.wait_ready()
    return procs


def events_of(store_url: str, job_id: int, kind: str | None = None) -> list[Event]:
    """The handler's own events for one job (optionally of one kind)."""
    return [e for e in read_events(store_url, job_id) if kind is None or e.kind == kind]


def status_of(app: App, job_id: int) -> JobStatus:
    """The job's current state in the store."""
    return app.get_job(job_id).status


def test_sigkilled_worker_job_is_redelivered_after_its_lease_expires_and_nothing_is_lost(
    qapp: App, store_url: str
) -> None:
    """SIGKILL mid-job: redelivered to the other worker after the lease, first attempt ``lost``.

    G1.1, G2.1, G1.1 (no lost job under SIGKILL).
    """
    victim = qapp.tasks[SLEEP].enqueue(sleep_s=[60.0, 0.05])
    bystanders = [qapp.tasks[NOOP].enqueue(n=i) for i in range(4)]
    procs = start_workers(store_url, "wa", "wb")
    with workers(*procs):
        wait_until(lambda: bool(events_of(store_url, victim.id, "start")))
        first = events_of(store_url, victim.id, "start")[0]
        doomed, survivor = procs if procs[0].pid == first.pid else procs[::-1]
        doomed.signal(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
        wait_until(lambda: status_of(qapp, victim.id) == JobStatus.COMPLETED)
        wait_until(lambda: all(status_of(qapp, j.id) == JobStatus.COMPLETED for j in bystanders))

    doomed_id = first.worker_id
    survivor_id = "wb" if doomed_id == "wa" else "wa"
    attempts = qapp.attempts(job_id=victim.id)
    assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [
        (1, doomed_id, Outcome.LOST),
        (2, survivor_id, Outcome.COMPLETED),
    ]
    assert attempts[0].ended_at is not None
    # Leases only ever get longer, so no redelivery can start before the first lease's term.
    assert attempts[1].started_at >= attempts[0].started_at + LEASE_S
    assert qapp.get_job(victim.id).attempts == 2
    # The handler's own record: the killed process never finished; the survivor did, once.
    assert [(e.pid, e.attempt, e.kind) for e in events_of(store_url, victim.id)] == [
        (doomed.pid, 1, "start"),
        (survivor.pid, 2, "start"),
        (survivor.pid, 2, "end"),
    ]
    # Nothing lost: every job enqueued is completed; nothing is left queued, running or dead.
    assert qapp.counts() == {
        JobStatus.QUEUED: 0,
        JobStatus.RUNNING: 0,
        JobStatus.COMPLETED: 5,
        JobStatus.DEAD: 0,
    }


def test_heartbeat_keeps_a_job_running_three_times_its_lease_from_a_second_worker(
    store_url: str,
) -> None:
    """A job running > 3x its visibility timeout is never given to the second, idle worker.

    G2.2 (heartbeat extends the lease while the worker lives).
    """
    lease_s = 1.5
    app = make_app(store_url, visibility_timeout_s=lease_s)
    try:
        run_s = 3.3 * lease_s
        long_job = app.tasks[SLEEP].enqueue(sleep_s=[run_s])
        procs = start_workers(store_url, "wa", "wb")
        with workers(*procs):
            wait_until(lambda: bool(events_of(store_url, long_job.id, "start")))
            holder = events_of(store_url, long_job.id, "start")[0].worker_id
            other = "wb" if holder == "wa" else "wa"
            # The other worker is alive and fetching all along: it takes this job meanwhile.
            ping = app.tasks[NOOP].enqueue()
            wait_until(lambda: status_of(app, ping.id) == JobStatus.COMPLETED)
            wait_until(lambda: status_of(app, long_job.id) == JobStatus.COMPLETED, timeout_s=30)

        attempts = app.attempts(job_id=long_job.id)
        assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [
            (1, holder, Outcome.COMPLETED)
        ]
        assert app.get_job(long_job.id).attempts == 1
        [ping_attempt] = app.attempts(job_id=ping.id)
        assert ping_attempt.worker_id == other
        events = events_of(store_url, long_job.id)
        assert [(e.worker_id, e.attempt, e.kind) for e in events] == [
            (holder, 1, "start"),
            (holder, 1, "end"),
        ]
        start, end = events
        assert end.t - start.t >= 3 * lease_s
        assert not end.lease_lost
        # The other worker really was polling while the long job held its lease.
        assert start.t < ping_attempt.started_at < end.t
    finally:
        app.close()


def test_sigstopped_worker_loses_its_job_and_its_late_finish_is_refused(
    qapp: App, store_url: str
) -> None:
    """SIGSTOP past the lease: the job goes to the other worker; after SIGCONT the first worker
    learns it lost the lease (``ctx.lease_lost``) and its finish is refused (``lease_refused``).

    G2.4 (a stale lease cannot ack).
    """
    job = qapp.tasks[SLEEP].enqueue(sleep_s=[1.5, 0.05], await_lost_attempt=1)
    procs = start_workers(store_url, "wa", "wb")
    with workers(*procs):
        wait_until(lambda: bool(events_of(store_url, job.id, "start")))
        first = events_of(store_url, job.id, "start")[0]
        paused = procs[0] if procs[0].pid == first.pid else procs[1]
        paused.pause_between_writes(store_url)
        # While the first worker is frozen, its lease runs out and the other one finishes the job.
        wait_until(lambda: status_of(qapp, job.id) == JobStatus.COMPLETED)
        while_paused = qapp.attempts(job_id=job.id)
        paused.signal(signal.SIGCONT)
        wait_until(lambda: qapp.attempts(job_id=job.id)[0].outcome == Outcome.LEASE_REFUSED)
        assert paused.popen.poll() is None  # a refused finish is not a crash

    second_id = "wb" if first.worker_id == "wa" else "wa"
    assert [(a.worker_id, a.outcome) for a in while_paused] == [
        (first.worker_id, Outcome.LOST),
        (second_id, Outcome.COMPLETED),
    ]
    attempts = qapp.attempts(job_id=job.id)
    assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [
        (1, first.worker_id, Outcome.LEASE_REFUSED),
        (2, second_id, Outcome.COMPLETED),
    ]
    assert attempts[0].error_type == "LeaseLostError"
    # The final state is the second worker's: still completed by attempt 2, nothing charged after.
    final = qapp.get_job(job.id)
    assert final.status == JobStatus.COMPLETED
    assert final.attempts == 2
    ends = {e.worker_id: e for e in events_of(store_url, job.id, "end")}
    assert set(ends) == {first.worker_id, second_id}
    assert ends[first.worker_id].lease_lost  # the stale worker learnt it lost the job
    assert not ends[second_id].lease_lost
    assert ends[second_id].t < ends[first.worker_id].t


def test_job_that_kills_its_worker_every_time_reaches_the_dlq_after_max_attempts(
    qapp: App, store_url: str
) -> None:
    """A job that SIGKILLs its worker on every delivery is buried after ``max_attempts``, with
    every attempt's metadata (attempts are charged at delivery, so crashes count).

    G8.1, G8.2, G8.2.
    """
    job = qapp.tasks[KILL_SELF].enqueue()
    killed: list[WorkerProcess] = []
    spawned: list[WorkerProcess] = []
    try:
        # A supervisor: restart a worker after each death until the job settles.
        for generation in range(1, KILL_SELF_MAX_ATTEMPTS + 3):
            if status_of(qapp, job.id) == JobStatus.DEAD:
                break
            proc = spawn_worker(store_url, APP_MODULE, worker_id=f"gen{generation}")
            spawned.append(proc)
            proc.wait_ready()

            def died_or_settled(p: WorkerProcess = proc) -> bool:
                return p.popen.poll() is not None or status_of(qapp, job.id) == JobStatus.DEAD

            wait_until(died_or_settled, timeout_s=30)
            if proc.popen.poll() is not None:
                assert proc.popen.returncode == -signal.SIGKILL
                killed.append(proc)
        survivor = spawned[-1]
        survivor.signal(signal.SIGTERM)
        assert survivor.wait() == 0
    finally:
        for proc in spawned:
            proc.kill()

    assert len(killed) == KILL_SELF_MAX_ATTEMPTS
    assert survivor not in killed
    dead = qapp.dlq.show(job.id)
    assert dead.job.status == JobStatus.DEAD
    assert dead.job.attempts == KILL_SELF_MAX_ATTEMPTS
    assert f"attempts exhausted ({KILL_SELF_MAX_ATTEMPTS}/{KILL_SELF_MAX_ATTEMPTS})" in dead.reason
    assert job.id in [j.id for j in qapp.dlq.list()]
    assert [(a.attempt, a.worker_id, a.outcome) for a in dead.attempts] == [
        (n, f"gen{n}", Outcome.LOST) for n in range(1, KILL_SELF_MAX_ATTEMPTS + 1)
    ]
    assert len({a.lease_token for a in dead.attempts}) == KILL_SELF_MAX_ATTEMPTS
    for attempt in dead.attempts:
        assert attempt.task == KILL_SELF
        assert attempt.ended_at is not None
        assert attempt.ended_at >= attempt.started_at
    # Each delivery really ran, once, in the process it killed.
    assert [(e.attempt, e.pid) for e in events_of(store_url, job.id, "start")] == [
        (n, proc.pid) for n, proc in enumerate(killed, start=1)
    ]


def test_sigterm_lets_running_jobs_finish_in_grace_and_releases_the_rest_uncharged(
    qapp: App, store_url: str
) -> None:
    """SIGTERM: no new fetches; a job that ends within the grace period completes; one still
    running at the deadline is released (back to queued, attempt not charged); exit code 0.

    G9.
    """
    grace_s = 2.0
    short = qapp.tasks[SLEEP].enqueue(sleep_s=[1.0])
    long = qapp.tasks[SLEEP].enqueue(sleep_s=[120.0])
    [proc] = start_workers(store_url, "wterm", concurrency=2, grace_s=grace_s)
    with workers(proc):
        wait_until(
            lambda: (
                bool(events_of(store_url, short.id, "start"))
                and bool(events_of(store_url, long.id, "start"))
            )
        )
        # Both slots are busy, so this one cannot be fetched before the signal lands.
        late = qapp.tasks[NOOP].enqueue()
        signalled_at = time.time()  # the SQLite store clock is the host clock
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout_s=20) == 0
        assert "STOPPED released=1" in proc.output()

    [short_attempt] = qapp.attempts(job_id=short.id)
    assert short_attempt.outcome == Outcome.COMPLETED
    assert short_attempt.ended_at is not None
    assert short_attempt.ended_at <= signalled_at + grace_s
    assert status_of(qapp, short.id) == JobStatus.COMPLETED

    [long_attempt] = qapp.attempts(job_id=long.id)
    assert long_attempt.outcome == Outcome.RELEASED
    assert long_attempt.ended_at is not None
    assert long_attempt.ended_at >= signalled_at + grace_s  # it got the whole grace period
    released = qapp.get_job(long.id)
    assert released.status == JobStatus.QUEUED
    assert released.attempts == 0  # handed back without charging the delivery
    assert events_of(store_url, long.id, "end") == []

    assert status_of(qapp, late.id) == JobStatus.QUEUED
    assert qapp.attempts(job_id=late.id) == []


def test_concurrent_enqueues_of_one_dedup_key_from_four_processes_store_one_job(
    qapp: App, store_url: str, tmp_path: Path
) -> None:
    """4 processes x 100 enqueues with one dedup key: one job stored, all 400 callers get its id.

    G6.1, G6.1.
    """
    go = tmp_path / "go"
    env = clean_env()
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [
        sys.executable, "-m", APP_MODULE, "enqueue-dedup",
        "--url", store_url, "--key", "dedup:one", "--count", "100", "--go", str(go),
    ]  # fmt: skip
    producers = [
        subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    try:
        for producer in producers:
            assert producer.stdout is not None
            assert producer.stdout.readline().strip() == "READY"
        go.touch()  # all four start together
        outputs = [producer.communicate(timeout=60)[0] for producer in producers]
    finally:
        for producer in producers:
            if producer.poll() is None:
                producer.kill()
            producer.wait(timeout=10)
    assert [producer.returncode for producer in producers] == [0, 0, 0, 0]

    results = [tuple(item) for out in outputs for item in json.loads(out)]
    assert len(results) == 400
    stored = qapp.jobs()
    assert len(stored) == 1
    [job] = stored
    assert job.dedup_key == "dedup:one"
    assert {job_id for job_id, _ in results} == {job.id}
    # Exactly one caller created it; the other 399 were handed the existing job.
    assert sum(1 for _, deduplicated in results if not deduplicated) == 1

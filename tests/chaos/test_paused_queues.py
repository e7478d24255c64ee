"""Paused queues with real worker processes on both stores (#17).

Two worker processes run a queue's jobs; the queue is paused while they do. The pause's time is
read from the store (the row the pause wrote, stamped after the pause was committed), the
handlers' starts from their own event log (``tests.support.queue_app``). Workers run one job at
a time with no prefetch, so what is in flight at the pause is at most one job per worker.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from jobguard import App
from jobguard.exceptions import ConfigurationError
from jobguard.models import JobStatus
from tests.support.procs import WorkerProcess, spawn_worker, wait_until, workers
from tests.support.queue_app import SLEEP, make_app, read_events

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.queue_app"
QUEUE = "default"


@pytest.fixture
def qapp(store_url: str) -> Iterator[App]:
    application = make_app(store_url, visibility_timeout_s=5.0)
    _ = application.backend
    yield application
    application.close()


def start(store_url: str, name: str) -> WorkerProcess:
    proc = spawn_worker(store_url, APP_MODULE, worker_id=name, concurrency=1, prefetch=0)
    proc.wait_ready()
    return proc


def starts(store_url: str) -> list[tuple[int, float]]:
    return [(e.job_id, e.t) for e in read_events(store_url) if e.kind == "start"]


def test_a_paused_queue_lets_in_flight_jobs_finish_starts_nothing_new_and_resumes(
    qapp: App, store_url: str
) -> None:
    first = [qapp.tasks[SLEEP].enqueue(sleep_s=[0.4]) for _ in range(12)]
    procs = [start(store_url, "wa"), start(store_url, "wb")]
    with workers(*procs):
        wait_until(lambda: len(starts(store_url)) >= 3)
        qapp.pause_queue(QUEUE, actor="operator")
        (state,) = qapp.paused_queues()
        assert (state.queue, state.paused_by) == (QUEUE, "operator")
        paused_at = state.paused_at
        # Enqueues still land while the queue is paused.
        later = [qapp.tasks[SLEEP].enqueue(sleep_s=[0.05]) for _ in range(3)]
        assert all(qapp.get_job(j.id).status == JobStatus.QUEUED for j in later)
        # In flight at the pause: finished, not cut off.
        wait_until(lambda: qapp.counts()[JobStatus.RUNNING] == 0)
        held = qapp.counts()
        assert held[JobStatus.QUEUED] > 0
        # A worker restarted while the queue is paused takes nothing either.
        procs[0].signal(signal.SIGTERM)
        assert procs[0].wait() == 0
        procs[0].kill()  # reaped: closes its pipe
        with workers(start(store_url, "wa2")):
            # Ten poll intervals for the fresh worker (and the other one) to take a job, if the
            # pause let them: a broken pause fails below, a working one waits in vain.
            time.sleep(1.0)
            before_resume = qapp.backend.now()
            # Neither worker idles into work: every job the handlers started after the pause was
            # leased before it (at most one per worker, no prefetch).
            leased_after = [
                a
                for j in first + later
                for a in qapp.attempts(job_id=j.id)
                if a.started_at > paused_at
            ]
            assert leased_after == []
            late_starts = [job_id for job_id, t in starts(store_url) if t > paused_at]
            assert len(late_starts) <= 2
            for job_id in late_starts:
                assert all(a.started_at <= paused_at for a in qapp.attempts(job_id=job_id))
            assert qapp.counts() == held
            assert qapp.get_job(later[0].id).status == JobStatus.QUEUED

            qapp.resume_queue(QUEUE, actor="operator")
            assert qapp.paused_queues() == []
            everything = first + later
            wait_until(
                lambda: all(qapp.get_job(j.id).status == JobStatus.COMPLETED for j in everything),
                timeout_s=60,
            )
    # Nothing double-run: one start per job, one attempt each.
    assert Counter(job_id for job_id, _ in starts(store_url)) == {j.id: 1 for j in everything}
    assert all(qapp.get_job(j.id).attempts == 1 for j in everything)
    # Every job that started after the resume started after it (none slipped in between).
    later_ids = {j.id for j in later}
    assert all(t > before_resume for job_id, t in starts(store_url) if job_id in later_ids)
    trail = [(e.action, e.target, e.actor) for e in qapp.audit_trail()]
    assert trail == [
        ("resume queue", QUEUE, "operator"),
        ("pause queue", QUEUE, "operator"),
    ]


def test_the_paused_state_is_in_the_store_and_survives_a_restart(store_url: str) -> None:
    app = make_app(store_url)
    app.pause_queue(QUEUE, actor="operator")
    app.pause_queue(QUEUE, actor="someone else")  # already paused: kept as it was
    app.close()
    reopened = make_app(store_url)
    try:
        (state,) = reopened.paused_queues()
        assert (state.queue, state.paused_by) == (QUEUE, "operator")
        (stats,) = [s for s in reopened.queue_stats() if s.queue == QUEUE]
        assert stats.paused
        job = reopened.tasks[SLEEP].enqueue(sleep_s=[0.0])
        reopened.worker(install_signal_handlers=False).run(burst=True)
        assert reopened.get_job(job.id).status == JobStatus.QUEUED
        reopened.resume_queue(QUEUE, actor="operator")
        reopened.resume_queue(QUEUE, actor="operator")  # not paused: nothing to do
        reopened.worker(install_signal_handlers=False).run(burst=True)
        assert reopened.get_job(job.id).status == JobStatus.COMPLETED
        assert [e.action for e in reopened.audit_trail()] == ["resume queue", "pause queue"]
    finally:
        reopened.close()


@pytest.mark.parametrize("name", ["", "a b", "<script>", "x" * 65, "-lead", "é"])
def test_pausing_a_queue_name_that_is_not_valid_is_refused_and_changes_nothing(
    store_url: str, name: str
) -> None:
    app = make_app(store_url)
    try:
        with pytest.raises(ConfigurationError, match="is not a plain identifier"):
            app.pause_queue(name, actor="operator")
        with pytest.raises(ConfigurationError, match="is not a plain identifier"):
            app.resume_queue(name, actor="operator")
        assert app.paused_queues() == []
        assert app.audit_trail() == []
    finally:
        app.close()

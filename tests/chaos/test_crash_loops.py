"""A crashing job must not take its neighbours to the dead letter queue (#18).

One job kills the worker process on every delivery; two worker processes at concurrency 2 run
it beside healthy jobs, and a supervisor (the test) restarts whichever dies. The culprit alone
goes to the dead letter queue; the jobs that happened to be in flight beside it complete.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App, JobStatus
from tests.support.crash_app import CULPRIT, DECODE, MAX_ATTEMPTS, make_app
from tests.support.procs import WorkerProcess, spawn_worker, wait_until

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.crash_app"
HEALTHY = 7


@pytest.fixture
def capp(store_url: str) -> Iterator[App]:
    """The producer side of ``crash_app`` (schema created before any worker starts)."""
    application = make_app(store_url)
    _ = application.backend
    yield application
    application.close()


def test_the_culprit_of_a_crash_loop_alone_is_buried(store_url: str, capp: App) -> None:
    jobs = [capp.tasks[DECODE].enqueue(n=n) for n in range(HEALTHY + 1)]
    ids = [job.id for job in jobs]
    procs: list[WorkerProcess] = []

    def supervise() -> bool:
        """Restart dead workers (two always run); true once every job has ended."""
        for index, proc in enumerate(list(procs)):
            if proc.popen.poll() is not None:
                proc.kill()
                procs[index] = spawn_worker(store_url, APP_MODULE, concurrency=2)
        statuses = [capp.get_job(job_id).status for job_id in ids]
        return all(status in (JobStatus.COMPLETED, JobStatus.DEAD) for status in statuses)

    try:
        procs.extend(spawn_worker(store_url, APP_MODULE, concurrency=2) for _ in range(2))
        wait_until(supervise, timeout_s=180, interval_s=0.1)
    finally:
        for proc in procs:
            proc.kill()
    culprit = capp.get_job(ids[CULPRIT])
    assert culprit.status is JobStatus.DEAD
    assert culprit.attempts == MAX_ATTEMPTS
    neighbours = {capp.get_job(job_id).status for job_id in ids[1:]}
    assert neighbours == {JobStatus.COMPLETED}, [capp.get_job(i).dead_reason for i in ids]

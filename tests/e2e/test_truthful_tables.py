"""The tables say what happened: the attempt limit the worker enforced, and the steps a
delivery ran before its worker died. Real worker processes, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from jobguard import App, JobStatus
from jobguard.cli.main import cli
from tests.support import signal_app as s
from tests.support import stores
from tests.support.procs import spawn_worker, wait_until, workers

APP = "tests.support.signal_app"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="jobguard", env={"COLUMNS": "1000"})


@pytest.fixture
def tasks(store_url: str) -> Iterator[App]:
    stores.home_of(store_url).mkdir(parents=True, exist_ok=True)
    application = s.make_app(store_url)
    yield application
    application.close()


def test_the_attempt_limit_shown_is_the_one_the_worker_enforced(tasks: App, store_url: str) -> None:
    """The producer's definition allows 2 deliveries, the worker's (a newer deploy) 5: the job
    is buried after 5, and every table says 5/5, never 5/2."""
    job = tasks.tasks[s.LIMITED].enqueue(n=1)
    assert job.max_attempts == 2
    proc = spawn_worker(store_url, APP, env={"LIMITED_MAX_ATTEMPTS": "5"})
    with workers(proc):  # not a burst worker: it stops while a retry waits its backoff
        wait_until(lambda: tasks.get_job(job.id).status == JobStatus.DEAD, timeout_s=30)
    dead = tasks.get_job(job.id)
    assert (dead.attempts, dead.max_attempts) == (5, 5)
    assert "(5/5)" in (dead.dead_reason or "")

    for args in (["jobs"], ["dlq", "list"], ["dlq", "show", str(job.id)]):
        shown = run("--url", store_url, *args)
        assert shown.exit_code == 0, shown.output
        assert "5/2" not in shown.stdout, args
        assert "5/5" in shown.stdout, args

"""The tables say what happened: the attempt limit the worker enforced, and the steps a
delivery ran before its worker died. Real worker processes, on both backends."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from jobguard import App, JobStatus, Outcome
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


def test_a_lost_delivery_shows_the_steps_it_ran_before_its_worker_died(
    tasks: App, store_url: str
) -> None:
    """A worker SIGKILLed after its delivery recorded steps: the lost attempt says how many it
    ran (what it skipped is unknown), not 0/0."""
    job = tasks.tasks[s.STEPS].enqueue(n=1)
    proc = spawn_worker(store_url, APP, concurrency=1)
    with workers(proc):
        proc.wait_ready()
        wait_until(lambda: len(getattr(tasks.operation("steps:1"), "steps", {})) >= 2)
        proc.signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    ran = len(tasks.operation("steps:1").steps)  # type: ignore[union-attr]
    rescuer = spawn_worker(store_url, APP, concurrency=1)
    with workers(rescuer):
        rescuer.wait_ready()
        wait_until(lambda: tasks.get_job(job.id).status == JobStatus.COMPLETED, timeout_s=30)
    lost, done = tasks.attempts(job_id=job.id)
    assert lost.outcome == Outcome.LOST
    assert lost.steps_run == ran
    assert (done.steps_run, done.steps_skipped) == (3 - ran, ran)

    shown = run("--url", store_url, "attempts", "--job", str(job.id))
    assert f"{ran}/?" in shown.stdout
    as_json = json.loads(run("--url", store_url, "attempts", "--job", str(job.id), "--json").stdout)
    assert as_json[0]["steps_run"] == ran

"""Retry-now (#17): a job waiting on its backoff runs at once; anything else is refused.

Through the app API and the real ``jobguard`` executable, with a real worker process, on both
stores.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from jobguard import App, JobStateError, JobStatus, NotFoundError
from jobguard.exceptions import ConfigurationError
from jobguard.models import DeadCode
from tests.contract.test_retry_now_port import CLOSING, ERROR
from tests.e2e.test_dlq_bulk import jobguard as run_jobguard
from tests.support.ports import bury, fetch_one, finish, guard_of
from tests.support.procs import REPO_ROOT, spawn_worker, wait_until, workers
from tests.support.queue_app import BACKOFF, LONG_BACKOFF_S, NOOP, make_app, read_events


@pytest.fixture
def app(store_url: str) -> Iterator[App]:
    """The queue fault tests' app on a fresh store of each backend."""
    application = make_app(store_url)
    yield application
    application.close()


def jobguard(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``jobguard`` executable on the store at ``url``."""
    return run_jobguard(url, *args, cwd=REPO_ROOT)


def test_a_job_in_a_long_backoff_runs_right_after_retry_now_in_a_worker_process(
    app: App, store_url: str
) -> None:
    job = app.enqueue(BACKOFF, {})
    worker = spawn_worker(store_url, "tests.support.queue_app", queues=["default"])
    with workers(worker):
        worker.wait_ready()

        def backing_off() -> bool:
            found = app.get_job(job.id)
            return found.status == JobStatus.QUEUED and found.attempts == 1

        wait_until(backing_off, timeout_s=60)
        waiting = app.get_job(job.id)
        assert waiting.run_at - app.backend.now() > LONG_BACKOFF_S - 60

        result = jobguard(store_url, "retry-now", str(job.id))
        assert result.returncode == 0, result.stderr
        assert f"job {job.id} is due now: {BACKOFF} on queue default" in result.stdout
        assert "attempt 1/3 so far" in result.stdout

        # Due now, not in an hour: the running worker takes it and it completes.
        wait_until(lambda: app.get_job(job.id).status == JobStatus.COMPLETED, timeout_s=60)
    done = app.get_job(job.id)
    assert (done.attempts, done.max_attempts) == (2, 3)
    assert [(e.attempt, e.kind) for e in read_events(store_url, job.id)] == [
        (1, "start"),
        (2, "start"),
        (2, "end"),
    ]
    [entry] = app.audit_trail()
    assert (entry.action, entry.target) == ("retry-now", f"job {job.id}")
    assert entry.actor.startswith("cli")
    assert entry.detail.startswith(f"{BACKOFF}: was due ")


def test_the_app_api_moves_only_the_run_time_and_audits_under_the_actor(app: App) -> None:
    job = app.tasks[NOOP].options(delay_s=3600.0).enqueue()
    moved = app.retry_now(job.id, actor="ops@example")
    assert moved.run_at <= app.backend.now()
    assert (moved.status, moved.attempts, moved.max_attempts) == (
        JobStatus.QUEUED,
        job.attempts,
        job.max_attempts,
    )
    assert [(e.actor, e.action) for e in app.audit_trail()] == [("ops@example", "retry-now")]
    app.worker(install_signal_handlers=False).run(burst=True)
    assert app.get_job(job.id).status == JobStatus.COMPLETED


def _due(app: App) -> int:
    return app.enqueue(NOOP, {}).id


def _running(app: App) -> int:
    app.enqueue(NOOP, {})
    return fetch_one(app.backend).job_id


def _completed(app: App) -> int:
    app.enqueue(NOOP, {})
    delivery = fetch_one(app.backend)
    finish(app.backend, guard_of(delivery), CLOSING)
    return delivery.job_id


def _dead(app: App) -> int:
    app.enqueue(NOOP, {})
    guard = guard_of(fetch_one(app.backend))
    bury(app.backend, guard, CLOSING, code=DeadCode.FATAL, reason="fatal", error=ERROR)
    return guard.job_id


REFUSED: list[tuple[Callable[[App], int], str]] = [
    (_due, "is queued and already due"),
    (_running, "is running (attempt 1/"),
    (_completed, "is completed; there is nothing to retry"),
    (_dead, "is dead: replay it from the dead letter queue (jobguard dlq replay"),
]


@pytest.mark.parametrize(("make", "message"), REFUSED, ids=["due", "running", "completed", "dead"])
def test_a_job_not_waiting_is_refused_with_one_line_and_left_as_it_was(
    app: App, store_url: str, make: Callable[[App], int], message: str
) -> None:
    job_id = make(app)
    before = app.get_job(job_id)
    with pytest.raises(JobStateError, match=message.replace("(", r"\(")):
        app.retry_now(job_id, actor="ops")
    result = jobguard(store_url, "retry-now", str(job_id))
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"error: job {job_id} {message}")
    assert result.stderr.count("\n") == 1
    assert app.get_job(job_id) == before
    assert app.audit_trail() == []


def test_an_unknown_job_is_refused_and_nothing_is_written(app: App, store_url: str) -> None:
    with pytest.raises(NotFoundError, match="no job with id 424242"):
        app.retry_now(424242, actor="ops")
    result = jobguard(store_url, "retry-now", "424242")
    assert (result.returncode, result.stderr) == (1, "error: no job with id 424242\n")
    assert app.audit_trail() == []


@pytest.mark.parametrize("text", ["abc", "0", "-3", "1.5", "99999999999999999999", ""])
def test_an_id_that_is_not_a_job_id_exits_2_with_one_line_and_changes_nothing(
    app: App, store_url: str, text: str
) -> None:
    waiting = app.tasks[NOOP].options(delay_s=3600.0).enqueue()
    result = jobguard(store_url, "retry-now", "--", text)
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert app.get_job(waiting.id) == waiting
    assert app.audit_trail() == []


@pytest.mark.parametrize(
    ("job_id", "actor", "message"),
    [("1", "ops", "job id"), (True, "ops", "job id"), (0, "ops", "job id"), (1, "", "actor")],
)
def test_bad_arguments_to_the_app_api_are_a_configuration_error(
    app: App, job_id: object, actor: str, message: str
) -> None:
    waiting = app.tasks[NOOP].options(delay_s=3600.0).enqueue()
    with pytest.raises(ConfigurationError, match=message):
        app.retry_now(job_id, actor=actor)  # type: ignore[arg-type]
    assert app.get_job(waiting.id) == waiting
    assert app.audit_trail() == []

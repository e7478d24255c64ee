"""Async shutdown (#18): async jobs still running when SIGTERM's grace runs out end as
``released``, like sync ones, and a handler blocking the event loop does not make the worker
exit 1 with a traceback. Real worker processes on both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobguard import App, Outcome
from tests.support import jsonl_events
from tests.support.async_app import BLOCKS, SYNC_WAITS, WAITS, make_app
from tests.support.procs import REPO_ROOT, clean_env, wait_until

pytestmark = pytest.mark.chaos


@pytest.fixture
def aapp(store_url: str) -> Iterator[App]:
    """The producer side of ``async_app`` (schema created before the worker starts)."""
    application = make_app(store_url)
    _ = application.backend
    yield application
    application.close()


def run_worker_until_started(url: str, count: int) -> subprocess.Popen[str]:
    """A worker process (its stderr captured) once ``count`` handlers have started."""
    env = clean_env()
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "tests.support.run_worker", "--url", url]
    command += ["--app", "tests.support.async_app", "--concurrency", "4", "--grace-s", "0.5"]
    proc = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(
            lambda: len([e for e in jsonl_events.read_all(url) if e["what"] == "started"]) >= count,
            timeout_s=30,
        )
    except TimeoutError:
        proc.kill()
        proc.communicate()
        raise
    return proc


def test_async_and_sync_jobs_cancelled_at_sigterm_end_released(store_url: str, aapp: App) -> None:
    jobs = [aapp.tasks[WAITS].enqueue(n=1), aapp.tasks[SYNC_WAITS].enqueue(n=2)]
    proc = run_worker_until_started(store_url, 2)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    for job in jobs:
        outcomes = [a.outcome for a in aapp.attempts(job_id=job.id)]
        assert outcomes == [Outcome.RELEASED], (job.task, outcomes)


def test_an_async_handler_blocking_the_loop_at_sigterm_does_not_fail_the_worker(
    store_url: str, aapp: App
) -> None:
    job = aapp.tasks[BLOCKS].enqueue(n=1, block_s=15.0)
    proc = run_worker_until_started(store_url, 1)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "CancelledError" not in err, err
    assert [a.outcome for a in aapp.attempts(job_id=job.id)] == [Outcome.RELEASED]

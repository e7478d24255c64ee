"""Bad options of the process worker get a clear error and change nothing (#17).

On the command line (a real ``jobguard worker``, exit 2 with one line naming the option) and in
Python (``ConfigurationError`` naming it): a slot count that is not a whole number from 1, a
hard limit that is not a positive finite number of seconds, a hard limit asked of thread mode,
and thread-mode options given with ``--processes``.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, ConfigurationError, JobStatus, ProcessWorker
from tests.support import procs_app
from tests.support.procs import clean_env, entry_point

REPO_ROOT = Path(__file__).resolve().parents[2]


def _worker(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env[procs_app.URL_ENV] = url
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [*entry_point(), "--app", "tests.support.procs_app:app", "worker", "--burst", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--processes", "0"], "--processes"),
        (["--processes", "-3"], "--processes"),
        (["--processes", "two"], "--processes"),
        (["--processes", "1.5"], "--processes"),
        (["--processes", "2", "--concurrency", "3"], "--concurrency"),
        (["--processes", "2", "--prefetch", "0"], "--prefetch"),
        (["--time-limit-s", "5"], "--time-limit-s"),  # a hard limit in thread mode
        ([], procs_app.LIMITED),  # thread mode, and a task of the app has a hard limit
        (["--processes", "2", "--time-limit-s", "0"], "--time-limit-s"),
        (["--processes", "2", "--time-limit-s", "-1"], "--time-limit-s"),
        (["--processes", "2", "--time-limit-s", "nan"], "--time-limit-s"),
        (["--processes", "2", "--time-limit-s", "inf"], "--time-limit-s"),
        (["--processes", "2", "--time-limit-s", "soon"], "--time-limit-s"),
    ],
)
def test_bad_worker_options_exit_2_with_one_line_and_run_nothing(
    store_url: str, args: list[str], named: str
) -> None:
    app = procs_app.make_app(store_url)
    job = app.tasks[procs_app.CHARGE].enqueue(order=1)
    try:
        done = _worker(store_url, *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("error: ")
        # click names the flag; a value click lets through (nan) is named by the option's check
        assert named in lines[0] or named.lstrip("-").replace("-", "_") in lines[0]
        assert "Traceback" not in done.stderr
        assert app.get_job(job.id).status is JobStatus.QUEUED
    finally:
        app.close()


def test_the_process_mode_takes_a_hard_limit_and_runs(store_url: str) -> None:
    app = procs_app.make_app(store_url)
    procs_app.create_charges(store_url)
    job = app.tasks[procs_app.CHARGE].enqueue(order=1)
    try:
        done = _worker(store_url, "--processes", "2", "--time-limit-s", "30")
        assert done.returncode == 0, done.stderr
        assert app.get_job(job.id).status is JobStatus.COMPLETED
    finally:
        app.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"processes": 0}, "processes"),
        ({"processes": "2"}, "processes"),
        ({"processes": 2.0}, "processes"),
        ({"processes": True}, "processes"),
        ({"time_limit_s": 0}, "time_limit_s"),
        ({"time_limit_s": -1.0}, "time_limit_s"),
        ({"time_limit_s": math.nan}, "time_limit_s"),
        ({"time_limit_s": math.inf}, "time_limit_s"),
        ({"time_limit_s": "5"}, "time_limit_s"),
        ({"grace_s": -1}, "grace_s"),
        ({"queues": ["bad queue!"]}, "queue"),
    ],
)
def test_bad_process_worker_options_raise_naming_the_option(
    app: App, options: dict[str, Any], named: str
) -> None:
    @app.task
    def noop(ctx: Any) -> None:
        """A task, so the worker has a queue."""

    given = dict(options)  # the parameters are shared by both backends' runs
    queues = given.pop("queues", None)
    with pytest.raises(ConfigurationError, match=named):
        ProcessWorker(app, queues, **given)

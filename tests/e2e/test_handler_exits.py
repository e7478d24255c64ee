"""A handler that ends its interpreter's way, and hooks that raise, in real worker processes.

``sys.exit()``, ``argparse`` rejecting arguments, ``raise SystemExit`` in an ``async def`` or a
``KeyboardInterrupt`` from a handler end that job as a failure (retried, then buried, by its
rules): the handler thread lives on, no job is left running under a renewed lease. A hook that
raises from every method is contained: the worker runs every job to its end all the same.
"""

from __future__ import annotations

import signal

from jobguard import App, JobStatus, Outcome
from tests.support.exiting_app import BROKEN_HOOKS_ENV, make_app
from tests.support.procs import spawn_worker, wait_until, workers

EXITING = ("exits", "rejects_arguments", "interrupts", "exits_async")


def _settled(app: App) -> bool:
    counts = app.counts()
    return counts[JobStatus.QUEUED] == 0 and counts[JobStatus.RUNNING] == 0


def test_handlers_that_raise_system_exit_fail_their_job_and_the_worker_runs_on(
    store_url: str,
) -> None:
    app = make_app(store_url)
    try:
        jobs = {name: [app.tasks[name].enqueue(n=n) for n in range(3)] for name in EXITING}
        doomed = app.tasks["always_exits"].enqueue(n=9)
        with workers(spawn_worker(store_url, "tests.support.exiting_app", concurrency=2)) as (
            proc,
        ):
            proc.wait_ready()
            wait_until(lambda: _settled(app), timeout_s=60)
            proc.signal(signal.SIGTERM)
            assert proc.wait() == 0
            assert "STOPPED" in proc.output()
        expected_type = {
            "exits": "SystemExit",
            "rejects_arguments": "SystemExit",
            "interrupts": "KeyboardInterrupt",
            "exits_async": "SystemExit",
        }
        for name, enqueued in jobs.items():
            for job in enqueued:
                assert app.get_job(job.id).status == JobStatus.COMPLETED, name
                first, second = app.attempts(job_id=job.id)
                assert (first.outcome, first.error_type) == (Outcome.RETRY, expected_type[name])
                assert second.outcome == Outcome.COMPLETED
        dead = app.get_job(doomed.id)
        assert dead.status == JobStatus.DEAD
        assert [a.outcome for a in app.attempts(job_id=doomed.id)] == [Outcome.RETRY, Outcome.DEAD]
        assert app.attempts(job_id=doomed.id)[-1].error_message == "job 9 gives up"
    finally:
        app.close()


def test_a_worker_whose_hooks_all_raise_runs_every_job_to_its_end(store_url: str) -> None:
    app = make_app(store_url)
    try:
        plain = [app.tasks["plain"].enqueue(n=n) for n in range(12)]
        exiting = app.tasks["exits"].enqueue(n=1)
        env = {BROKEN_HOOKS_ENV: "1"}
        with workers(
            spawn_worker(store_url, "tests.support.exiting_app", concurrency=3, env=env)
        ) as (proc,):
            proc.wait_ready()
            wait_until(lambda: _settled(app), timeout_s=60)
            proc.signal(signal.SIGTERM)
            assert proc.wait() == 0
            assert "STOPPED" in proc.output()
        for job in plain:
            assert app.get_job(job.id).status == JobStatus.COMPLETED
        assert app.get_job(exiting.id).status == JobStatus.COMPLETED
        odd = [a.outcome for a in app.attempts(job_id=plain[1].id)]
        assert odd == [Outcome.RETRY, Outcome.COMPLETED]
    finally:
        app.close()

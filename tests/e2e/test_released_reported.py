"""Leases a worker hands back uncharged reach the hooks as ``released``, as the attempt log says.

A worker stopping with jobs still buffered (prefetched, never started) releases their leases;
metrics and logs read the hooks, the doctor reads the attempt log, and both must tell the same
story. Real store on every backend, a real worker on its own thread.
"""

from __future__ import annotations

import threading

from jobguard import App, Context, Outcome
from jobguard.hooks import AttemptEvent, Hooks
from tests.support.procs import wait_until


class Endings(Hooks):
    """Every attempt ending the hooks are told of, by job id."""

    def __init__(self) -> None:
        self.seen: dict[int, list[Outcome]] = {}
        self.lock = threading.Lock()

    def attempt_ended(self, event: AttemptEvent) -> None:
        with self.lock:
            self.seen.setdefault(event.delivery.job_id, []).append(event.outcome)


def test_prefetched_jobs_released_at_shutdown_are_reported_released(store_url: str) -> None:
    endings = Endings()
    app = App(store_url, hooks=endings)
    started, finish = threading.Event(), threading.Event()

    @app.task(name="slow")
    def slow(ctx: Context, n: int) -> int:
        started.set()
        finish.wait(30)
        return n

    try:
        jobs = slow.enqueue_many([{"n": n} for n in range(4)])
        worker = app.worker(concurrency=1, prefetch=3, install_signal_handlers=False)
        runner = threading.Thread(target=worker.run)
        runner.start()
        try:
            assert started.wait(30)
            wait_until(lambda: worker.stats.fetched == 4)
            worker.stop()
        finally:
            finish.set()
            runner.join(60)
        assert not runner.is_alive()
        assert worker.stats.released == 3

        logged = {job.id: [a.outcome for a in app.attempts(job_id=job.id)] for job in jobs}
        released = sorted(
            job_id for job_id, outcomes in logged.items() if Outcome.RELEASED in outcomes
        )
        assert len(released) == 3
        assert {job_id: endings.seen.get(job_id) for job_id in released} == {
            job_id: [Outcome.RELEASED] for job_id in released
        }
        [completed] = [job_id for job_id in logged if job_id not in released]
        assert logged[completed] == endings.seen[completed] == [Outcome.COMPLETED]
    finally:
        app.close()

"""Stopping an idle worker: it does not sleep out its poll interval first (both stores)."""

from __future__ import annotations

import threading

from jobguard import App, Context, JobStatus


def test_an_idle_worker_stops_at_once_not_at_the_end_of_its_poll_interval(
    store_url: str,
) -> None:
    """With a poll interval of a minute and nothing to do, the fetch loop sleeps in its wait
    for new jobs; ``stop()`` ends that sleep, so ``run()`` returns well within the minute."""
    app = App(store_url)
    done: list[int] = []

    @app.task(name="one")
    def one(ctx: Context, n: int) -> None:
        done.append(n)

    job = one.enqueue(n=1)
    worker = app.worker(install_signal_handlers=False, concurrency=1, poll_interval_s=60.0)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    try:
        # The job ran: the fetch loop found the queue empty after it and went to sleep.
        for _ in range(200):
            if app.get_job(job.id).status == JobStatus.COMPLETED:
                break
            running.join(0.05)
        assert app.get_job(job.id).status == JobStatus.COMPLETED
        running.join(0.3)
        assert running.is_alive()
        worker.stop()
        running.join(20.0)
        assert not running.is_alive(), "stop() waited for the poll interval"
        assert done == [1]
    finally:
        worker.stop()
        running.join(70.0)
        app.close()

"""A thread inside ``keep_connection`` works on the store as one outside it does (every
backend): what it enqueues, fetches and settles is written and seen the same, another thread's
calls meanwhile too, and it may be entered again inside itself.
"""

from __future__ import annotations

import threading

from jobguard.backends.base import Backend, Closing
from jobguard.models import JobSpec, JobStatus
from tests.support.ports import fetch, finish, guard_of

CLOSING = Closing(duration_s=0.1)


def spec(n: int) -> JobSpec:
    return JobSpec(
        task="tests.noop",
        queue="default",
        payload=f'{{"n":{n}}}',
        max_attempts=3,
        visibility_timeout_s=30.0,
    )


def test_calls_inside_keep_connection_write_and_read_as_outside(backend: Backend) -> None:
    with backend.keep_connection():
        first = backend.enqueue(spec(1))
        with backend.keep_connection():
            second = backend.enqueue(spec(2))
        delivered = fetch(backend, ["default"], 5, "w1")
        assert sorted(delivery.job_id for delivery in delivered) == [first.id, second.id]
        for delivery in delivered:
            finish(backend, guard_of(delivery), CLOSING)
        assert {backend.get_job(job.id).status for job in (first, second)} == {JobStatus.COMPLETED}
    outside = backend.enqueue(spec(3))
    assert [delivery.job_id for delivery in fetch(backend, ["default"], 5, "w1")] == [outside.id]


def test_another_threads_calls_go_on_while_one_keeps_its_connection(backend: Backend) -> None:
    kept, done = threading.Event(), threading.Event()

    def keeper() -> None:
        with backend.keep_connection():
            backend.enqueue(spec(1))
            kept.set()
            done.wait(30)

    thread = threading.Thread(target=keeper)
    thread.start()
    try:
        assert kept.wait(30)
        other = backend.enqueue(spec(2))
        assert len(fetch(backend, ["default"], 5, "w2")) == 2
        assert backend.get_job(other.id).status == JobStatus.RUNNING
    finally:
        done.set()
        thread.join(30)
    assert not thread.is_alive()

"""A thread inside ``keep_connection`` works on the store as one outside it does (every
backend): what it enqueues, fetches and settles is written and seen the same, another thread's
calls meanwhile too, and it may be entered again inside itself.
"""

from __future__ import annotations

import threading

from jobguard.backends.base import Backend
from jobguard.models import JobStatus
from tests.contract.test_queue_port import CLOSING, make_spec
from tests.support.ports import fetch, finish, guard_of


def test_calls_inside_keep_connection_write_and_read_as_outside(backend: Backend) -> None:
    with backend.keep_connection():
        first = backend.enqueue(make_spec())
        with backend.keep_connection():
            second = backend.enqueue(make_spec())
        delivered = fetch(backend, ["default"], 5, "w1")
        assert sorted(delivery.job_id for delivery in delivered) == [first.id, second.id]
        for delivery in delivered:
            finish(backend, guard_of(delivery), CLOSING)
        assert {backend.get_job(job.id).status for job in (first, second)} == {JobStatus.COMPLETED}
    outside = backend.enqueue(make_spec())
    assert [delivery.job_id for delivery in fetch(backend, ["default"], 5, "w1")] == [outside.id]


def test_another_threads_calls_go_on_while_one_keeps_its_connection(backend: Backend) -> None:
    kept, done = threading.Event(), threading.Event()

    def keeper() -> None:
        with backend.keep_connection():
            backend.enqueue(make_spec())
            kept.set()
            done.wait(30)

    thread = threading.Thread(target=keeper)
    thread.start()
    try:
        assert kept.wait(30)
        other = backend.enqueue(make_spec())
        assert len(fetch(backend, ["default"], 5, "w2")) == 2
        assert backend.get_job(other.id).status == JobStatus.RUNNING
    finally:
        done.set()
        thread.join(30)
    assert not thread.is_alive()

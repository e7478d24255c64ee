"""An idle worker's wait for new jobs ends when it is interrupted (every backend).

``wait_for_jobs`` sleeps up to its timeout for an enqueue's wake-up; ``interrupt_wait`` (a worker
stopping) ends the wait under way, or the next one when none is.
"""

from __future__ import annotations

import threading

from jobguard.backends.base import Backend

LONG_S = 60.0  # a wait that is not interrupted outlives every join below


def _waiting(backend: Backend) -> threading.Thread:
    thread = threading.Thread(target=backend.wait_for_jobs, args=(["q"], LONG_S), daemon=True)
    thread.start()
    return thread


def test_an_interrupt_ends_the_wait_under_way(backend: Backend) -> None:
    backend.wait_for_jobs(["q"], 0.01)  # the wake-up channel is set up: the next wait sleeps
    thread = _waiting(backend)
    thread.join(0.3)
    assert thread.is_alive()  # asleep, with no job and no interrupt
    backend.interrupt_wait()
    thread.join(20.0)
    assert not thread.is_alive()


def test_an_interrupt_before_the_wait_ends_the_next_wait_only(backend: Backend) -> None:
    backend.interrupt_wait()
    backend.interrupt_wait()  # two interrupts before a wait end that one wait, not two
    first = _waiting(backend)
    first.join(20.0)
    assert not first.is_alive()
    second = _waiting(backend)
    second.join(0.3)
    assert second.is_alive()
    backend.interrupt_wait()
    second.join(20.0)
    assert not second.is_alive()

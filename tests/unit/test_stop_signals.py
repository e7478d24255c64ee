"""SIGTERM and SIGINT reach the worker's and the scheduler's stop without deadlocking.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a non-reentrant lock (inside ``Event.wait``, say). A stop that takes such a lock
inside the handler waits for itself forever; these tests land a real signal at that moment.
"""

from __future__ import annotations

import signal
import threading

from jobguard.process import on_stop_signals

WAIT_S = 5.0


def test_a_signal_landing_while_the_main_thread_holds_the_stops_lock_still_stops() -> None:
    held = threading.Lock()
    handled: list[tuple[int, bool]] = []
    done = threading.Event()

    def stop(signum: int) -> None:
        # Run inside the handler, this would wait on the main thread, which holds the lock
        # until the signal is handled: a bounded wait turns that deadlock into a failure.
        acquired = held.acquire(timeout=WAIT_S)
        if acquired:
            held.release()
        handled.append((signum, acquired))
        done.set()

    restore = on_stop_signals(stop)
    try:
        with held:
            signal.raise_signal(signal.SIGTERM)  # handled before this returns, lock held
        assert done.wait(WAIT_S), "the stop never ran"
    finally:
        restore()
    assert handled == [(signal.SIGTERM, True)]


def test_undoing_handles_the_signals_already_received_in_order_and_restores_the_old_ones() -> None:
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT)

    restore = on_stop_signals(seen.append)
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)
    restore()

    assert seen == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before

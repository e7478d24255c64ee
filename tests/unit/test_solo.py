"""Unit tests of ``jobguard.solo``: which deliveries are crash-loop suspects, and the gate that
runs a suspect alone (real threads, bounded waits)."""

from __future__ import annotations

import threading

from jobguard.models import Outcome
from jobguard.solo import SoloGate, lost_last
from tests.unit.test_failure_history import attempt


def test_a_delivery_after_a_lost_attempt_is_a_suspect() -> None:
    retried = attempt(1, Outcome.RETRY, 0.0, "KeyError", attempt=1)
    lost = attempt(1, Outcome.LOST, 5.0, attempt=2)
    released = attempt(1, Outcome.RELEASED, 7.0, attempt=3)  # handed back: says nothing
    running = attempt(1, Outcome.RUNNING, 9.0, attempt=3)
    assert lost_last([retried, lost, released, running])
    assert not lost_last([lost, retried, running])
    assert not lost_last([running])


def test_a_suspect_waits_for_the_running_handlers_and_holds_off_the_others() -> None:
    gate = SoloGate()
    order: list[str] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def run(name: str, *, solo: bool, hold: threading.Event | None = None) -> None:
        with gate.running(solo=solo):
            order.append(f"{name} in")
            if hold is not None:
                first_in.set()
                assert hold.wait(10)
            order.append(f"{name} out")

    first = threading.Thread(
        target=run, args=("first",), kwargs={"solo": False, "hold": release_first}
    )
    first.start()
    assert first_in.wait(10)
    suspect = threading.Thread(target=run, args=("suspect",), kwargs={"solo": True})
    suspect.start()
    while not gate.solo:  # the suspect is waiting
        threading.Event().wait(0.001)
    later = threading.Thread(target=run, args=("later",), kwargs={"solo": False})
    later.start()
    release_first.set()
    for thread in (first, suspect, later):
        thread.join(10)
    assert order == ["first in", "first out", "suspect in", "suspect out", "later in", "later out"]
    assert not gate.solo

"""Crash-loop suspects run alone (#18): the culprit of a crash loop is found, not guessed.

A delivery whose previous attempt was lost (its worker died, or stalled past its lease) is a
*suspect*: it may be the job that kills its worker, or only have been in flight beside it. A
worker runs a suspect alone, with no other handler of its own running, so if it kills the
process again, only its own attempt is lost; a healthy neighbour, run alone in turn, completes.
A job that keeps killing its worker then spends its own attempts and is buried alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from jobguard.backends.base import AttemptPort
from jobguard.models import Attempt, Delivery, Outcome

# Attempts that say nothing of the job itself: still running, or handed back uncharged.
_NO_VERDICT = frozenset({Outcome.RUNNING, Outcome.RELEASED, Outcome.DEFERRED})
# Attempts that held their slot to the end and never ended on their own: the worker died with
# them, or gave them up past their soft time limit (a handler that hangs, leaving its thread).
_CRASHED = frozenset({Outcome.LOST, Outcome.TIMED_OUT})


def lost_last(attempts: Sequence[Attempt]) -> bool:
    """Whether the last attempt that ran to an end (in order) was lost (its worker never
    reported back: it crashed, was killed, or stalled past its lease) or timed out."""
    ended = [a for a in attempts if a.outcome not in _NO_VERDICT]
    return bool(ended) and ended[-1].outcome in _CRASHED


def is_suspect(store: AttemptPort, delivery: Delivery) -> bool:
    """Whether ``delivery`` follows a lost attempt of its job (one read, only on redelivery)."""
    if delivery.attempt <= 1:
        return False
    return lost_last(store.attempts(job_id=delivery.job_id))


class SoloGate:
    """Handlers share the worker; a suspect's waits until none runs, and holds the others off."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._solo = False
        self._waiting_solo = 0

    @contextmanager
    def running(self, *, solo: bool) -> Iterator[None]:
        """Hold the gate while one handler runs (alone, if ``solo``)."""
        self.enter(solo=solo)
        try:
            yield
        finally:
            self.leave(solo=solo)

    def enter(self, *, solo: bool) -> None:
        """Wait for a turn to run one handler (alone, if ``solo``); :meth:`leave` ends it."""
        with self._changed:
            if solo:
                self._waiting_solo += 1
                self._changed.wait_for(lambda: not self._solo and self._running == 0)
                self._waiting_solo -= 1
                self._solo = True
            else:
                # A waiting suspect goes first: otherwise a busy worker never lets it run alone.
                self._changed.wait_for(lambda: not self._solo and self._waiting_solo == 0)
            self._running += 1

    def leave(self, *, solo: bool) -> None:
        """One handler's turn is over (it ended, or the worker gave its run up)."""
        with self._changed:
            self._running -= 1
            if solo:
                self._solo = False
            self._changed.notify_all()

    @property
    def solo(self) -> bool:
        """Whether a suspect is running or waiting to (the worker then fetches nothing more)."""
        with self._changed:
            return self._solo or self._waiting_solo > 0

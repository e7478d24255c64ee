"""Faults a worker process inflicts on itself, as the fault plan says (runs inside workers).

* crash: SIGKILL this very process right after an effect committed, before the job is acked.
* freeze: ask the supervisor to stop this process (SIGSTOP) and resume it later; the whole
  process stalls, heartbeat included, like a long GC pause or a VM migration. Crashes in the
  process wait until the frozen delivery has settled, so the freeze is never cut short.
* stall: sleep in the handler, longer than the lease and the lock TTL (the heartbeat keeps both).

The freeze protocol is one line each way: the worker writes ``FREEZE <order_id>`` on stdout and
blocks until the supervisor writes ``THAW`` on its stdin.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

from jobguard.demo.faults import FaultPlan
from jobguard.hooks import Hooks
from jobguard.models import Delivery, Outcome

READY = "READY"
FREEZE = "FREEZE"
THAW = "THAW"
FREEZE_WAIT_S = 15.0

_freeze_lock = threading.Lock()


class Sabotage:
    """The fault actions of one worker process, driven by the shared :class:`FaultPlan`."""

    def __init__(self, plan: FaultPlan, slow_job_s: float) -> None:
        self.plan = plan
        self.slow_job_s = slow_job_s
        # Jobs whose freeze episode is open: from the FREEZE request until the delivery settled.
        self._episodes: set[int] = set()
        self._episodes_changed = threading.Condition()

    def after_effect(self, order_id: int, attempt: int, point: str) -> None:
        """Kill this process if the plan puts a crash right after ``point`` in this delivery.

        A crash waits until no freeze episode is open in this process, so a frozen delivery
        always lives to see its stale write refused (the point of the freeze).
        """
        if self.plan.crash_point(order_id, attempt) != point:
            return
        with self._episodes_changed:
            self._episodes_changed.wait_for(lambda: not self._episodes, timeout=FREEZE_WAIT_S)
        os.kill(os.getpid(), signal.SIGKILL)

    def maybe_freeze(self, order_id: int, job_id: int) -> None:
        """Ask the supervisor to freeze this process if the order is planned to freeze.

        The supervisor freezes each planned order once (the first request from a live process)
        and answers later requests at once.
        """
        if order_id not in self.plan.freeze:
            return
        with self._episodes_changed:
            self._episodes.add(job_id)
        with _freeze_lock:  # one request at a time per process keeps the protocol line-aligned
            sys.stdout.write(f"{FREEZE} {order_id}\n")
            sys.stdout.flush()
            _wait_for_thaw(FREEZE_WAIT_S)

    def settled(self, job_id: int) -> None:
        """A delivery of ``job_id`` ended: close its freeze episode, if any."""
        with self._episodes_changed:
            if job_id in self._episodes:
                self._episodes.discard(job_id)
                self._episodes_changed.notify_all()

    def maybe_stall(self, order_id: int, attempt: int) -> None:
        """Run slower than the lease and the lock TTL if the plan says so."""
        if self.plan.is_slow(order_id, attempt):
            time.sleep(self.slow_job_s)


class SabotageHooks(Hooks):
    """Tells :class:`Sabotage` when a delivery has settled (refusals included)."""

    def __init__(self, sabotage: Sabotage) -> None:
        self._sabotage = sabotage

    def delivery_settled(self, delivery: Delivery, outcome: Outcome, duration_s: float) -> None:
        """Close the delivery's freeze episode."""
        self._sabotage.settled(delivery.job_id)


def _wait_for_thaw(timeout_s: float) -> None:
    """Read one line from stdin (unbuffered) or give up after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    received = b""
    while b"\n" not in received:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        ready, _, _ = select.select([0], [], [], remaining)
        if not ready:
            return
        chunk = os.read(0, 64)
        if not chunk:
            return  # the supervisor is gone; carry on rather than hang
        received += chunk

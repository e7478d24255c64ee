"""The heartbeat: extends every in-flight lease and lock while the worker lives (G2.2, G3.3).

A store error is expected (the store may hiccup): it is reported and the next beat tries again.
A wait that overslept by a whole beat or more means the process stood still (stopped, a paused
VM, swapping): each delivery in flight remembers the longest such stall, so a lease lost to it
is recorded as a stall, not as a slow handler.
Anything else means the heartbeat cannot do its job; it never dies silently: it hands the error
to ``on_failure`` (the worker then stops taking work and says why) and stops.

It also watches how long runs take, and whether they are wanted (#17). It wakes at each run's
soft time limit, and a renewal that reads a cancel asked of the job: either way the run is told
to stop (:meth:`InFlight.stop`: its next step raises, an async handler is cancelled) and
``on_stop`` hears of it. A run told to stop that has not ended ``stop_grace_s`` later (default:
one beat) is given up: it is no longer renewed, and ``on_abandon`` ends it in its place (the
thread worker writes its ending, so its lock is released and its late writes are refused; a
process-mode worker may kill the child that runs it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from jobguard.backends.base import Backend, Renewal, RenewalResult
from jobguard.context import InFlight, stall_of_wait_s, time_limit_exceeded
from jobguard.core import messages
from jobguard.exceptions import JobCancelled, JobGuardError, RunStopped
from jobguard.hooks import Hooks

Watcher = Callable[[InFlight], None]

MIN_INTERVAL_S = 0.05
IDLE_INTERVAL_S = 1.0
MAX_INTERVAL_S = 60.0


def renewal_interval_s(inflight: list[InFlight]) -> float:
    """A third of the shortest lease or lock in flight, so two beats may fail before expiry."""
    periods = [item.delivery.visibility_timeout_s for item in inflight]
    # The delivery's lock TTL counts before the lock is granted: the pipeline takes the lock
    # after this interval was chosen, and nothing wakes the heartbeat then.
    periods += [
        ttl_s for item in inflight if (ttl_s := item.lock_ttl_s or item.delivery.lock_ttl_s)
    ]
    if not periods:
        return IDLE_INTERVAL_S
    # Bounded both ways: a planted row's absurd timeout must not stall or spin the heartbeat.
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, min(periods) / 3.0))


def first_due(inflight: list[InFlight], next_beat: float, interval_s: float) -> float:
    """When the next beat is due: ``next_beat``, or earlier for a delivery no beat has tried
    yet, an interval after its lease began. A fetch that took long (a slow network), or that
    overlapped the last beat, must not leave its first renewal to the beat after next."""
    fresh = [item.renewed_at for item in inflight if not item.renewal_tried]
    return min(next_beat, min(fresh) + interval_s) if fresh else next_beat


class Heartbeat(threading.Thread):
    """Background thread renewing what ``snapshot()`` returns until ``stop()``."""

    def __init__(
        self,
        backend: Backend,
        snapshot: Callable[[], list[InFlight]],
        hooks: Hooks,
        on_failure: Callable[[BaseException], None] | None = None,
        *,
        on_stop: Watcher | None = None,
        on_abandon: Watcher | None = None,
        stop_grace_s: float | None = None,
    ) -> None:
        super().__init__(name="jobguard-heartbeat", daemon=True)
        self._backend = backend
        self._snapshot = snapshot
        self._hooks = hooks
        self._on_failure = on_failure
        self._on_stop = on_stop
        self._on_abandon = on_abandon
        self._stop_grace_s = stop_grace_s
        self._stopped = threading.Event()
        self._wake = threading.Event()
        # While it sleeps: until when, and the interval it chose (None while awake: its next
        # look at the deliveries in flight is still to come).
        self._asleep: tuple[float, float] | None = None
        self._asleep_lock = threading.Lock()

    def stop(self) -> None:
        """Stop renewing (leases then expire on their own or are released)."""
        self._stopped.set()
        self._wake.set()

    def poke(self, arrived: Sequence[InFlight] = ()) -> None:
        """Re-evaluate the interval now: new deliveries arrived (``arrived``, when known).

        When the heartbeat already sleeps no later than the first renewal of every one of
        ``arrived`` needs, it is left asleep (a busy worker fetches many times a second, and a
        wake-up each time costs a thread switch a batch); they are watched by that sleep.
        """
        with self._asleep_lock:
            asleep = self._asleep
            if arrived and asleep is not None:
                until, interval_s = asleep
                due = min(item.renewed_at for item in arrived) + min(
                    interval_s, renewal_interval_s(list(arrived))
                )
                if until <= due:
                    for item in arrived:
                        item.beat_wake_at, item.beat_interval_s = until, interval_s
                    return
        self._wake.set()

    def run(self) -> None:
        """Beat until stopped; on an unexpected error, report it to ``on_failure`` and stop."""
        try:
            last_beat = time.monotonic()
            while not self._stopped.is_set():
                # A poke (new deliveries) only shortens the wait when their leases need it: a
                # fetch must not renew every lease in flight, or a busy worker renews per fetch.
                snapshot = self._snapshot()
                interval_s = renewal_interval_s(snapshot)
                due = first_due(snapshot, last_beat + interval_s, interval_s)
                wake_at = min(due, self._next_watch(snapshot, interval_s))
                timeout_s = max(0.0, wake_at - time.monotonic())
                slept_from = time.monotonic()
                with self._asleep_lock:
                    self._asleep = (slept_from + timeout_s, interval_s)
                for item in snapshot:
                    item.beat_wake_at, item.beat_interval_s = slept_from + timeout_s, interval_s
                poked = self._wake.wait(timeout_s)
                with self._asleep_lock:
                    self._asleep = None
                self._wake.clear()
                if not poked:
                    woke_at = time.monotonic()
                    overslept_s = stall_of_wait_s(slept_from + timeout_s, interval_s, woke_at)
                    if overslept_s:  # a whole beat missed: the process stood still
                        for item in self._snapshot():
                            item.stalled_s = max(item.stalled_s, overslept_s)
                for item in snapshot:  # awake (and any stall marked): later overruns are not
                    item.beat_wake_at = None
                if self._stopped.is_set():
                    return
                self.watch(time.monotonic(), interval_s)
                if time.monotonic() >= due:
                    last_beat = time.monotonic()
                    self.beat()
        except Exception as exc:
            if self._on_failure is None:
                raise
            self._on_failure(exc)

    def beat(self) -> None:
        """Renew everything in flight once; mark the lost ones."""
        snapshot = self._snapshot()
        beat_at = time.monotonic()
        for item in snapshot:
            item.renewal_tried = True
            if item.overdue(beat_at):  # the last beat hung or failed for a whole lease length
                self._hooks.lease_lost(item.delivery, item.lost_reason)
        # Judged lost on this worker's clock is not taken over: such a lease is still renewed,
        # so that while it may be ours no other worker gets the job.
        # A run given up on is renewed no more: its ending was written, or is on its way.
        current = [
            item for item in snapshot if (not item.lost or item.judged_lost) and not item.abandoned
        ]
        if not current:
            return
        renewals = [
            Renewal(item.guard, item.delivery.visibility_timeout_s, item.lock_ttl_s)
            for item in current
        ]
        try:
            results = self._backend.renew(renewals)
        except JobGuardError as exc:
            self._hooks.store_error("heartbeat", exc)
            self._give_up_unrenewable(current)
            return
        for item in current:
            if not item.lost:  # judged lost while the renewal was on its way: that stays
                item.renewed_at = beat_at
        self._hooks.leases_renewed(sum(r.lease_ok and r.lock_ok for r in results))
        for item, result in zip(current, results, strict=True):
            if not item.closing:  # else its own final write is the judge (it may be done)
                self._judge(item, result)

    def _judge(self, item: InFlight, result: RenewalResult) -> None:
        """What one renewal says of a run: a cancel to tell it of, or a lease or lock lost."""
        if result.cancel_requested_by is not None and result.lease_ok:
            actor = result.cancel_requested_by
            self._tell(item, JobCancelled(messages.cancelled(item.delivery.job_id, actor)))
        if not result.lease_ok:
            reason = "lease expired and was taken over"
        elif not result.lock_ok:
            reason = "resource lock expired and was taken over"
        else:
            return
        item.judged_lost = False  # confirmed: the store says so
        if item.mark_lost(reason):
            self._hooks.lease_lost(item.delivery, reason)

    @staticmethod
    def _watched(item: InFlight) -> bool:
        """A run still in its handler's hands (not ending, not given up)."""
        return not (item.closing or item.finishing or item.abandoned)

    def _grace_s(self, interval_s: float) -> float:
        return interval_s if self._stop_grace_s is None else self._stop_grace_s

    def _next_watch(self, snapshot: list[InFlight], interval_s: float) -> float:
        """When a run next passes its soft limit, or its grace after being told to stop."""
        times = [
            item.stopped_at + self._grace_s(interval_s)
            if item.stop_reason is not None
            else item.soft_deadline
            for item in snapshot
            if self._watched(item)
        ]
        return min((t for t in times if t is not None), default=float("inf"))

    def watch(self, now: float, interval_s: float) -> None:
        """Tell runs past their soft limit to stop; give up those told that did not end."""
        for item in self._snapshot():
            if not self._watched(item):
                continue
            if item.stop_reason is None:
                if item.timed_out(now):
                    self._tell(item, time_limit_exceeded(item.delivery))
            elif now >= item.stopped_at + self._grace_s(interval_s) and self._on_abandon:
                self._on_abandon(item)

    def _tell(self, item: InFlight, reason: RunStopped) -> None:
        if item.stop(reason) and self._on_stop is not None:
            self._on_stop(item)

    def _give_up_unrenewable(self, current: list[InFlight]) -> None:
        """The store cannot be reached: a lease not renewed for its whole length may have
        expired and been given to another worker, so treat it as lost (the handler sees
        ``ctx.lease_lost``; the store refuses its writes if it was taken over)."""
        for item in current:
            if item.overdue(time.monotonic()):
                self._hooks.lease_lost(item.delivery, item.lost_reason)

"""The scheduler loop: enqueue each schedule's due ticks, then sleep until the next one.

Any number of schedulers may run at once, on any hosts, for one store: none keeps state of its
own. Each pass reads every schedule's cursor from the store, decides with
:func:`jobguard.core.schedules.plan_ticks` on the store's clock, and writes the decision with
:meth:`~jobguard.backends.base.SchedulePort.advance_schedule`, which moves the cursor only if
no other scheduler moved it first (in the same transaction as the enqueues). The loser of a race
reads again and finds nothing left to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jobguard.core import checks
from jobguard.core.schedules import next_tick, plan_ticks
from jobguard.exceptions import (
    ConfigurationError,
    JobGuardError,
    StoreBrokenError,
    StoreUnavailableError,
)
from jobguard.models import Job
from jobguard.process import default_process_id, on_stop_signals

if TYPE_CHECKING:
    from jobguard.backends.base import Backend
    from jobguard.hooks import Hooks
    from jobguard.schedule import Schedule

log = logging.getLogger("jobguard.scheduler")

MAX_RACES = 10  # re-reads after losing the cursor to another scheduler, per schedule and pass
MIN_SLEEP_S = 0.005
STOP_CHECK_S = 0.05


class SchedulerHost(Protocol):
    """What a scheduler needs of the application whose schedules it runs (the App is one).

    A protocol, so this module knows nothing of the layer above it.
    """

    @property
    def backend(self) -> Backend:
        """The store holding the cursors and the jobs."""

    @property
    def hooks(self) -> Hooks:
        """Callbacks for metrics and logs."""

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """The periodic tasks, by name."""


@dataclass
class SchedulerStats:
    """What one scheduler did: passes made, jobs it enqueued, races it lost to another, and
    how many times one schedule failed in a pass (the others went on)."""

    passes: int = 0
    enqueued: int = 0
    races_lost: int = 0
    failed: int = 0


class Scheduler:
    """Enqueues the due ticks of an app's schedules until stopped.

    Args:
        app: The app whose schedules (``@app.periodic``) to run.
        names: Only these schedules (default: every one declared).
        poll_interval_s: Longest sleep between passes, even when the next tick is further away
            (a store clock that jumps is noticed within this time).
        scheduler_id: Name in the logs; default ``host:pid:random``.
        install_signal_handlers: Stop on SIGTERM/SIGINT when run on the main thread.
    """

    def __init__(
        self,
        app: SchedulerHost,
        names: list[str] | None = None,
        *,
        poll_interval_s: float = 1.0,
        scheduler_id: str | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        poll_interval_s = checks.seconds("poll_interval_s", poll_interval_s, positive=True)
        if not app.schedules:
            raise ConfigurationError("the app declares no schedule (use @app.periodic)")
        unknown = sorted(set(names or ()) - set(app.schedules))
        if unknown:
            known = ", ".join(sorted(app.schedules))
            raise ConfigurationError(f"unknown schedule(s) {unknown} (declared: {known})")
        self.app = app
        self.schedules: list[Schedule] = [
            app.schedules[name] for name in (names or list(app.schedules))
        ]
        self.poll_interval_s = poll_interval_s
        self.scheduler_id = scheduler_id or default_process_id()
        self.install_signal_handlers = install_signal_handlers
        self.stats = SchedulerStats()
        self.failure: StoreBrokenError | None = None
        # Schedules that failed in the last pass, with the reason (the others were enqueued).
        self.failures: dict[str, str] = {}
        # A plain flag, not an Event: a signal handler runs on the main thread, which may be
        # inside Event.wait holding the event's (non-reentrant) lock at that very moment.
        self._stop_requested = False

    def stop(self) -> None:
        """Finish the current pass and return from :meth:`run` (safe from a signal handler)."""
        self._stop_requested = True

    def run_pending(self) -> list[Job]:
        """One pass: enqueue every due tick of every schedule; return the jobs this call stored.

        Raises :class:`~jobguard.exceptions.StoreBrokenError` if the store cannot be used as it
        is: its SQLite file deleted or replaced (checked before anything is read), or read-only.
        A schedule that fails for any other reason is skipped for this pass, with its reason in
        :attr:`failures`, and the others are enqueued all the same.
        """
        backend = self.app.backend
        # A deleted or replaced SQLite file still answers reads and writes on the connections
        # that had it open: without this check the loop would go on ticking into a ghost file.
        backend.check_usable()
        cursors = {state.name: state.cursor for state in backend.schedule_states()}
        stored: list[Job] = []
        self.failures = {}
        for schedule in self.schedules:
            try:
                stored.extend(self._advance(schedule, cursors.get(schedule.name)))
            except StoreUnavailableError:
                raise  # the store, not this schedule: the whole pass is retried
            except Exception as exc:
                # One schedule's failure must not silence the ones after it.
                reason = f"{type(exc).__name__}: {exc}"
                self.failures[schedule.name] = reason
                self.stats.failed += 1
                log.error("schedule %r failed in this pass: %s", schedule.name, reason)
        self.stats.passes += 1
        self.stats.enqueued += len(stored)
        return stored

    def _advance(self, schedule: Schedule, cursor: int | None) -> list[Job]:
        """Enqueue one schedule's due ticks; return the jobs stored (not deduplicated)."""
        backend = self.app.backend
        for _ in range(MAX_RACES):
            now = backend.now()
            plan = plan_ticks(schedule.trigger, schedule.missed, schedule.grace_s, cursor, now)
            if plan is None:
                break
            specs = [(tick, schedule.tick_spec(tick, now)) for tick in plan.ticks]
            jobs = backend.advance_schedule(schedule.name, cursor, plan.cursor, specs)
            if jobs is not None:
                return [job for job in jobs if not job.deduplicated]
            self.stats.races_lost += 1
            cursor = next(
                (s.cursor for s in backend.schedule_states() if s.name == schedule.name),
                None,
            )
        return []

    def run(self, once: bool = False) -> SchedulerStats:
        """Make passes until stopped (SIGTERM, SIGINT or :meth:`stop`); ``once``: one pass.

        A store that cannot be used as it is (:class:`~jobguard.exceptions.StoreBrokenError`:
        read-only, or its SQLite file deleted or replaced) ends the loop too, with the error in
        :attr:`failure`; other store errors are retried.
        """
        restore = self._install_signals()
        try:
            while not self._stop_requested:
                try:
                    self.run_pending()
                except StoreBrokenError as exc:
                    # Retrying cannot help (read-only, file replaced): stop and say why, as a
                    # worker does.
                    log.error("stopping: %s", exc)
                    self.app.hooks.store_error("schedule", exc)
                    self.failure = exc
                    break
                except JobGuardError as exc:
                    # The store hiccuped: nothing was half-written; the next pass decides again.
                    self.app.hooks.store_error("schedule", exc)
                    log.warning("scheduler pass failed, retrying: %s", exc)
                if once:
                    break
                self._sleep(self._sleep_s())
        finally:
            restore()
        return self.stats

    def _sleep(self, seconds: float) -> None:
        """Sleep, waking within :data:`STOP_CHECK_S` of a stop request."""
        deadline = time.monotonic() + seconds
        while not self._stop_requested:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, STOP_CHECK_S))

    def _sleep_s(self) -> float:
        """Until the earliest next tick on the store clock, at most ``poll_interval_s``."""
        try:
            now = self.app.backend.now()
        except JobGuardError:
            return self.poll_interval_s
        upcoming = [next_tick(s.trigger, now) for s in self.schedules]
        soonest = min((tick for tick in upcoming if tick is not None), default=None)
        if soonest is None:
            return self.poll_interval_s
        return min(self.poll_interval_s, max(MIN_SLEEP_S, soonest - now))

    def _install_signals(self) -> Callable[[], None]:
        if not self.install_signal_handlers:
            return lambda: None
        return on_stop_signals(lambda signum: self.stop())

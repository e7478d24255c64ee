"""The worker: fetch with leases, run deliveries on threads, heartbeat, shut down gracefully.

One fetch thread (the caller of :meth:`Worker.run`) keeps a small local buffer of leased jobs
(``concurrency + prefetch``), ``concurrency`` handler threads run them through the pipeline,
the settler thread (:mod:`jobguard.settler`) writes how each delivery ended in batches (one
durable commit for many deliveries, whatever their endings), and the heartbeat thread extends
every lease held, buffered and unsettled ones included.

On SIGTERM or SIGINT (or :meth:`Worker.stop`): no new fetches; buffered jobs are released at
once; running jobs get ``grace_s`` to finish; what still runs then is released without charging
an attempt (G9) and its late writes are refused.

``async def`` handlers run on one event loop the worker owns (:mod:`jobguard.aio`), submitted by
the handler threads. If the heartbeat fails in a way it cannot recover from, or the store turns
out to be unusable (read-only, its file replaced), the worker stops taking work, shuts down as
on SIGTERM, and :attr:`Worker.failure` says why once :meth:`Worker.run` returns.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from jobguard.aio import EventLoopThread
from jobguard.backends.base import Closing, Ending, Prepared
from jobguard.busy import kept_while_busy
from jobguard.context import InFlight
from jobguard.core import checks
from jobguard.core.retry import full_jitter_s
from jobguard.exceptions import (
    ConfigurationError,
    JobGuardError,
    StoreBrokenError,
    WorkerFailedError,
)
from jobguard.heartbeat import Heartbeat
from jobguard.limits import refuse_hard_limits
from jobguard.models import Outcome
from jobguard.pipeline import Pipeline, RunWatch, lost
from jobguard.process import on_stop_signals
from jobguard.scheduler import Scheduler
from jobguard.settler import Settler
from jobguard.solo import SoloGate, is_suspect
from jobguard.task import check_queue_name

if TYPE_CHECKING:
    from jobguard.backends.base import Backend
    from jobguard.hooks import Hooks
    from jobguard.schedule import Schedule
    from jobguard.task import Task


class WorkerHost(Protocol):
    """What a worker needs of the application whose jobs it runs (the App is one).

    A protocol, so this module knows nothing of the layer above it.
    """

    @property
    def backend(self) -> Backend:
        """The store to fetch from."""

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks, by name."""

    @property
    def hooks(self) -> Hooks:
        """Callbacks for metrics and logs."""

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """The periodic tasks, by name (run by ``schedule=True``)."""

    def queues(self) -> list[str]:
        """The default queues of the registered tasks."""


log = logging.getLogger("jobguard.worker")

_STOP = object()
RECONNECT_CAP_S = 5.0
PRUNE_EVERY_MIN_S = 0.1
PRUNE_EVERY_MAX_S = 60.0
MAX_CONCURRENCY = 512
MAX_PREFETCH = 4096


@dataclass
class WorkerStats:
    """Counts of how this worker's deliveries ended."""

    fetched: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    released: int = 0

    def count(self, outcome: Outcome) -> None:
        """Add one delivery that ended with ``outcome``."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def default_worker_id() -> str:
    """``host:pid:random`` — unique per process, readable in the attempt log."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**4):04x}"


class Worker:
    """Runs jobs from some queues until stopped (or, in burst mode, until nothing is ready).

    Handlers run on threads, which cannot be stopped from outside: the worker enforces soft
    time limits (``soft_time_limit_s``) and cancels, and refuses to start with a task that has
    a hard one (``time_limit_s``), which only a process-mode worker enforces.

    Args:
        app: The app whose tasks and store to use.
        queues: Queue names in priority order: earlier queues are fetched from first.
        concurrency: Handler threads.
        prefetch: Extra leased jobs kept buffered beyond ``concurrency`` (leases are renewed).
        grace_s: On shutdown, how long running jobs may take to finish before being released.
        poll_interval_s: Longest sleep between fetches while nothing more is ready (after a
            fetch that found nothing, or fewer jobs than it had room for); an enqueue's
            wake-up or a stop ends it at once.
        worker_id: Name in the attempt log; default ``host:pid:random``.
        heartbeat: Renew leases and locks. Turning it off exists only to show what goes wrong
            without it (``jobguard demo --unsafe``); never do it in production.
        install_signal_handlers: Handle SIGTERM/SIGINT when run on the main thread.
        retention_s: If set, a thread of this worker deletes completed jobs (and their attempt
            rows) finished longer ago than this, in short batches, every ``retention_s / 2``
            seconds (at most every minute); operation records and steps are kept.
        schedule: Also run a scheduler thread that enqueues the ticks of the app's schedules
            (``@app.periodic``); any number of workers may do so at once.
        watch: Told when each handler starts and stops (a process worker's slot reports this
            to its supervisor, which enforces hard time limits).
    """

    # Whether this kind of worker stops a run at its hard time limit (``time_limit_s``): threads
    # cannot, so this one refuses such tasks; a process-mode worker sets it.
    enforces_hard_limits = False

    def __init__(
        self,
        app: WorkerHost,
        queues: list[str] | None = None,
        *,
        concurrency: int = 4,
        prefetch: int | None = None,
        grace_s: float = 30.0,
        poll_interval_s: float = 0.1,
        worker_id: str | None = None,
        heartbeat: bool = True,
        install_signal_handlers: bool = True,
        retention_s: float | None = None,
        schedule: bool = False,
        watch: RunWatch | None = None,
    ) -> None:
        self.concurrency = checks.integer("concurrency", concurrency, 1, MAX_CONCURRENCY)
        self.prefetch = (
            concurrency
            if prefetch is None
            else checks.integer("prefetch", prefetch, 0, MAX_PREFETCH)
        )
        # The fetch loop leases up to the limit, and again once the buffer ran below one batch
        # of work, so fetches stay batched.
        self._limit = self.concurrency + self.prefetch
        self._refill_at = self._limit - max(1, self.prefetch, self.concurrency // 2)
        self.grace_s = checks.seconds("grace_s", grace_s)
        self.poll_interval_s = checks.seconds("poll_interval_s", poll_interval_s, positive=True)
        # Text every store takes: a NUL made every fetch on PostgreSQL fail, as an outage.
        worker_id = checks.optional_text("worker_id", worker_id)
        self.retention_s = checks.optional_seconds("retention_s", retention_s)
        self.app = app
        if not self.enforces_hard_limits:
            refuse_hard_limits(app.tasks.values())
        self.queues = [check_queue_name(q) for q in (queues or app.queues())]
        if not self.queues:
            raise ConfigurationError("the worker has no queue to fetch from")
        self.worker_id = worker_id or default_worker_id()
        self.use_heartbeat = heartbeat
        self.install_signal_handlers = install_signal_handlers
        self.stats = WorkerStats()
        self._inflight: dict[str, InFlight] = {}
        self._inflight_lock = threading.Lock()
        self._slot_freed = threading.Condition(self._inflight_lock)
        # A SimpleQueue: its put and get are C calls, a cost paid once per delivery.
        self._buffer: queue_module.SimpleQueue[InFlight | object] = queue_module.SimpleQueue()
        # Deliveries whose handler is done and whose ending waits in the settler's batch: they
        # hold no handler thread.
        self._finishing = 0
        # A crash-loop suspect was taken and has not finished: it runs alone, and nothing more
        # is fetched meanwhile, so if it kills the process again it takes only itself down.
        self._gate = SoloGate()
        self._solo_pending = False
        self._stopping = threading.Event()
        self._loop = EventLoopThread()
        self._pipeline = Pipeline(
            app.backend,
            app.tasks,
            self.worker_id,
            app.hooks,
            run_async=self._loop.run,
            watch=watch,
            hard_limits=self.enforces_hard_limits,
        )
        self._settler = Settler(
            app.backend,
            self._pipeline,
            app.hooks,
            counted=self.stats.count,
            done=self._done,
            running=lambda: len(self._inflight) - self._finishing,
        )
        # This worker's own task definitions decide each delivery's lease, attempt limit and
        # lock length.
        self._rules = {name: task.delivery_rules() for name, task in app.tasks.items()}
        # Why the worker stopped taking work on its own, if it did (read it after run()).
        self.failure: StoreBrokenError | WorkerFailedError | None = None
        self._rng = random.Random()
        self.scheduler = (
            Scheduler(app, scheduler_id=self.worker_id, install_signal_handlers=False)
            if schedule
            else None
        )
        self._scheduler_thread: threading.Thread | None = None
        self._heartbeat = Heartbeat(
            app.backend,
            self._snapshot,
            app.hooks,
            on_failure=self._heartbeat_failed,
            on_abandon=self._abandon,
        )
        self._threads: list[threading.Thread] = []

    # -- public ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop fetching and shut down gracefully.

        Safe from any thread, but it takes locks: not from inside a signal handler of your own
        (:func:`jobguard.process.on_stop_signals` calls it off the handler).
        """
        self._stopping.set()
        with self._slot_freed:
            self._slot_freed.notify_all()
        self.app.backend.interrupt_wait()  # an idle fetch loop's sleep ends now

    def run(self, burst: bool = False) -> WorkerStats:
        """Work until stopped; with ``burst=True`` return once nothing is ready or running.

        If the worker stopped on its own (its heartbeat failed, or the store became unusable),
        :attr:`failure` holds why: a :class:`~jobguard.exceptions.WorkerFailedError` or a
        :class:`~jobguard.exceptions.StoreBrokenError`. It still shut down as on SIGTERM.
        """
        restore = self._install_signals()
        self.app.backend.expect_handlers(self.concurrency)
        for _ in range(self.concurrency):
            self._start_handler()
        self._settler.start()
        if self.retention_s is not None:
            threading.Thread(
                target=self._prune_loop, name="jobguard-retention", daemon=True
            ).start()
        if self.use_heartbeat:
            self._heartbeat.start()
        self._start_scheduler(burst)
        self.app.hooks.worker_started(self.worker_id, self.queues)
        try:
            with self.app.backend.keep_connection():
                self._fetch_loop(burst)
        finally:
            self._shutdown()
            restore()
        return self.stats

    def _start_scheduler(self, burst: bool) -> None:
        if self.scheduler is None:
            return
        if burst:
            self.scheduler.run(once=True)  # enqueue what is due now, then drain it
            return
        self._scheduler_thread = threading.Thread(
            target=self.scheduler.run, name="jobguard-scheduler", daemon=True
        )
        self._scheduler_thread.start()

    def _heartbeat_failed(self, exc: BaseException) -> None:
        """The heartbeat cannot renew leases any more: stop taking work and say why."""
        reason = (
            f"worker {self.worker_id} stopped taking work: its heartbeat failed with "
            f"{type(exc).__name__}: {exc}; the leases of its jobs would expire under them"
        )
        log.error("%s", reason, exc_info=exc)
        self.failure = WorkerFailedError(reason)
        self.stop()
        try:
            self.app.hooks.worker_failed(self.worker_id, reason)
        except Exception:
            log.exception("the worker_failed hook raised")

    # -- fetching -------------------------------------------------------------------------------

    def _fetch_loop(self, burst: bool) -> None:
        failures = 0
        while not self._stopping.is_set():
            with self._slot_freed:
                while not self._may_fetch():
                    self._slot_freed.wait(self.poll_interval_s)
                room = self._limit - (len(self._inflight) - self._finishing)
                # Read before the fetch: with nothing in flight then, every ending was written
                # before the fetch looked, so an empty fetch means nothing is left (burst).
                idle = not self._inflight
            if self._stopping.is_set():
                return
            # The leases start on the store's side during the fetch: at the latest, judge them
            # from before it.
            asked_at = time.monotonic()
            try:
                deliveries = self.app.backend.fetch_prepared(
                    self.queues, room, self.worker_id, self._rules
                )
            except StoreBrokenError as exc:
                self._fail(exc)
                return
            except JobGuardError as exc:
                self.app.hooks.store_error("fetch", exc)
                failures += 1
                # Full-jitter backoff: workers cut off together (a database restart) do not
                # all reconnect in the same instant.
                pause_s = full_jitter_s(failures, self.poll_interval_s, RECONNECT_CAP_S, self._rng)
                log.warning(
                    "fetch failed (%d in a row), retrying in %.2fs: %s", failures, pause_s, exc
                )
                self._stopping.wait(pause_s)
                continue
            failures = 0
            if deliveries:
                self._accept(deliveries, asked_at)
                if burst or len(deliveries) >= room:
                    continue
                # Fewer than asked: the queues had nothing more ready when the fetch looked.
                # Fetching again at once would find nothing and hold the GIL while the jobs
                # just taken start; an enqueue since then has sent its wake-up already.
            elif burst and idle:
                return
            # Nothing ready: sleep until an enqueue wakes us, polling as the fallback (delayed
            # jobs and retries become ready with no wake-up).
            try:
                self.app.backend.wait_for_jobs(self.queues, self.poll_interval_s)
            except StoreBrokenError as exc:
                self._fail(exc)
                return
            except JobGuardError as exc:
                self.app.hooks.store_error("wait", exc)
                self._stopping.wait(self.poll_interval_s)

    def _may_fetch(self) -> bool:
        """Whether the fetch loop goes on (under ``_slot_freed``): stopping, or room for a
        batch and no crash-loop suspect running. Deliveries waiting only for their batched
        ending hold no handler thread."""
        return self._stopping.is_set() or (
            not self._solo_pending and len(self._inflight) - self._finishing <= self._refill_at
        )

    def _room_changed(self) -> None:
        """Wake the fetch loop (and a shutdown waiting for runs to end) only when it may go
        on (under ``_slot_freed``): a busy worker would otherwise switch to it and back
        twice a job."""
        if self._may_fetch():
            self._slot_freed.notify_all()

    def _fail(self, exc: StoreBrokenError) -> None:
        """The store cannot be used as it is: stop taking work and say why."""
        log.error("stopping: %s", exc)
        self.app.hooks.store_error("fetch", exc)
        self.failure = exc
        self._stopping.set()

    def _accept(self, deliveries: list[Prepared], asked_at: float) -> None:
        adopted = [self._pipeline.adopt(prepared) for prepared in deliveries]
        for item, prepared in zip(adopted, deliveries, strict=True):
            if prepared.granted_at is None:  # the store did not say when the lease began
                item.renewed_at = asked_at
        items = self._suspect_alone(adopted)
        with self._inflight_lock:
            for item in items:
                self._inflight[item.delivery.lease_token] = item
        self.stats.fetched += len(items)
        self._heartbeat.poke(items)
        for item in items:
            self._buffer.put(item)

    def _suspect_alone(self, items: list[InFlight]) -> list[InFlight]:
        """Keep one crash-loop suspect of the batch, alone: the rest go back uncharged."""
        suspect = next((item for item in items if self._is_suspect(item)), None)
        if suspect is None:
            return items
        suspect.solo = True
        with self._slot_freed:
            self._solo_pending = True
        others = [item for item in items if item is not suspect]
        if others:
            try:
                self._hand_back(others)
            except JobGuardError as exc:  # left to their leases
                self.app.hooks.store_error("release", exc)
        return [suspect]

    def _hand_back(self, items: list[InFlight]) -> int:
        """Release these leases without charging an attempt; how many the store took back
        (stale ones are skipped: their jobs already belong to someone else)."""
        releases = [
            Ending(
                item.guard,
                Closing(0.0),
                Outcome.RELEASED,
                operation_key=item.delivery.operation_key,
            )
            for item in items
        ]
        released = 0
        for item, ending, refusal in zip(
            items, releases, self.app.backend.settle(releases), strict=True
        ):
            if refusal is None:
                released += 1
                self._pipeline.report(item, ending)  # its attempt row says released: so do hooks
        return released

    def _is_suspect(self, item: InFlight) -> bool:
        try:
            return is_suspect(self.app.backend, item.delivery)
        except JobGuardError as exc:
            self.app.hooks.store_error("fetch", exc)
            return False

    def _prune_loop(self) -> None:
        """Retention: completed jobs leave the store (and the fetch scan) on a schedule."""
        assert self.retention_s is not None
        every_s = min(PRUNE_EVERY_MAX_S, max(PRUNE_EVERY_MIN_S, self.retention_s / 2))
        while not self._stopping.wait(every_s):
            try:
                pruned = self.app.backend.prune_completed(self.retention_s)
            except JobGuardError as exc:
                self.app.hooks.store_error("prune", exc)
                continue
            if pruned:
                log.info("retention: pruned %d completed jobs", pruned)

    def _snapshot(self) -> list[InFlight]:
        with self._inflight_lock:
            return list(self._inflight.values())

    # -- handling -------------------------------------------------------------------------------

    def _start_handler(self) -> None:
        thread = threading.Thread(
            target=self._handle_loop, name=f"jobguard-handler-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _abandon(self, item: InFlight) -> None:
        """Give up a run told to stop that did not end (its handler never cooperated).

        Its thread cannot be stopped: its ending is written in its place (the lock released,
        the job retried or buried as the stop says), a new handler thread takes its slot, and
        whatever the old thread does when it wakes is discarded (its writes are refused).
        """
        with self._slot_freed:
            if item.finishing or item.abandoned or not item.started:
                return  # it ended meanwhile: its own ending is on its way
            item.abandoned = True
            if item.solo:
                self._solo_pending = False
        item.mark_lost(f"given up by the worker: {item.stop_reason}")
        self._gate.leave(solo=item.solo)
        try:
            ending = self._pipeline.stopped(item, self.app.tasks.get(item.delivery.task))
        except JobGuardError as exc:  # the store failed: left to its lease, which expires
            self.app.hooks.store_error("pipeline", exc)
            ending = lost(item, Closing(0.0), f"store error: {exc}")
        log.warning(
            "job %s: %s; its handler did not stop, giving its run up",
            item.delivery.job_id,
            item.stop_reason,
        )
        with self._slot_freed:
            item.finishing = True
            self._finishing += 1
            self._room_changed()
        if not self._stopping.is_set():
            self._start_handler()  # the stuck thread's slot keeps working
        self._settler.put(item, ending)

    def _handle_loop(self) -> None:
        with closing(kept_while_busy(self._buffer, self.app.backend.keep_connection)) as items:
            self._handle_each(items)

    def _handle_each(self, items: Iterator[InFlight | object]) -> None:
        for item in items:
            if item is _STOP:
                return
            assert isinstance(item, InFlight)
            if self._stopping.is_set():
                # Shutdown began while this lease sat in the buffer: hand it back untouched.
                self._done(item)
                continue
            item.started = True
            self._gate.enter(solo=item.solo)
            try:
                ending = self._pipeline.run(item)
            except BaseException:
                # A bug of the pipeline (never a handler's error, which is the job's): the
                # slot keeps working, and the lease expires so the job is redelivered.
                log.exception("job %s: unexpected error in the pipeline", item.delivery.job_id)
                ending = lost(item, Closing(0.0), "unexpected error in the pipeline")
            if ending.outcome is Outcome.LOST:
                log.warning(
                    "job %s: %s; leaving it to its lease", item.delivery.job_id, ending.reason
                )
            with self._slot_freed:
                if item.abandoned:
                    # Given up while it hung: its ending was written for it, and another thread
                    # took this one's slot. This late ending is discarded, and the thread ends.
                    log.warning("job %s: a run given up came back late", item.delivery.job_id)
                    return
                item.finishing = True
                self._finishing += 1
                if item.solo:
                    self._solo_pending = False
                self._room_changed()
            self._gate.leave(solo=item.solo)
            self._settler.put(item, ending)

    def _done(self, item: InFlight) -> None:
        with self._slot_freed:
            if item.finishing:
                item.finishing = False
                self._finishing -= 1
            if not (self._stopping.is_set() and not item.started):
                self._inflight.pop(item.delivery.lease_token, None)
            self._room_changed()

    # -- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stopping.set()
        if self.scheduler is not None:
            self.scheduler.stop()
        for _ in list(self._threads):
            self._buffer.put(_STOP)
        started = time.monotonic()
        with self._slot_freed:
            while True:
                running = [item for item in self._inflight.values() if item.started]
                deadline = started + self.grace_s  # re-read: a second signal sets it to 0
                if not running or time.monotonic() >= deadline:
                    break
                self._slot_freed.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        # Write the endings of work already done before handing anything back: a released job
        # would run again.
        self._settler.stop(timeout_s=max(5.0, self.grace_s))
        with self._slot_freed:
            leftovers = list(self._inflight.values())
            self._inflight.clear()
        self._heartbeat.stop()
        if self._scheduler_thread is not None:
            self._scheduler_thread.join()
        if leftovers:
            for item in leftovers:
                item.mark_lost("released at shutdown")
            try:
                self.stats.released = self._hand_back(leftovers)
            except JobGuardError as exc:
                self.app.hooks.store_error("release", exc)
                log.warning("could not release %d leases at shutdown: %s", len(leftovers), exc)
        # After the release: a cancelled coroutine's late writes are then refused, as a sync
        # handler's are, and never charge the attempt.
        self._loop.close()
        self.app.hooks.worker_stopped(self.worker_id, self.stats.released)

    def _install_signals(self) -> Callable[[], None]:
        if not self.install_signal_handlers:
            return lambda: None
        return on_stop_signals(self._on_signal)

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT, handled off the signal handler (see :func:`on_stop_signals`)."""
        if self._stopping.is_set():
            self.grace_s = 0.0  # a second signal: stop waiting for running jobs
        log.info("signal %d: stopping gracefully", signum)
        self.stop()

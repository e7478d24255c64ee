"""The process worker: each slot a child process running one job at a time, supervised.

Threads are the default worker (:class:`~jobguard.worker.Worker`). A thread cannot be stopped
from outside, so a handler that never returns (blocked on a socket with no timeout) holds its
job and its resource lock for as long as the process lives. :class:`ProcessWorker` runs each
slot as a child process (:mod:`jobguard.slots`), which can be: the supervisor knows which job
each slot runs and since when, and the slot that passes the job's hard time limit is killed
with SIGKILL and replaced; so is one whose run was told to stop (its soft limit passed, or it
was cancelled) and did not within a heartbeat, where a thread worker would leave the run going
on its thread. The supervisor then settles that attempt (timed out, or cancelled) through the
same settle every ending goes through: the lease it proves is the killed slot's, which nobody
renews any more, and once the job moved on every write of the dead run is refused.

A slot that dies of its own accord (SIGKILL from outside, a crash) is replaced; its job is left
to its lease, as any crashed worker's is, and its next delivery runs as a crash-loop suspect.

The supervisor holds no lease and writes nothing but those timeouts. It times runs on the
host's monotonic clock: the limit is a duration of one run on this host, to decide when to
kill a local process, and must not jump with the wall clock. What decides the lease and the
lock stays the store's clock, proven by the settle.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from jobguard.context import InFlight
from jobguard.core import checks, messages
from jobguard.exceptions import (
    ConfigurationError,
    HardTimeLimitExceeded,
    JobGuardError,
    RunStopped,
    StoreBrokenError,
    WorkerFailedError,
)
from jobguard.models import Delivery
from jobguard.pipeline import Pipeline
from jobguard.process import default_process_id, on_stop_signals
from jobguard.settler import Settler
from jobguard.slots import (
    STOP,
    STOP_NOW,
    STOP_SIGNALS,
    Began,
    Ended,
    Exited,
    GiveUp,
    SlotSpec,
    run_slot,
)
from jobguard.task import check_queue_name
from jobguard.worker import WorkerHost, WorkerStats

log = logging.getLogger("jobguard.worker")

MAX_PROCESSES = 256
STOP_MARGIN_S = 10.0  # beyond grace_s: a slot's last settle and release before it is killed
REAP_WAIT_S = 10.0  # a SIGKILLed process is gone at once, unless stuck in the kernel
QUICK_DEATH_S = 1.0  # a slot dying sooner than this after its start is restarted with backoff
RESTART_MIN_S = 0.1
RESTART_MAX_S = 5.0
IDLE_WAKE_S = 1.0


@dataclass(frozen=True, slots=True)
class SlotRun:
    """What one slot of a :class:`ProcessWorker` runs now.

    Attributes:
        slot: The slot's number (0-based).
        pid: Its process id.
        job_id: The job its handler runs.
        attempt: Which delivery of the job.
        task: The job's task.
        running_s: How long the handler has run (the host's monotonic clock).
        time_limit_s: The run's hard limit, if it has one.
    """

    slot: int
    pid: int
    job_id: int
    attempt: int
    task: str
    running_s: float
    time_limit_s: float | None


def _nothing() -> None:
    """Nothing to undo (no signal handlers were installed)."""


class _Slot:
    """One child process and what the supervisor knows of it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None
        self.run: Began | None = None
        self.deadline: float | None = None  # monotonic; when the run passes its hard limit
        self.give_up: RunStopped | None = None  # the run was told to stop and did not
        self.born = 0.0
        self.restart_at = 0.0
        self.quick_deaths = 0
        self.done = False  # a burst slot that found nothing more to do

    @property
    def pid(self) -> int:
        """The slot's process id (0 while it has none)."""
        if self.process is None or self.process.pid is None:
            return 0
        return self.process.pid


class ProcessWorker:
    """Runs jobs in ``processes`` child processes, one job at a time each, until stopped.

    Takes the options of :class:`~jobguard.worker.Worker` that make sense per slot; each slot
    is a worker with one handler and nothing prefetched. On SIGTERM or SIGINT (or
    :meth:`stop`) every slot stops fetching and its running job gets ``grace_s`` to finish, then
    is released uncharged, as in a thread worker; a second signal stops waiting. A slot still
    alive ``grace_s`` plus a margin later is killed and its job left to its lease.

    Args:
        app: The app whose tasks and store to use.
        queues: Queue names in priority order (default: every registered task's queue).
        processes: How many slots (child processes) run at once.
        grace_s: On shutdown, how long running jobs may take to finish before being released.
        poll_interval_s: Longest sleep of a slot between fetches while the queues are empty.
        worker_id: Prefix of the slots' names in the attempt log (``PREFIX/SLOT:PID``).
        install_signal_handlers: Handle SIGTERM/SIGINT when run on the main thread.
        retention_s: If set, slot 0 prunes completed jobs as a thread worker does.
        schedule: Slot 0 also enqueues the ticks of the app's schedules.
        time_limit_s: The hard time limit of a run whose job has none of its own: a slot whose
            handler runs longer is killed and replaced, and the attempt settled as timed out
            (``None``: only the jobs' own limits).
    """

    def __init__(
        self,
        app: WorkerHost,
        queues: list[str] | None = None,
        *,
        processes: int = 2,
        grace_s: float = 30.0,
        poll_interval_s: float = 0.1,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        retention_s: float | None = None,
        schedule: bool = False,
        time_limit_s: float | None = None,
    ) -> None:
        self.processes = checks.integer("processes", processes, 1, MAX_PROCESSES)
        self.grace_s = checks.seconds("grace_s", grace_s)
        self.poll_interval_s = checks.seconds("poll_interval_s", poll_interval_s, positive=True)
        self.retention_s = checks.optional_seconds("retention_s", retention_s)
        self.time_limit_s = checks.optional_seconds("time_limit_s", time_limit_s, positive=True)
        self.worker_id = checks.optional_text("worker_id", worker_id) or default_process_id()
        self.app = app
        self.queues = [check_queue_name(q) for q in (queues or app.queues())]
        if not self.queues:
            raise ConfigurationError("the worker has no queue to fetch from")
        self.install_signal_handlers = install_signal_handlers
        self.schedule = schedule
        self.stats = WorkerStats()
        # Why the worker stopped on its own, if it did (read it after run()).
        self.failure: StoreBrokenError | WorkerFailedError | None = None
        self._slots = [_Slot(index) for index in range(self.processes)]
        self._context = multiprocessing.get_context("fork")
        self._stopping = False
        self._now = False  # a second stop: slots stop waiting for their running jobs
        self._told: set[int] = set()  # slots (by pid) told to stop, and how
        self._told_now: set[int] = set()
        self._stop_deadline: float | None = None
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    # -- public ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every slot to stop fetching and shut down gracefully (safe from any thread)."""
        self._stopping = True
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"\0")

    def running(self) -> list[SlotRun]:
        """What each busy slot runs now, and for how long."""
        now = time.monotonic()
        return [
            SlotRun(
                slot.index,
                slot.pid,
                slot.run.delivery.job_id,
                slot.run.delivery.attempt,
                slot.run.delivery.task,
                now - slot.run.started_at,
                self.hard_limit_s(slot.run.delivery),
            )
            for slot in self._slots
            if slot.run is not None
        ]

    def hard_limit_s(self, delivery: Delivery) -> float | None:
        """The hard time limit of a delivery's run, in seconds: the job's own
        (``time_limit_s`` of its task or call), else this worker's (``None``: no limit)."""
        if delivery.time_limit_s is not None:
            return delivery.time_limit_s
        return self.time_limit_s

    def run(self, burst: bool = False) -> WorkerStats:
        """Supervise the slots until stopped; with ``burst=True`` until every slot found
        nothing ready (a slot killed or crashed meanwhile is replaced first)."""
        self._burst = burst
        restore: Callable[[], None] = _nothing
        if self.install_signal_handlers:
            restore = on_stop_signals(self._on_signal)
        try:
            while self._alive():
                self._keep_slots()
                self._wait()
                self._enforce_limits()
        finally:
            self._kill_all("the supervisor is exiting")
            restore()
        return self.stats

    # -- the loop -------------------------------------------------------------------------------

    def _alive(self) -> bool:
        """Whether any slot lives or is yet to be (re)started."""
        if any(slot.process is not None for slot in self._slots):
            return True
        return not self._stopping and not all(slot.done for slot in self._slots)

    def _keep_slots(self) -> None:
        now = time.monotonic()
        if self._stopping:
            self._stop_slots(now)
            return
        for slot in self._slots:
            if slot.process is None and not slot.done and now >= slot.restart_at:
                self._start(slot)

    def _wait(self) -> None:
        """Sleep until a slot reports (or dies), a stop is asked, or a deadline comes."""
        now = time.monotonic()
        wakes = [slot.deadline for slot in self._slots if slot.deadline is not None]
        wakes += [s.restart_at for s in self._slots if s.process is None and not s.done]
        if self._stop_deadline is not None:
            wakes.append(self._stop_deadline)
        timeout_s = max(0.0, min([now + IDLE_WAKE_S, *wakes]) - now)
        conns = {slot.conn: slot for slot in self._slots if slot.conn is not None}
        for ready in wait([*conns, self._wake_read], timeout_s):
            if ready == self._wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 512)
                continue
            assert isinstance(ready, Connection)
            self._read(conns[ready])

    def _read(self, slot: _Slot) -> None:
        """Take in what the slot said; reap it if it is gone."""
        assert slot.conn is not None
        try:
            while slot.conn.poll():
                self._heard(slot, slot.conn.recv())
        except (EOFError, OSError):
            self._reap(slot)

    def _heard(self, slot: _Slot, message: object) -> None:
        if isinstance(message, Began):
            slot.run, slot.give_up = message, None
            limit_s = self.hard_limit_s(message.delivery)
            slot.deadline = None if limit_s is None else message.started_at + limit_s
            slot.quick_deaths = 0  # it got as far as running a job: not a crash loop of slots
        elif isinstance(message, Ended):
            if slot.run is not None and slot.run.guard.attempt_id == message.attempt_id:
                slot.run, slot.deadline, slot.give_up = None, None, None
        elif isinstance(message, GiveUp):
            if slot.run is not None and slot.run.guard.attempt_id == message.attempt_id:
                slot.give_up = message.reason  # killed by the loop, not in the middle of a read
        elif isinstance(message, Exited):
            # Its worker stopped: a run it still had was released at the end of its grace.
            slot.run, slot.deadline, slot.give_up = None, None, None
            self._count(message)

    def _count(self, exited: Exited) -> None:
        self.stats.fetched += exited.fetched
        self.stats.released += exited.released
        for outcome, count in exited.outcomes.items():
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + count
        if exited.store_broken and exited.failure is not None:
            self.failure = StoreBrokenError(exited.failure)
            self.stop()  # every slot would find the same store
        elif exited.failure is not None:
            log.error("a slot stopped taking work: %s", exited.failure)

    # -- starting and reaping -------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        ours, theirs = self._context.Pipe(duplex=True)
        # Descriptors the slot must not hold: the other slots' ends, or a slot's death would
        # not close its pipe; the supervisor's wake-up pipe.
        inherited = [s.conn.fileno() for s in self._slots if s.conn is not None]
        inherited += [self._wake_read, self._wake_write, ours.fileno()]
        first = slot.index == 0
        spec = SlotSpec(
            queues=self.queues,
            grace_s=self.grace_s,
            poll_interval_s=self.poll_interval_s,
            worker_id=f"{self.worker_id}/{slot.index}",
            heartbeat=True,
            retention_s=self.retention_s if first else None,
            schedule=self.schedule and first,
            burst=self._burst,
        )
        process = self._context.Process(
            target=run_slot,
            args=(self.app, spec, theirs, inherited),
            name=f"jobguard-slot-{slot.index}",
        )
        # Blocked over the fork: a stop signal must not reach the child before it ignores them.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            theirs.close()
        slot.process, slot.conn, slot.born = process, ours, time.monotonic()
        log.info("slot %d started as process %s", slot.index, process.pid)

    def _reap(self, slot: _Slot) -> None:
        """The slot's pipe closed: its process is gone. Replace it unless that is over."""
        process, conn = slot.process, slot.conn
        assert process is not None
        assert conn is not None
        process.join(REAP_WAIT_S)
        conn.close()
        slot.process, slot.conn = None, None
        code = process.exitcode
        if slot.run is not None:
            log.warning(
                "slot %d (process %s) died (exit %s) running job %s: it is left to its lease, "
                "and its next delivery runs as a crash-loop suspect",
                slot.index,
                process.pid,
                code,
                slot.run.delivery.job_id,
            )
            slot.run, slot.deadline = None, None
        now = time.monotonic()
        if code == 0 and self._burst:
            slot.done = True
            return
        if now - slot.born < QUICK_DEATH_S:
            slot.quick_deaths += 1
        slot.restart_at = now + min(RESTART_MAX_S, RESTART_MIN_S * 2**slot.quick_deaths)
        if slot.quick_deaths == 0:
            slot.restart_at = now

    def _stop_slots(self, now: float) -> None:
        """Pass the stop on to every slot (once each, and once more on a second stop); kill
        what still runs when the time for it is over."""
        if self._stop_deadline is None:
            self._stop_deadline = now + self.grace_s + STOP_MARGIN_S
        for slot in self._slots:
            if slot.conn is None or slot.process is None:
                continue
            pid = slot.pid
            if pid not in self._told:
                self._order(slot, STOP)
                self._told.add(pid)
            if self._now and pid not in self._told_now:
                self._order(slot, STOP_NOW)
                self._told_now.add(pid)
        if now >= self._stop_deadline:
            self._kill_all("it did not stop within grace_s")

    def _order(self, slot: _Slot, order: str) -> None:
        assert slot.conn is not None
        with contextlib.suppress(OSError):  # it died meanwhile: its pipe says so next
            slot.conn.send(order)

    def _kill_all(self, why: str) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.process.is_alive():
                log.warning("killing slot %d (process %s): %s", slot.index, slot.pid, why)
                slot.process.kill()
            if slot.process is not None:
                self._read(slot)  # what it said last, then reaped
                if slot.process is not None:
                    self._reap(slot)

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT (off the signal handler): stop; a second one stops waiting."""
        if self._stopping:
            self._now = True
        log.info("signal %d: stopping gracefully", signum)
        self.stop()

    # -- hard limits ----------------------------------------------------------------------------

    def _enforce_limits(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.run is None:
                continue
            if slot.give_up is not None:  # a cancel's stop wins over a timeout: never retried
                self._stop_run(slot, slot.give_up)
            elif slot.deadline is not None and now >= slot.deadline:
                limit_s = self.hard_limit_s(slot.run.delivery)
                running_s = now - slot.run.started_at
                self._stop_run(
                    slot,
                    HardTimeLimitExceeded(
                        messages.hard_limit_passed(slot.run.delivery.job_id, running_s, limit_s)
                    ),
                )

    def _stop_run(self, slot: _Slot, reason: RunStopped) -> bool:
        """Kill the slot for the run it has and write that run's ending as ``reason`` says;
        whether it did (False: the handler ended before it was killed)."""
        run, process, conn = slot.run, slot.process, slot.conn
        if run is None or process is None or conn is None:
            return False
        process.kill()
        process.join(REAP_WAIT_S)
        ended = False
        with contextlib.suppress(EOFError, OSError):  # read up to its pipe's end
            while conn.poll():
                message = conn.recv()
                if isinstance(message, Ended) and message.attempt_id == run.guard.attempt_id:
                    ended = True  # done before the kill: its ending is its own (or its lease's)
                elif isinstance(message, Exited):
                    self._count(message)
                    ended = True  # its worker had stopped: it released what it still held
        slot.run, slot.deadline, slot.give_up = None, None, None
        self._reap(slot)
        slot.restart_at = time.monotonic()  # killed for its job, not a slot that cannot start
        if ended:
            return False
        self._settle_stopped(run, reason)
        return True

    def _settle_stopped(self, run: Began, reason: RunStopped) -> None:
        """Write the ending of a run killed for ``reason``: through the settle every ending
        goes through, with the killed run's lease and lock grant, which nobody renews now."""
        inflight = InFlight(run.delivery, run.guard, run.lock_ttl_s)
        inflight.run_started = run.started_at  # one monotonic clock for the host's processes
        inflight.stop(reason)
        pipeline = Pipeline(self.app.backend, self.app.tasks, run.worker_id, self.app.hooks)
        settler = Settler(
            self.app.backend,
            pipeline,
            self.app.hooks,
            counted=self.stats.count,
            done=lambda _: None,
        )
        try:
            ending = pipeline.stopped(inflight, self.app.tasks.get(run.delivery.task))
            (final,) = settler.settle([(inflight, ending)])
        except JobGuardError as error:  # the store failed: the job is left to its lease
            self.app.hooks.store_error("settle", error)
            return
        log.warning(
            "job %s: its process was killed: %s; %s", run.delivery.job_id, reason, final.outcome
        )

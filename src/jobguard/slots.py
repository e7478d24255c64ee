"""One slot of a process worker: a child process that runs one job at a time.

The slot is a :class:`~jobguard.worker.Worker` (one handler thread, nothing prefetched), so it
keeps every guarantee of one: its leases are renewed by its own heartbeat,
its writes prove their fence, a crash-loop suspect runs alone (one job at a time, in a process
of its own), and every ending goes through its settler. What the slot adds is a report to its
supervisor over a pipe: which delivery its handler runs, under which guard, since when
(:class:`Began`, :class:`Ended`), a run told to stop that did not (:class:`GiveUp`: the
supervisor kills it, where a thread worker would leave it running on a thread), and how it
stopped (:class:`Exited`). The supervisor sends
back when to stop (:data:`STOP`, :data:`STOP_NOW`); the slot ignores SIGTERM and SIGINT, which
a process group or a terminal would also send it, so that one signal to the worker is one
graceful stop, not two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from jobguard.context import InFlight
from jobguard.exceptions import RunStopped, StoreBrokenError
from jobguard.models import Delivery, Guard, Outcome
from jobguard.worker import Worker, WorkerHost

log = logging.getLogger("jobguard.worker")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
STOP = "stop"  # stop fetching; running jobs get grace_s, as on SIGTERM
STOP_NOW = "now"  # stop waiting for running jobs (a second SIGTERM)
EXIT_FAILED = 1
EXIT_STORE_BROKEN = 3


@dataclass(frozen=True, slots=True)
class Began:
    """A slot's handler started running a delivery.

    Attributes:
        delivery: What runs.
        guard: Its lease and, if it holds one, its lock grant (what an ending must prove).
        lock_ttl_s: The lock's TTL, if it holds one.
        worker_id: The slot's name in the attempt log.
        started_at: ``time.monotonic()`` when the handler was called: one clock for every
            process of the host, unmoved by changes of the wall clock.
    """

    delivery: Delivery
    guard: Guard
    lock_ttl_s: float | None
    worker_id: str
    started_at: float


@dataclass(frozen=True, slots=True)
class Ended:
    """The handler of this attempt returned or raised (its ending is written after this)."""

    attempt_id: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A run told to stop (past its soft limit, or cancelled) did not end in time: the slot
    asks its supervisor to kill it and write its ending, as ``reason`` says."""

    attempt_id: int
    reason: RunStopped


@dataclass(frozen=True, slots=True)
class Exited:
    """The slot's worker stopped: its counts, and why if it failed."""

    fetched: int
    released: int
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    failure: str | None = None
    store_broken: bool = False


@dataclass(frozen=True, slots=True)
class SlotSpec:
    """How the supervisor wants a slot's worker run."""

    queues: list[str]
    grace_s: float
    poll_interval_s: float
    worker_id: str
    heartbeat: bool
    retention_s: float | None
    schedule: bool
    burst: bool


class _Reporter:
    """The slot's :class:`~jobguard.pipeline.RunWatch`: tells the supervisor over the pipe."""

    def __init__(self, conn: Connection, worker_id: str) -> None:
        self._conn = conn
        self._worker_id = worker_id
        # The handler thread and the main thread both send; one message at a time on the pipe.
        self._sending = threading.Lock()

    def handler_started(self, inflight: InFlight) -> None:
        """Report the run with its guard (the lock is held by now)."""
        self.send(
            Began(
                inflight.delivery,
                inflight.guard,
                inflight.lock_ttl_s,
                self._worker_id,
                time.monotonic(),
            )
        )

    def handler_ended(self, inflight: InFlight) -> None:
        """Report that the handler is done (sent before its ending is written)."""
        self.send(Ended(inflight.delivery.attempt_id))

    def send(self, message: object) -> None:
        """Send one message; a supervisor gone is noticed by :func:`_obey` (it stops us)."""
        with self._sending, contextlib.suppress(OSError):
            self._conn.send(message)


class SlotWorker(Worker):
    """The worker of a slot: its supervisor kills a run at its hard time limit, so it takes
    tasks that have one; and a run it would give up on is killed rather than left running on
    a thread of its own."""

    enforces_hard_limits = True

    def __init__(
        self, app: WorkerHost, queues: list[str], reporter: _Reporter, **options: Any
    ) -> None:
        super().__init__(app, queues, watch=reporter, **options)
        self._reporter = reporter
        self._asked: set[int] = set()

    def _abandon(self, item: InFlight) -> None:
        """A run told to stop did not end: ask the supervisor to kill this process and write
        its ending (a thread cannot be stopped; a process can). Its lease is renewed until
        then, so that ending is still this delivery's to write."""
        attempt_id = item.delivery.attempt_id
        if item.stop_reason is None or attempt_id in self._asked:
            return
        self._asked.add(attempt_id)
        log.warning(
            "job %s: %s; its handler did not stop, asking for its process to be killed",
            item.delivery.job_id,
            item.stop_reason,
        )
        self._reporter.send(GiveUp(attempt_id, item.stop_reason))


def _obey(conn: Connection, worker: Worker) -> None:
    """Carry out the supervisor's orders; its end closing (it died) stops us gracefully."""
    while True:
        try:
            order = conn.recv()
        except (EOFError, OSError):
            worker.stop()
            return
        if order == STOP_NOW:
            worker.grace_s = 0.0  # read again by the worker's shutdown while it waits
        worker.stop()


def run_slot(app: WorkerHost, spec: SlotSpec, conn: Connection, inherited: list[int]) -> NoReturn:
    """The whole life of a slot process, entered right after the fork with SIGTERM and SIGINT
    blocked; ``inherited`` are descriptors of the supervisor's that the slot must not hold."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # the supervisor alone decides when a slot stops
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    code = EXIT_FAILED
    try:
        worker_id = f"{spec.worker_id}:{os.getpid()}"
        reporter = _Reporter(conn, worker_id)
        worker = SlotWorker(
            app,
            spec.queues,
            reporter,
            concurrency=1,
            prefetch=0,
            grace_s=spec.grace_s,
            poll_interval_s=spec.poll_interval_s,
            worker_id=worker_id,
            heartbeat=spec.heartbeat,
            install_signal_handlers=False,
            retention_s=spec.retention_s,
            schedule=spec.schedule,
        )
        threading.Thread(
            target=_obey, args=(conn, worker), name="jobguard-slot-orders", daemon=True
        ).start()
        stats = worker.run(burst=spec.burst)
        failure = worker.failure
        reporter.send(
            Exited(
                stats.fetched,
                stats.released,
                dict(stats.outcomes),
                str(failure) if failure is not None else None,
                isinstance(failure, StoreBrokenError),
            )
        )
        if failure is None:
            code = 0
        elif isinstance(failure, StoreBrokenError):
            code = EXIT_STORE_BROKEN
    except BaseException:
        log.exception("slot %s: the worker failed", spec.worker_id)
    finally:
        # No interpreter shutdown: the supervisor's objects copied by the fork (its store
        # connections among them) are not this process's to close.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

"""The ports: the only things a storage backend implements.

Every method that changes a delivery takes the :class:`~jobguard.models.Guard` of that delivery
and is refused with :class:`~jobguard.exceptions.LeaseLostError` when the lease token is stale.
Writes of effects (steps, ``db_step``, the operation's completion when a success is settled) are
also refused with :class:`~jobguard.exceptions.StaleFenceError` when a newer lock grant exists for
the resource; moving the job back (a retry, deferral, burial or release ending) needs only the
lease, so a delivery that lost its lock but not its lease can still hand the job back.
Each docstring states what the method does atomically. Times come from the store's clock.

The pipeline is written once against these protocols; a backend is done when it passes the
conformance suite in ``tests/contract/``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from jobguard.core.hosts import Admit
from jobguard.core.selection import DeadFilter, ReplayBatch
from jobguard.exceptions import JobGuardError
from jobguard.models import (
    Attempt,
    AuditEntry,
    BusyReason,
    DeadCode,
    Delivery,
    Guard,
    Job,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    Outcome,
    OutcomeCount,
    PausedQueue,
    QueueStats,
    ScheduleState,
)

if TYPE_CHECKING:
    from jobguard.steptx import StepTransactions

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What went wrong in a delivery, as stored in the attempt log and on the job."""

    type: str
    message: str
    traceback: str | None = None
    signature: str | None = None
    same_count: int = 0


@dataclass(frozen=True, slots=True)
class Closing:
    """Attempt metadata the worker measured (its monotonic clock) and hands over at the end."""

    duration_s: float
    steps_run: int = 0
    steps_skipped: int = 0


# The outcomes an ending can carry, by what settling it writes.
SUCCESS_OUTCOMES = frozenset({Outcome.COMPLETED, Outcome.ALREADY_PROCESSED})
REFUSED_OUTCOMES = frozenset({Outcome.LEASE_REFUSED, Outcome.FENCE_REFUSED})
SETTLED_OUTCOMES = (
    SUCCESS_OUTCOMES
    | REFUSED_OUTCOMES
    | {
        Outcome.RETRY,
        Outcome.TIMED_OUT,
        Outcome.DEFERRED,
        Outcome.DEAD,
        Outcome.RELEASED,
    }
)


@dataclass(frozen=True, slots=True)
class Ending:
    """How one delivery ends, decided above the port and written by :meth:`QueuePort.settle`.

    ``outcome`` says what is written:

    - ``completed`` / ``already_processed``: the job is done (``operation_key`` with
      ``result_json`` and ``external_ref``: its operation completed); proven by lease, fence and
      claim.
    - ``retry``: requeued after ``delay_s`` with ``error``; the attempt stays charged, the
      operation claim (``operation_key``) is dropped.
    - ``timed_out``: the run passed its soft time limit; as ``retry``, or, with ``code``,
      as ``dead`` (the task's rules buried it), the attempt recorded as timed out.
    - ``deferred``: requeued after ``delay_s``, the attempt handed back (``reason``).
    - ``dead``: buried with ``code``, ``reason`` and ``error``; the operation marked failed.
    - ``released``: handed back now, uncharged, its claim dropped (graceful shutdown).
    - ``lease_refused`` / ``fence_refused``: a write of this stale delivery was refused; only
      its own attempt row is marked (``reason``). A fence-refused one whose lease is still
      current also hands the job back uncharged after ``delay_s``.
    - ``lost``: nothing is written (the store failed mid-delivery; the lease expires).

    Every kind but the refused ones and ``lost`` needs the lease; a success also needs the
    newest fence of its lock and the operation's claim. Each also releases the lock it holds
    and closes the attempt with ``closing``.
    """

    guard: Guard
    closing: Closing
    outcome: Outcome = Outcome.COMPLETED
    delay_s: float = 0.0
    code: DeadCode | None = None
    reason: str = ""
    error: ErrorInfo | None = None
    operation_key: str | None = None
    result_json: str | None = None
    external_ref: str | None = None

    @property
    def writes(self) -> bool:
        """Whether settling this ending writes anything (``lost`` does not)."""
        return self.outcome in SETTLED_OUTCOMES


@dataclass(frozen=True, slots=True)
class DeliveryRules:
    """What the fetching worker's own task definition gives each delivery of one task.

    The worker's definition rules delivery, not the copy the enqueuing process had: after a
    deploy that changes a task's lease, old producers do not keep handing out the old one.
    """

    visibility_timeout_s: float | None  # None: the queue's, as stored at enqueue
    max_attempts: int
    lock_ttl_s: float = 30.0  # the lock's and the slot's length, for a job that takes them


@dataclass(frozen=True, slots=True)
class Renewal:
    """One in-flight delivery for the heartbeat to extend, with its lease and lock lengths
    (``lock_ttl_s`` is also the length of its concurrency slot)."""

    guard: Guard
    visibility_timeout_s: float
    lock_ttl_s: float | None


@dataclass(frozen=True, slots=True)
class RenewalResult:
    """Whether the lease and the lock and slot (if any) were still ours when the heartbeat
    extended them (``lock_ok`` is false if either the lock or the slot was lost), and who asked
    to cancel the job, if anyone did (its run is then told to stop)."""

    lease_ok: bool
    lock_ok: bool
    cancel_requested_by: str | None = None


@dataclass(frozen=True, slots=True)
class BeginRequest:
    """What the pipeline needs before running a handler: a lock, a concurrency slot (one of
    ``concurrency_limit`` of ``concurrency_key``) and/or an operation claim. The lock and the
    slot share the owner token and the length."""

    resource_key: str | None = None
    lock_owner: str = ""
    lock_ttl_s: float = 30.0
    operation_key: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Begun:
    """The result of :meth:`OperationPort.begin`: ``busy`` says why the job must wait."""

    grant: LockGrant | None = None
    operation: Operation | None = None
    busy: BusyReason | None = None
    slot: LockGrant | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A delivery fetched together with its begin: what it asked for and what it got.

    ``granted_at`` is the fetching process's monotonic clock just before the store's clock was
    read for the lease's start: the worker counts the lease from there (never later than the
    store does), not from when the fetch returned.
    """

    delivery: Delivery
    request: BeginRequest | None = None
    begun: Begun | None = None
    granted_at: float | None = None


@dataclass(frozen=True, slots=True)
class HostAdmission:
    """What :meth:`QueuePort.admit_host_delivery` did with one delivery of a host queue.

    ``prepared`` is set when the shadow job was leased to it (``admit`` INSERT or LEASE),
    begun as a fetch begins (lock and operation claim); ``wait_s`` says how long until the
    host should deliver again (HELD, EARLY).
    """

    admit: Admit
    job_id: int | None = None
    prepared: Prepared | None = None
    wait_s: float = 0.0


def begin_request(
    delivery: Delivery, rule: DeliveryRules | None, worker_id: str, lock_owner: str | None = None
) -> BeginRequest | None:
    """What a fetched delivery must hold before its handler: its lock and its concurrency slot
    (an owner token of its own, the rule's length) and its operation claim. ``None`` for a job
    that asks for none of them, and for one of a task the worker does not know (the pipeline
    buries it). The slot's limit is the one stored with the job. ``lock_owner``: the token, when
    the store made it (a fetch that begins in the lease's own statement)."""
    keys = (delivery.resource_key, delivery.operation_key, delivery.concurrency_key)
    if rule is None or all(key is None for key in keys):
        return None
    limited = delivery.concurrency_key is not None and delivery.concurrency_limit is not None
    return BeginRequest(
        resource_key=delivery.resource_key,
        lock_owner=lock_owner or f"{worker_id}/{secrets.token_hex(8)}",
        lock_ttl_s=rule.lock_ttl_s,  # the worker's definition, not the enqueuer's copy
        operation_key=delivery.operation_key,
        concurrency_key=delivery.concurrency_key if limited else None,
        concurrency_limit=delivery.concurrency_limit if limited else None,
    )


class QueuePort(Protocol):
    """Jobs, leases and the dead letter queue (G1, G2, G6, G8)."""

    def enqueue(self, spec: JobSpec, *, connection: Any = None) -> Job:
        """:meth:`enqueue_many` for one job."""

    def enqueue_many(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store jobs; for each, or return the live job holding its dedup key (``deduplicated``).

        Atomic: all or none, one transaction, and the dedup check and insert of one key are
        serialised, so concurrent enqueues of one key store one job. With ``connection`` (the
        caller's own open connection to the store's database) the jobs are written in the
        caller's transaction: they exist if and only if it commits.
        """

    def fetch_prepared(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules] | None = None,
    ) -> list[Prepared]:
        """Lease up to ``limit`` ready jobs, earlier queues first, higher priority first, and
        begin each (:meth:`OperationPort.begin`) in the same transaction (one commit before the
        handlers start).

        Atomic per call: each job gets a new lease token, its attempt count is charged and an
        attempt row opened. Jobs whose lease expired are re-leased (their old attempt is closed as
        ``lost``); one whose attempts are spent goes to the dead letter queue instead
        (:attr:`DeadCode.LOST`). ``rules`` (by task name) give the lease length, attempt limit and
        lock length of the worker's own task definitions; jobs of other tasks keep what was
        stored.

        A delivery of a task in ``rules`` that has a resource, concurrency or operation key is
        begun: its lock and its slot (owner token: ``worker_id`` and a random part, length from
        its rule) and its operation claim; ``busy`` results are kept (the lock, every slot or
        the claim belongs to other live deliveries).
        Other deliveries come back with ``request`` and ``begun`` ``None``.
        """

    def admit_host_delivery(
        self, spec: JobSpec, worker_id: str, rules: DeliveryRules, host_delivery: str
    ) -> HostAdmission:
        """Admit one delivery of a host queue's task against its shadow job (``jobguard.hosts``).

        The shadow job is the newest job holding ``spec.dedup_key``. Atomic: one transaction,
        and admissions of one key take turns. As :func:`jobguard.core.hosts.admission` decides:
        a new job is stored from ``spec`` and leased, or the waiting job is leased (an expired
        lease's attempt closed as lost first; a job whose attempts are spent is buried as
        :attr:`DeadCode.LOST` instead), each lease with an attempt row that records
        ``host_delivery`` (the host's own id of the delivery) and begun in the same
        transaction as :meth:`fetch_prepared` begins (``rules`` give the lock's length); or
        nothing is written.
        """

    def reserve_host_job(self, spec: JobSpec, unsent_s: float) -> Job:
        """A deduplicated send of a host queue's task (``jobguard.hosts``): its shadow job.

        Atomic, and taking turns with other sends and admissions of ``spec.dedup_key``. As
        :func:`jobguard.core.hosts.reservation` decides: a job is stored from ``spec`` (not
        ``deduplicated``: send); or the live one is returned ``deduplicated`` (send nothing);
        or the live one has been due for ``unsent_s`` with no delivery taking it, and is
        taken over: its headers become ``spec.headers`` (the new message's id), it is due
        from now, and it is returned not ``deduplicated`` (send again).
        """

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> None:
        """Block until an enqueue may have added work to ``queues``, or ``timeout_s`` passed.

        A wake-up can be spurious and one can be missed: callers poll again after ``timeout_s``.
        """

    def expect_handlers(self, handlers: int) -> None:
        """A worker of this process runs up to ``handlers`` handler threads at once, each of
        which may hold a store connection: keep room for them."""

    def interrupt_wait(self) -> None:
        """End a :meth:`wait_for_jobs` under way in this process now, or the next one if none
        is (a worker stopping need not sleep out its poll interval). Never raises.
        """

    def keep_connection(self) -> AbstractContextManager[None]:
        """While inside, this thread's store calls reuse one connection instead of taking one
        from a shared pool each time: a worker's handler threads, fetch loop and settler run
        inside it. A call made while that connection is in use takes another."""

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        """Extend leases (and their locks and slots) that are still ours; report the ones that
        are not, and the cancels asked of the jobs (:meth:`cancel`).

        Atomic per item; all items in one transaction where the store allows.
        """

    def settle(self, endings: Sequence[Ending]) -> list[JobGuardError | None]:
        """Write how deliveries end (see :class:`Ending`): the job moved, the lock and slot
        released, the operation completed, failed or unclaimed, the attempt closed.

        Atomic per ending: one refused (:class:`~jobguard.exceptions.LeaseLostError` for a stale
        lease, :class:`~jobguard.exceptions.StaleFenceError` for a stale fence, a lost claim), or
        one whose write fails (:class:`~jobguard.exceptions.StoreUnavailableError`), writes
        nothing and its error is returned in its place; the others are written. All in one
        transaction where the store allows, so a worker ends a batch of deliveries for the price
        of one durable commit. Refused endings and ``lost`` ones are never refused.
        """

    def cancel(self, job_id: int, actor: str, reason: str) -> Job | None:
        """Cancel job ``job_id``, audited under ``actor``; the job as it is then.

        Atomic: one transaction. A queued job (ready, or scheduled for later) is buried at
        once (:attr:`DeadCode.CANCELLED`, ``reason``), so it never runs; a running one records
        the request (when, by whom), which :meth:`renew` reports to its worker and which makes
        a later fetch of the job end it without running it. ``None``, writing nothing, if no
        job ``job_id`` is queued or running.
        """

    def get_job(self, job_id: int) -> Job:
        """Return one job; :class:`~jobguard.exceptions.NotFoundError` if there is none."""

    def count_jobs(self) -> dict[JobStatus, int]:
        """How many jobs are in each state."""

    def dead_jobs(self, limit: int = 100) -> list[Job]:
        """Jobs in the dead letter queue, most recently buried first."""

    def replay(self, job_id: int) -> Job:
        """Move a dead job back to the queue, same id, payload and keys, attempts reset.

        Atomic: one transaction; :class:`~jobguard.exceptions.NotFoundError` if it is not dead,
        :class:`~jobguard.exceptions.DuplicateJobError` if another live job holds its dedup key.
        """

    def prune_completed(self, older_than_s: float, batch_size: int = 1000) -> int:
        """Delete completed jobs finished more than ``older_than_s`` ago, with their attempts.

        Jobs whose dedup window is still open are kept; operation records and steps are never
        deleted. Atomic per batch of ``batch_size`` jobs; returns how many were deleted.
        """

    def purge(self, job_id: int | None = None) -> int:
        """Delete one dead job (or all of them) with their attempt rows; return how many."""

    def count_dead(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches."""

    def count_dead_held(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches that a replay in id order would leave
        dead: a live job, or an earlier dead job of the selection, holds their dedup key."""

    def retry_now(self, job_id: int) -> Job | None:
        """Make a queued job whose run time is still ahead due now (store clock), changing
        nothing else; ``None`` (and nothing changed) if it is not such a job."""

    def select_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> list[Job]:
        """The first ``limit`` dead jobs ``selection`` matches with ids above ``after_id``, in id
        order."""

    def replay_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> ReplayBatch:
        """Replay up to ``limit`` matching dead jobs with ids above ``after_id``, in id order.

        One transaction. A job is moved only if it is still dead when its row is written, so two
        operators replaying one selection at once replay each job once; a job whose dedup key a
        live job holds stays dead and is reported in ``held``.
        """

    def purge_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> tuple[int, int]:
        """Delete up to ``limit`` matching dead jobs above ``after_id`` with their attempts.

        One transaction; returns ``(how many were deleted, the last id looked at)``.
        """


class LockPort(Protocol):
    """Resource locks with owner tokens and fencing tokens (G3)."""

    def acquire_lock(
        self, resource: str, owner: str, ttl_s: float, *, attempt_id: int | None = None
    ) -> LockGrant | None:
        """Grant the lock if free or expired, with a fence larger than any before; else ``None``.

        Atomic: one transaction; with ``attempt_id`` the grant is also noted on that attempt row.
        """

    def renew_lock(self, grant: LockGrant, ttl_s: float) -> bool:
        """Extend the lock if ``grant.owner`` still owns it. Atomic: one statement."""

    def release_lock(self, grant: LockGrant) -> bool:
        """Free the lock if ``grant.owner`` still owns it; the fence counter is kept."""

    def lock_fence(self, resource: str) -> int:
        """The last fence issued for ``resource`` (0 if never locked)."""

    def slot_grants(self, key: str) -> list[LockGrant]:
        """Every slot of concurrency key ``key`` ever held, by slot number: its last owner and
        expiry (``""`` and ``0.0`` once released) and its last fence."""


class OperationPort(Protocol):
    """Durable operation records and memoised steps (G4)."""

    def begin(self, guard: Guard, request: BeginRequest) -> Begun:
        """Acquire the resource lock, a concurrency slot and the operation claim together.

        Atomic: one transaction. Either all that is asked for holds, or nothing is kept and
        ``busy`` says why (the lock is held by a live owner, every slot of the key below the
        limit is, or another live delivery claims the operation). A completed
        operation is returned without a claim; otherwise the record is created or claimed and
        returned with its stored steps. Refused for a stale lease, or for a stale fence when the
        guard already carries a lock.
        """

    def put_step(self, guard: Guard, key: str, name: str, result_json: str) -> None:
        """Record a step as done. Atomic; refused for a stale lease, claim or fence."""

    def db_step(
        self,
        guard: Guard,
        key: str,
        name: str,
        fn: Callable[..., T],
        args: Sequence[Any],
        on: StepTransactions | None = None,
    ) -> tuple[bool, Any]:
        """Run ``fn(conn, *args)`` and record the step in the same transaction.

        With ``on``, the transaction is one of ``on`` (a framework's connection to the store's
        database) and ``fn`` gets the framework's handle (see :mod:`jobguard.steptx`).

        Only stores with :attr:`Backend.transactional_steps`. Returns ``(ran, value)``: ``ran``
        is False and ``value`` the stored JSON result when the step was already recorded. If
        ``fn`` raises or the guard is stale, nothing commits; an error of ``fn``'s own SQL
        reaches the caller as :class:`~jobguard.exceptions.StepSQLError`.
        """

    def db_writes(
        self, guard: Guard, key: str, name: str, statements: Sequence[tuple[Any, Any]]
    ) -> bool:
        """Run the user's write ``statements`` (SQL text and parameters) and record the step
        (result ``null``) in one transaction; on PostgreSQL all of it in one round trip.

        Only stores with :attr:`Backend.transactional_steps`. The guard is proven before the
        statements run (a stale delivery's never do) and again with the step record, as for
        :meth:`db_step`. Returns whether they ran: False when the step was recorded already.
        If a statement fails, or the guard is stale, nothing commits; a statement's error
        reaches the caller as :class:`~jobguard.exceptions.StepSQLError`.
        """

    def get_operation(self, key: str) -> Operation | None:
        """Return the operation record and its steps, or ``None``."""


class AttemptPort(Protocol):
    """The attempt log; diagnostics read only this (G10)."""

    def attempts(
        self,
        *,
        job_id: int | None = None,
        operation_key: str | None = None,
        limit: int = 1000,
    ) -> list[Attempt]:
        """Attempts of one job or one operation in order, or the most recent ones."""


class InspectPort(Protocol):
    """Read-mostly views for operators: the dashboard and the metrics exporter.

    Each read is bounded (a limit, or an aggregate over live jobs or recent attempts), so a
    page or a scrape stays fast on a store with millions of finished jobs.
    """

    def queue_stats(self) -> list[QueueStats]:
        """Per queue: ready, scheduled, running and dead jobs, the oldest ready and running.

        Only queues with a live or dead job appear. Reads live jobs (an index) and dead ones.
        """

    def find_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        """Newest jobs first matching every filter given, ``limit`` from ``offset``."""

    def outcome_timeline(self, since: float, bucket_s: float, window: int) -> list[OutcomeCount]:
        """Attempts that ended at or after ``since`` per ``bucket_s`` bucket and outcome.

        Looks only at the ``window`` most recent attempts (by id), so it costs the same on any
        size of attempt log.
        """

    def record_audit(self, actor: str, action: str, target: str, detail: str) -> None:
        """Append an operator action to the audit trail. Atomic: one statement."""

    def audit_trail(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent operator actions, newest first."""

    def pause_queue(self, queue: str, actor: str) -> bool:
        """Stop every worker leasing jobs of ``queue``; audited under ``actor``.

        Jobs already leased finish; enqueues still land. ``False``, writing nothing, if the
        queue was paused already. Once this returns, no job of the queue is leased until
        :meth:`resume_queue`, and the state is the store's (it survives restarts).
        """

    def resume_queue(self, queue: str, actor: str) -> bool:
        """Let workers lease jobs of ``queue`` again, audited; ``False`` if it was not paused."""

    def paused_queues(self) -> list[PausedQueue]:
        """Every paused queue, by name."""


class SchedulePort(Protocol):
    """The cursor of each periodic schedule: which ticks are already decided."""

    def schedule_states(self) -> list[ScheduleState]:
        """Every schedule the store has seen, by name."""

    def advance_schedule(
        self,
        name: str,
        expected: int | None,
        cursor: int,
        ticks: Sequence[tuple[int, JobSpec]],
    ) -> list[Job] | None:
        """Move the schedule's cursor from ``expected`` to ``cursor`` and enqueue its ticks' jobs.

        Atomic: one transaction. The cursor moves only if it still is ``expected`` (``None``: the
        store has no row for ``name`` yet); then each ``(tick, spec)`` is enqueued (deduplicated
        as by :meth:`QueuePort.enqueue`) and the newest tick with its job is recorded. Returns
        ``None``, having written nothing, when another scheduler moved the cursor first.
        """


class Backend(QueuePort, LockPort, OperationPort, AttemptPort, InspectPort, SchedulePort, Protocol):
    """A store that implements every port. ``close()`` releases its connections.

    Attributes:
        url: Where the store lives (passwords masked).
        transactional_steps: Whether ``db_step`` can run user SQL in the step's transaction.
    """

    url: str
    transactional_steps: bool

    def now(self) -> float:
        """The store clock, in seconds since the epoch (leases and locks expire on it)."""

    def check_usable(self) -> None:
        """Raise :class:`~jobguard.exceptions.StoreBrokenError` if the store is no longer usable.

        That is, its SQLite file was deleted or replaced: the connections that had it open still
        answer, from the old file. Cheap enough for every pass of a loop;
        :meth:`QueuePort.wait_for_jobs` checks the same.
        """

    def close(self) -> None:
        """Close connections; the backend may not be used afterwards."""

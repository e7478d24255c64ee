"""Frozen values that cross the boundary between the store, the pipeline and users' code.

Timestamps are seconds since the Unix epoch (UTC) as floats, taken from the store's clock; the
``*_at`` properties named ``..._dt`` give aware ``datetime`` objects for display.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self


class StoredEnum(StrEnum):
    """A value the store records, which a newer jobguard may extend."""

    @classmethod
    def stored(cls, value: str) -> Self:
        """The member stored as ``value``; for text this version does not know (a newer one
        wrote it), a stand-in named ``UNKNOWN`` that carries the text, so that reading such a
        row shows it instead of failing. Equal to its text, and to no member."""
        try:
            return cls(value)
        except ValueError:
            unknown = str.__new__(cls, value)
            unknown._name_ = "UNKNOWN"
            unknown._value_ = value
            return unknown


class JobStatus(StrEnum):
    """Where a job is in its life. ``COMPLETED`` and ``DEAD`` are final until a replay."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"


class OperationStatus(StoredEnum):
    """State of the durable record of one business action (G4.2)."""

    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"


class Outcome(StoredEnum):
    """How one delivery (attempt) ended; recorded in the attempt log (G10.1)."""

    RUNNING = "running"
    COMPLETED = "completed"
    ALREADY_PROCESSED = "already_processed"
    RETRY = "retry"
    DEFERRED = "deferred"
    DEAD = "dead"
    RELEASED = "released"
    LOST = "lost"
    LEASE_REFUSED = "lease_refused"
    FENCE_REFUSED = "fence_refused"
    TIMED_OUT = "timed_out"  # ran past its soft time limit; retried as a transient failure


# Deliveries that did not do their work: the dashboard draws them as failures, traces mark them.
UNSUCCESSFUL_OUTCOMES = frozenset(
    {
        Outcome.RETRY,
        Outcome.TIMED_OUT,
        Outcome.DEAD,
        Outcome.LOST,
        Outcome.LEASE_REFUSED,
        Outcome.FENCE_REFUSED,
    }
)


class DeadCode(StoredEnum):
    """Why a job is in the dead letter queue, as the store records it."""

    FATAL = "fatal"  # the handler raised an error that is never retried
    EXHAUSTED = "exhausted"  # every allowed delivery failed
    POISON = "poison"  # the same error again and again
    UNRUNNABLE = "unrunnable"  # unknown task or a payload the handler cannot take
    LOST = "lost"  # the last allowed delivery never reported back (its worker died)
    WAITED = "waited"  # waited for a busy resource longer than allowed
    CANCELLED = "cancelled"  # an operator cancelled it (app.cancel, jobguard cancel, dashboard)


class BusyReason(StrEnum):
    """Why a delivery could not begin: someone else holds what it needs."""

    LOCK = "lock"  # the resource lock is held by a live owner
    SLOT = "slot"  # every slot of the concurrency key is held by a live owner
    OPERATION = "operation"  # another live delivery claims the operation record


def to_datetime(ts: float | None) -> datetime | None:
    """Convert store seconds to an aware UTC datetime (``None`` stays ``None``, and so does a
    number no date can express: infinite, NaN, past year 9999)."""
    if ts is None:
        return None
    try:
        return datetime.fromtimestamp(ts, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything needed to store a new job; built by the app after validation."""

    task: str
    queue: str
    payload: str
    max_attempts: int
    visibility_timeout_s: float
    priority: int = 0
    delay_s: float = 0.0
    operation_key: str | None = None
    resource_key: str | None = None
    lock_ttl_s: float | None = None
    dedup_key: str | None = None
    dedup_window_s: float = 0.0
    headers: str | None = None
    """Context carried with the job (a JSON object as text), e.g. the enqueuer's trace."""
    soft_time_limit_s: float | None = None
    """Run time after which the handler is told to stop (``None``: no limit)."""
    time_limit_s: float | None = None
    """Run time after which the run is stopped (process mode only; ``None``: no limit)."""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """A stored job as the store sees it now."""

    id: int
    task: str
    queue: str
    payload: str
    status: JobStatus
    priority: int
    attempts: int
    max_attempts: int
    deferrals: int
    run_at: float
    created_at: float
    finished_at: float | None
    visibility_timeout_s: float
    operation_key: str | None
    resource_key: str | None
    lock_ttl_s: float | None
    dedup_key: str | None
    last_error: str | None
    dead_reason: str | None
    dead_code: DeadCode | None = None
    headers: str | None = None
    soft_time_limit_s: float | None = None
    time_limit_s: float | None = None
    cancel_requested_at: float | None = None
    """When a cancel was asked of this job while it ran (``None``: never)."""
    cancel_requested_by: str | None = None
    """Who asked for that cancel."""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    deduplicated: bool = False
    """True when enqueue returned an existing job instead of storing a new one (G6.1)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One lease on one job, handed to exactly one worker (G2.1)."""

    job_id: int
    task: str
    queue: str
    payload: str
    attempt: int
    max_attempts: int
    deferrals: int
    created_at: float
    lease_token: str
    attempt_id: int
    lease_expires_at: float
    visibility_timeout_s: float
    operation_key: str | None
    resource_key: str | None
    lock_ttl_s: float | None
    error_signature: str | None
    same_error_count: int
    headers: str | None = None
    soft_time_limit_s: float | None = None
    time_limit_s: float | None = None
    cancel_requested_by: str | None = None
    """Set when a cancel was asked before this lease began: the job is not run."""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    unrunnable: str | None = None
    """Why the stored row cannot run as it is (a number this version never writes): the
    pipeline buries the job, saying so."""


@dataclass(frozen=True, slots=True)
class LockGrant:
    """Ownership of a resource lock: the owner token and its fencing token (G3.2, G3.5).

    A concurrency slot is granted the same way: ``resource`` is the concurrency key and
    ``slot`` the number of the slot held (0 to the limit minus one), whose own fence it carries.
    """

    resource: str
    owner: str
    fence: int
    expires_at: float
    slot: int | None = None


@dataclass(frozen=True, slots=True)
class Guard:
    """What a write must prove: the delivery's lease and, if any, the fences of its lock grant
    and of its concurrency slot."""

    job_id: int
    lease_token: str
    attempt_id: int
    lock: LockGrant | None = None
    slot: LockGrant | None = None


@dataclass(frozen=True, slots=True)
class Operation:
    """The durable record of one business action, unique on its key (G4.2)."""

    key: str
    status: OperationStatus
    resource_key: str | None
    result: Any
    external_ref: str | None
    attempts: int
    fence: int | None
    created_at: float
    updated_at: float
    completed_at: float | None
    last_error: str | None
    steps: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One delivery of one job with the metadata of G10.1."""

    id: int
    job_id: int
    attempt: int
    task: str
    queue: str
    operation_key: str | None
    worker_id: str
    lease_token: str
    lock_owner: str | None
    fence: int | None
    started_at: float
    ended_at: float | None
    duration_s: float | None
    outcome: Outcome
    error_type: str | None
    error_message: str | None
    traceback: str | None
    steps_run: int
    steps_skipped: int
    host_delivery: str | None = None
    """The host queue's own id of the delivery (Celery task id, RQ job id, Dramatiq message
    id) when a host queue's task is guarded (:mod:`jobguard.hosts`); ``None`` otherwise."""

    @property
    def never_reported(self) -> bool:
        """Closed as lost when its lease was taken over: its worker died or froze and never
        said how long it ran or which steps it skipped (``steps_run`` counts the steps it
        recorded)."""
        return self.outcome == Outcome.LOST and self.duration_s is None


@dataclass(frozen=True, slots=True)
class DeadJob:
    """A job in the dead letter queue, with every attempt's metadata (G8.1)."""

    job: Job
    reason: str
    attempts: list[Attempt]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue as the store sees it now (the dashboard's overview, the exporter's gauges).

    Attributes:
        queue: The queue name.
        ready: Queued jobs whose time has come.
        scheduled: Queued jobs waiting for their time (a delay, a retry's backoff, a deferral).
        running: Jobs under a lease (including leases expired and not yet taken over).
        dead: Jobs in the dead letter queue.
        oldest_ready_at: When the oldest ready job became due (``None``: none ready).
        oldest_running_since: When the oldest running delivery started (``None``: none).
        shortest_lease_s: The shortest visibility timeout among running jobs (``None``: none).
        paused: Whether the queue is paused (workers take none of its jobs).
    """

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    oldest_ready_at: float | None = None
    oldest_running_since: float | None = None
    shortest_lease_s: float | None = None
    paused: bool = False


@dataclass(frozen=True, slots=True)
class OutcomeCount:
    """How many attempts ended with ``outcome`` in the time bucket starting at ``start``."""

    start: float
    outcome: Outcome
    count: int


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action on the store (a replay or a purge): who, when, what."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """A paused queue: no worker leases its jobs until it is resumed.

    Attributes:
        queue: The queue name.
        paused_at: Store time after which no job of the queue was leased (the pause had been
            committed by then).
        paused_by: Who paused it (the audit trail's actor).
    """

    queue: str
    paused_at: float
    paused_by: str


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What the store keeps per schedule, so no scheduler needs a memory of its own.

    Ticks are whole seconds since the epoch (UTC).
    """

    name: str
    cursor: int
    """The newest tick decided: enqueued, or passed over by the missed-tick policy."""
    last_tick: int | None
    """The newest tick that was enqueued (``None`` before the first)."""
    last_job_id: int | None
    """The job of ``last_tick``."""
    updated_at: float

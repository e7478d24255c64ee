"""What a delivery of a host queue (Celery, RQ, Dramatiq) finds in the store, and what follows;
and what a deduplicated send finds there.

A guarded host task keeps one job row in jobguard's store per operation (its shadow job, found
by a key made of the task and the operation key). Every delivery the host makes of that task is
admitted against the row before the pipeline runs it: it takes the row's lease, or it is handed
back to the host because a live delivery holds the lease, or it acks because the job is dead.
A send with a dedup key sends nothing while the operation's job is live, unless that job has
been due for ``unsent_s`` with no delivery taking it (its producer died before sending, or the
host lost the message): then the send takes the job over and sends again.
Pure: the store reads the row and carries the decision out in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from jobguard.models import JobStatus

# A delivery arriving this little before the row's time runs now: hosts deliver late, not early,
# and a retry's own message should not be handed back for a few milliseconds.
EARLY_SLACK_S = 0.5


class Admit(StrEnum):
    """What one host delivery does with its shadow job."""

    INSERT = "insert"  # no row, or only a completed one: a new row, leased to this delivery
    LEASE = "lease"  # the row waits (queued, or its lease expired): lease it to this delivery
    HELD = "held"  # a live delivery holds the lease: hand this one back, run nothing
    EARLY = "early"  # the row is due later (a retry's backoff, a deferral): hand back till then
    DEAD = "dead"  # the job is in the dead letter queue: ack, run nothing (replay resends it)


@dataclass(frozen=True, slots=True)
class Found:
    """The facts of the newest shadow job of one operation, as the store read them."""

    status: JobStatus
    available_at: float | None  # queued: due time; running: lease expiry


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision, with how long to wait before the host delivers again (HELD, EARLY)."""

    admit: Admit
    wait_s: float = 0.0


def admission(found: Found | None, now: float) -> Admission:
    """Decide what a host delivery does, from the newest shadow job of its operation."""
    if found is None or found.status == JobStatus.COMPLETED:
        # A late duplicate of completed work gets a row of its own: the pipeline then acks it
        # as already processed from the operation record, and the attempt log shows it.
        return Admission(Admit.INSERT)
    if found.status == JobStatus.DEAD:
        return Admission(Admit.DEAD)
    due = found.available_at if found.available_at is not None else now
    if found.status == JobStatus.RUNNING:
        if due > now:
            return Admission(Admit.HELD, due - now)
        return Admission(Admit.LEASE)
    if due > now + EARLY_SLACK_S:
        return Admission(Admit.EARLY, due - now)
    return Admission(Admit.LEASE)


class Reserve(StrEnum):
    """What one deduplicated send of a host task does with its operation's shadow job."""

    INSERT = "insert"  # nothing live holds the key: a new queued job, and send
    HELD = "held"  # a live job holds the key, due or delivered lately: send nothing
    RETAKE = "retake"  # a live job nobody delivered for unsent_s: make it this send's, and send


def reservation(found: Found | None, now: float, unsent_s: float) -> Reserve:
    """Decide what a deduplicated send does, from the newest shadow job of its operation.

    A live job is due from ``available_at`` on (queued: its run time; running: its lease's
    expiry, which the running delivery's heartbeat keeps ahead of now). A host delivers a due
    job's message soon after, and a hand-back comes again within its delay; a job left due for
    ``unsent_s`` has no message anywhere that will: the key frees itself.
    """
    if found is None or found.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
        return Reserve.INSERT
    due = found.available_at if found.available_at is not None else now
    if due + unsent_s <= now:
        return Reserve.RETAKE
    return Reserve.HELD


# A shadow job's headers name its host and the host's own limit on a delivery's duration
# (Celery's visibility timeout, RQ's job timeout, Dramatiq's time limit), so the doctor judges
# a guarded task's durations against the limit that makes its host deliver it again.
HOST_HEADER = "jobguard.host"
HOST_TIMEOUT_HEADER = "jobguard.host_timeout_s"
HOST_LIMITS = {
    "celery": (
        "broker_transport_options['visibility_timeout']",
        "Celery delivers the task again while it still runs (the guard hands each copy back, "
        "so it never runs twice, but the copies keep coming)",
    ),
    "rq": (
        "job_timeout",
        "RQ kills the work-horse at its job timeout: the run is cut off and retried from its "
        "last completed step",
    ),
    "dramatiq": (
        "time_limit",
        "Dramatiq's TimeLimit interrupts the run: it is retried from its last completed step",
    ),
}


@dataclass(frozen=True, slots=True)
class HostLimit:
    """A host's limit on one delivery's duration, as a shadow job's headers record it."""

    host: str
    timeout_s: float
    setting: str  # the host's own name for it
    consequence: str  # what the host does to a run that outlasts it


def host_limit(headers: Mapping[str, object]) -> HostLimit | None:
    """The host limit recorded in a job's headers; ``None`` for a job of jobguard's own, a host
    that reports none, or headers that do not hold a usable one."""
    host = headers.get(HOST_HEADER)
    timeout = headers.get(HOST_TIMEOUT_HEADER)
    if not isinstance(host, str) or host not in HOST_LIMITS:
        return None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        return None
    setting, consequence = HOST_LIMITS[host]
    return HostLimit(host, float(timeout), setting, consequence)

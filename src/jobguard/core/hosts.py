"""What a delivery of a host queue (Celery, RQ, Dramatiq) finds in the store, and what follows.

A guarded host task keeps one job row in jobguard's store per operation (its shadow job, found
by a key made of the task and the operation key). Every delivery the host makes of that task is
admitted against the row before the pipeline runs it: it takes the row's lease, or it is handed
back to the host because a live delivery holds the lease, or it acks because the job is dead.
Pure: the store reads the row and carries the decision out in the same transaction.
"""

from __future__ import annotations

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

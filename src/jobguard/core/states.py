"""Job state machine: which transitions exist and which event causes each.

The stores enforce these in their write statements (``WHERE status = ...``); this table is the
single written statement of the rules and is what the property tests check the stores against.
"""

from __future__ import annotations

from enum import StrEnum

from jobguard.models import JobStatus


class Event(StrEnum):
    """Things that move a job between states."""

    FETCH = "fetch"  # a worker takes a lease (also re-takes an expired one)
    FINISH = "finish"  # the final state is stored and the job completed
    RETRY = "retry"  # scheduled again after a failure, attempt charged
    DEFER = "defer"  # resource busy: scheduled again, attempt not charged
    RELEASE = "release"  # graceful shutdown: handed back, attempt not charged
    BURY = "bury"  # to the dead letter queue
    REPLAY = "replay"  # from the dead letter queue back to the queue
    RETRY_NOW = "retry_now"  # an operator makes a job waiting for its run time due now


TRANSITIONS: dict[tuple[JobStatus, Event], JobStatus] = {
    (JobStatus.QUEUED, Event.FETCH): JobStatus.RUNNING,
    (JobStatus.RUNNING, Event.FETCH): JobStatus.RUNNING,  # only once the lease has expired
    (JobStatus.RUNNING, Event.FINISH): JobStatus.COMPLETED,
    (JobStatus.RUNNING, Event.RETRY): JobStatus.QUEUED,
    (JobStatus.RUNNING, Event.DEFER): JobStatus.QUEUED,
    (JobStatus.RUNNING, Event.RELEASE): JobStatus.QUEUED,
    (JobStatus.RUNNING, Event.BURY): JobStatus.DEAD,  # also: lease expired, attempts spent
    (JobStatus.DEAD, Event.REPLAY): JobStatus.QUEUED,
    (JobStatus.QUEUED, Event.RETRY_NOW): JobStatus.QUEUED,  # only while its run time is ahead
}


class InvalidTransition(ValueError):
    """The event is not allowed in the job's current state."""


def next_status(current: JobStatus, event: Event) -> JobStatus:
    """Return the state after ``event``; raise :class:`InvalidTransition` if it is not allowed."""
    try:
        return TRANSITIONS[(current, event)]
    except KeyError:
        raise InvalidTransition(f"{event} is not allowed from {current}") from None


def is_final(status: JobStatus) -> bool:
    """Completed and dead jobs are not delivered again (until a replay)."""
    return status in (JobStatus.COMPLETED, JobStatus.DEAD)

"""What the attempt log says of a repeated failure, for the poison rule of ``core/retry.py``.

Read only when a job may be poison (the same undeclared error ``poison_threshold`` times in a
row): when its streak of that error began, and how many other jobs of its task failed with the
same error since then. Two bounded reads through the attempt port; the decision stays pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jobguard.backends.base import AttemptPort
from jobguard.core.retry import FailureHistory, RetryPolicy, needs_history
from jobguard.core.text import storable
from jobguard.exceptions import JobGuardError
from jobguard.models import Attempt, Delivery, Outcome

# How many of the most recent attempts (of every task) are searched for peers failing alike.
PEER_WINDOW = 1000
_FAILED = frozenset({Outcome.RETRY, Outcome.DEAD, Outcome.TIMED_OUT})


def streak_start(own: Sequence[Attempt], error_type: str, same: int, now: float) -> float:
    """When the streak of ``same`` failures with ``error_type`` (the running one included)
    began: the start of its first attempt. Attempts that did not fail (lost with their worker,
    deferred for a lock) neither count nor break it."""
    started = now
    counted = 1
    for attempt in reversed(own):
        if attempt.outcome is Outcome.RUNNING:
            started = min(started, attempt.started_at)
            continue
        if attempt.outcome not in _FAILED:
            continue
        if attempt.error_type != error_type or counted >= same:
            break
        started = attempt.started_at
        counted += 1
    return started


def peers_failing(
    recent: Sequence[Attempt], delivery: Delivery, error_type: str, since: float
) -> int:
    """Other jobs of the delivery's task whose attempts failed with ``error_type`` since
    ``since``."""
    return len(
        {
            attempt.job_id
            for attempt in recent
            if attempt.task == delivery.task
            and attempt.job_id != delivery.job_id
            and attempt.outcome in _FAILED
            and attempt.error_type == error_type
            and (attempt.ended_at if attempt.ended_at is not None else attempt.started_at) >= since
        }
    )


def failure_history(
    store: AttemptPort, delivery: Delivery, error_type: str, same: int, now: float
) -> FailureHistory:
    """The streak's span and its peers, from the attempt log (``now`` on the store clock)."""
    began = streak_start(store.attempts(job_id=delivery.job_id), error_type, same, now)
    peers = peers_failing(store.attempts(limit=PEER_WINDOW), delivery, error_type, began)
    return FailureHistory(streak_span_s=max(0.0, now - began), peers_failing=peers)


def history_for(
    store: AttemptPort,
    delivery: Delivery,
    exc: BaseException,
    policy: RetryPolicy,
    same: int,
    now: Callable[[], float],
) -> FailureHistory | None:
    """The history :func:`~jobguard.core.retry.decide` needs for this failure, if any
    (``now`` is the store clock, read only then).

    A read that fails (the store is failing too) never buries: the streak is then taken as
    too short to judge, and the job is retried.
    """
    if not needs_history(exc, attempt=delivery.attempt, policy=policy, same=same):
        return None
    try:
        return failure_history(store, delivery, storable(type(exc).__name__), same, now())
    except JobGuardError:
        return FailureHistory(streak_span_s=0.0, peers_failing=0)

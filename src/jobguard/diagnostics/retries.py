"""R8.4, first half: how often each task's handler fails and is retried, and whether that rose.

A *run* is a delivery whose handler ran to a verdict: ``completed``, ``retry`` or ``dead``.
The retry rate is retries over runs, over the whole window and over the task's most recent runs;
a recent rate at or above :data:`SPIKE_RATE` (with enough runs to mean something) is a spike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from jobguard.models import Attempt, Outcome

RUNS = frozenset({Outcome.COMPLETED, Outcome.RETRY, Outcome.DEAD})
RECENT_RUNS = 20
SPIKE_RATE = 0.25
MIN_RUNS = 5


@dataclass(frozen=True, slots=True)
class TaskRetries:
    """Retry counts and rates of one task."""

    task: str
    runs: int
    retries: int
    dead: int
    retry_rate: float
    recent_runs: int
    """How many of the latest runs the recent rate is over (at most :data:`RECENT_RUNS`)."""
    recent_retry_rate: float
    spike: bool


def _rate(outcomes: list[Outcome]) -> float:
    return sum(o == Outcome.RETRY for o in outcomes) / len(outcomes) if outcomes else 0.0


def retry_rates(
    attempts: Iterable[Attempt],
    *,
    recent_runs: int = RECENT_RUNS,
    spike_rate: float = SPIKE_RATE,
    min_runs: int = MIN_RUNS,
) -> list[TaskRetries]:
    """Retry rates of every task with at least one run, by name.

    Args:
        attempts: The attempt log.
        recent_runs: How many of a task's latest runs make up its recent rate.
        spike_rate: A recent retry rate at or above this is a spike...
        min_runs: ...when the recent rate is over at least this many runs.
    """
    outcomes: dict[str, list[Outcome]] = defaultdict(list)
    for attempt in sorted(attempts, key=lambda a: (a.started_at, a.id)):
        if attempt.outcome in RUNS:
            outcomes[attempt.task].append(attempt.outcome)
    found: list[TaskRetries] = []
    for task in sorted(outcomes):
        runs = outcomes[task]
        recent = runs[-recent_runs:]
        recent_rate = _rate(recent)
        found.append(
            TaskRetries(
                task=task,
                runs=len(runs),
                retries=runs.count(Outcome.RETRY),
                dead=runs.count(Outcome.DEAD),
                retry_rate=_rate(runs),
                recent_runs=len(recent),
                recent_retry_rate=recent_rate,
                spike=len(recent) >= min_runs and recent_rate >= spike_rate,
            )
        )
    return found

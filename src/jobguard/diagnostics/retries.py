"""G10.4, first half: how often each task's handler fails, and whether that rose.

A *run* is a delivery whose handler ran to a verdict: ``completed``, ``retry`` or ``dead``; a
*failure* is a run that did not complete, retried or buried alike (a job buried at its first
failure failed as much as one that will be retried). The retry rate is retries over runs; the
failure rate, over the whole window and over the task's most recent runs, decides: a recent
failure rate at or above :data:`SPIKE_RATE` (with enough runs to mean something) is a spike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from jobguard.diagnostics.findings import Finding, Kind, Severity
from jobguard.models import Attempt, Outcome

RUNS = frozenset({Outcome.COMPLETED, Outcome.RETRY, Outcome.DEAD})
RECENT_RUNS = 20
SPIKE_RATE = 0.25
MIN_RUNS = 5


@dataclass(frozen=True, slots=True)
class TaskRetries:
    """Retry and failure counts and rates of one task."""

    task: str
    runs: int
    retries: int
    dead: int
    retry_rate: float
    failure_rate: float
    """Retries and burials over runs."""
    recent_runs: int
    """How many of the latest runs the recent rates are over (at most :data:`RECENT_RUNS`)."""
    recent_retries: int
    recent_dead: int
    recent_retry_rate: float
    """Retries over the recent runs."""
    recent_failure_rate: float
    spike: bool


def _failure_rate(outcomes: list[Outcome]) -> float:
    return sum(o != Outcome.COMPLETED for o in outcomes) / len(outcomes) if outcomes else 0.0


def retry_rates(
    attempts: Iterable[Attempt],
    *,
    recent_runs: int = RECENT_RUNS,
    spike_rate: float = SPIKE_RATE,
    min_runs: int = MIN_RUNS,
) -> list[TaskRetries]:
    """Retry and failure rates of every task with at least one run, by name.

    Args:
        attempts: The attempt log.
        recent_runs: How many of a task's latest runs make up its recent rate.
        spike_rate: A recent failure rate at or above this is a spike...
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
        recent_rate = _failure_rate(recent)
        found.append(
            TaskRetries(
                task=task,
                runs=len(runs),
                retries=runs.count(Outcome.RETRY),
                dead=runs.count(Outcome.DEAD),
                retry_rate=runs.count(Outcome.RETRY) / len(runs),
                failure_rate=_failure_rate(runs),
                recent_runs=len(recent),
                recent_retries=recent.count(Outcome.RETRY),
                recent_dead=recent.count(Outcome.DEAD),
                recent_retry_rate=recent.count(Outcome.RETRY) / len(recent),
                recent_failure_rate=recent_rate,
                spike=len(recent) >= min_runs and recent_rate >= spike_rate,
            )
        )
    return found


def spike_findings(retries: Iterable[TaskRetries]) -> list[Finding]:
    """A warning per task whose recent runs failed at a spike rate."""
    return [
        Finding(
            kind=Kind.RETRY_SPIKE,
            severity=Severity.WARNING,
            task=r.task,
            summary=(
                f"task {r.task}: retry spike, {r.recent_failure_rate:.0%} of the last "
                f"{r.recent_runs} runs failed ({r.recent_retries} retried, {r.recent_dead} "
                "buried)"
            ),
            advice="see the repeating errors for what they have in common",
            numbers={
                "recent_runs": r.recent_runs,
                "recent_retries": r.recent_retries,
                "recent_dead": r.recent_dead,
                "recent_failure_rate": round(r.recent_failure_rate, 4),
                "runs": r.runs,
            },
        )
        for r in retries
        if r.spike
    ]

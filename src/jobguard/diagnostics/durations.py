"""R8.3: how long each task's handler runs, against its visibility timeout and lock TTL.

Only deliveries that ran the handler and reported how long it took count: ``completed``,
``retry``, ``dead``, and the stale deliveries that ran on after losing their lease or lock
(``lease_refused``, ``fence_refused``), which are often the slowest runs of all. The timeouts
are read from the task's jobs (a job stores the lease length and lock TTL it was given), so the
comparison needs no application code.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from jobguard.models import Attempt, Job, Outcome

RAN_HANDLER = frozenset(
    {
        Outcome.COMPLETED,
        Outcome.RETRY,
        Outcome.DEAD,
        Outcome.LEASE_REFUSED,
        Outcome.FENCE_REFUSED,
    }
)
# A timeout should be at least twice the p99 duration (docs/operations.md, "Sizing the
# visibility timeout"), so a job whose renewals fail for a while usually still finishes in time.
HEADROOM = 2.0
# A task whose slowest runs take this many times its median is a candidate for its own queue,
# once it has enough runs for the median to mean something.
LONG_TAIL_RATIO = 5.0
LONG_TAIL_MIN_RUNS = 10


class Severity(StrEnum):
    """How urgent a piece of advice is; ``problem`` makes ``jobguard doctor`` exit 1."""

    PROBLEM = "problem"
    WARNING = "warning"
    HINT = "hint"


@dataclass(frozen=True, slots=True)
class Advice:
    """One recommendation about a task's timeouts."""

    severity: Severity
    setting: str
    """``visibility_timeout_s``, ``lock_ttl_s`` or ``queue``."""
    message: str
    recommended_s: float | None = None


@dataclass(frozen=True, slots=True)
class TaskDurations:
    """The duration distribution of one task and what it says about its timeouts."""

    task: str
    runs: int
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float
    visibility_timeout_s: float | None
    """The shortest lease among the task's jobs (``None``: no job row left to read it from)."""
    lock_ttl_s: float | None
    """The shortest lock TTL among its jobs with a resource lock (``None``: no lock)."""
    advice: tuple[Advice, ...]


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of values sorted ascending (``pct`` in 0..100)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def recommended_s(p99_s: float, max_s: float) -> float:
    """The smallest whole number of seconds above both ``HEADROOM x p99`` and the longest run."""
    return float(math.floor(max(HEADROOM * p99_s, max_s)) + 1)


def _timeout_advice(setting: str, timeout_s: float, stats: TaskDurations) -> Advice | None:
    target = recommended_s(stats.p99_s, stats.max_s)
    if timeout_s < stats.max_s:
        return Advice(
            Severity.PROBLEM,
            setting,
            f"{setting}={timeout_s:g} is below the longest run ({stats.max_s:.2f} s), so "
            "those runs live on heartbeat renewals alone: one missed renewal hands the job to "
            f"a second worker while the first still runs; raise {setting} to at least "
            f"{target:g}, or move the slow jobs to their own queue",
            target,
        )
    if timeout_s < HEADROOM * stats.p99_s:
        return Advice(
            Severity.WARNING,
            setting,
            f"{setting}={timeout_s:g} is less than {HEADROOM:g}x the p99 duration "
            f"({stats.p99_s:.2f} s); raise {setting} to at least {target:g}",
            target,
        )
    return None


def advise(stats: TaskDurations) -> tuple[Advice, ...]:
    """Advice for one task's timeouts from its distribution (the ``advice`` field is ignored)."""
    found: list[Advice] = []
    for setting, timeout_s in (
        ("visibility_timeout_s", stats.visibility_timeout_s),
        ("lock_ttl_s", stats.lock_ttl_s),
    ):
        if timeout_s is not None:
            advice = _timeout_advice(setting, timeout_s, stats)
            if advice is not None:
                found.append(advice)
    long_tail = stats.max_s >= LONG_TAIL_RATIO * stats.p50_s
    if found and long_tail and stats.runs >= LONG_TAIL_MIN_RUNS:
        target = recommended_s(stats.p99_s, stats.max_s)
        found.append(
            Advice(
                Severity.HINT,
                "queue",
                f"the slowest runs take {stats.max_s / max(stats.p50_s, 1e-9):.0f}x the median: "
                "move slow jobs to their own queue with a longer timeout, e.g. "
                f"App(queue_visibility_timeouts_s={{'slow': {target:g}}}) (R2.3)",
                target,
            )
        )
    return tuple(found)


def _smallest(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def task_durations(attempts: Iterable[Attempt], jobs: Mapping[int, Job]) -> list[TaskDurations]:
    """The distribution and advice of every task with at least one measured run, by name.

    Args:
        attempts: The attempt log.
        jobs: Jobs by id, where each task's visibility timeout and lock TTL are read.
    """
    durations: dict[str, list[float]] = defaultdict(list)
    job_ids: dict[str, set[int]] = defaultdict(set)
    for attempt in attempts:
        if attempt.outcome in RAN_HANDLER and attempt.duration_s is not None:
            durations[attempt.task].append(attempt.duration_s)
            job_ids[attempt.task].add(attempt.job_id)
    found: list[TaskDurations] = []
    for task in sorted(durations):
        values = sorted(durations[task])
        task_jobs = [jobs[job_id] for job_id in job_ids[task] if job_id in jobs]
        stats = TaskDurations(
            task=task,
            runs=len(values),
            p50_s=percentile(values, 50),
            p95_s=percentile(values, 95),
            p99_s=percentile(values, 99),
            max_s=values[-1],
            visibility_timeout_s=_smallest(job.visibility_timeout_s for job in task_jobs),
            lock_ttl_s=_smallest(job.lock_ttl_s for job in task_jobs),
            advice=(),
        )
        found.append(replace(stats, advice=advise(stats)))
    return found

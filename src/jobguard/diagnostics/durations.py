"""G10.3: how long each task's handler runs, against its visibility timeout and lock TTL.

Only deliveries that ran the handler and reported how long it took count: ``completed``,
``retry``, ``dead``, and the stale deliveries that ran on after losing their lease or lock
(``lease_refused``, ``fence_refused``), which are often the slowest runs of all. The timeouts
are read from the task's jobs (a job stores the lease length and lock TTL it was given), so the
comparison needs no application code.

A timeout below the longest run is not wrong in itself: the heartbeat renews leases and locks
about every third of the shortest timeout in flight, and ``docs/operations.md`` recommends a
short timeout for a long task on its own queue. It is a problem only with evidence that it
failed: a delivery of the task refused for a stale lease (``lease_refused``, for the visibility
timeout), or a refused delivery that held a resource lock (``fence_refused``, or
``lease_refused`` with a fence, for the lock TTL). Without such evidence the same finding is a
hint. A delivery refused because its whole worker process stood still (:mod:`.stalls`) is
neither: it is left out, and reported as a stall.

A guarded task of a host queue (``jobguard.hosts``) is judged against its host's own limit
where the host reports one (Celery's visibility timeout, RQ's job timeout, Dramatiq's time
limit, recorded on its jobs), not against the lease of its shadow job, which the heartbeat
renews: a run that outlasts the host's limit is delivered again or cut off by the host, which
is the evidence.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from jobguard.core.hosts import HostLimit, host_limit
from jobguard.diagnostics.findings import Finding, Kind, Severity
from jobguard.diagnostics.stalls import stalled_s
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
REFUSED = frozenset({Outcome.LEASE_REFUSED, Outcome.FENCE_REFUSED})
# A timeout should be at least twice the p99 duration (docs/operations.md, "Sizing the
# visibility timeout"), so a job whose renewals fail for a while usually still finishes in time.
HEADROOM = 2.0
# A task whose slowest runs take this many times its median is a candidate for its own queue,
# once it has enough runs for the median to mean something.
LONG_TAIL_RATIO = 5.0
LONG_TAIL_MIN_RUNS = 10
# The heartbeat renews every third of the shortest timeout (jobguard.heartbeat), so this many
# renewals in a row can be missed before a lease or lock expires.
MISSABLE_RENEWALS = 2


@dataclass(frozen=True, slots=True)
class Advice:
    """One recommendation about a task's timeouts."""

    severity: Severity
    setting: str
    """``visibility_timeout_s``, ``lock_ttl_s``, ``host_timeout`` (a host queue's own limit)
    or ``queue``."""
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
    lease_refused: int
    """Deliveries of the task refused for a stale lease: evidence the lease was too short."""
    lock_lost: int
    """Refused deliveries of the task that held a resource lock: evidence the lock TTL was too
    short."""
    advice: tuple[Advice, ...]
    host_limit: HostLimit | None = None
    """A host queue's limit on one delivery (the shortest among the task's jobs), which the
    task is judged against instead of ``visibility_timeout_s``; ``None`` for other tasks."""
    host_outlasted: int = 0
    """Runs longer than ``host_limit``: each was delivered again or cut off by its host."""


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of values sorted ascending (``pct`` in 0..100)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def recommended_s(p99_s: float, max_s: float) -> float:
    """The smallest whole number of seconds above both ``HEADROOM x p99`` and the longest run."""
    return float(math.floor(max(HEADROOM * p99_s, max_s)) + 1)


def _consequence(setting: str, timeout_s: float) -> str:
    beat_s = timeout_s / (MISSABLE_RENEWALS + 1)
    what = (
        "the lock, not the job, passes to another worker, whose delivery gets a newer fence: "
        "this one runs on, its db_step writes are refused, and effects outside db_step run "
        "twice"
        if setting == "lock_ttl_s"
        else "the job is delivered to a second worker while the first still runs"
    )
    return (
        f"the heartbeat renews it every {beat_s:.2f} s, so {MISSABLE_RENEWALS} missed renewals "
        f"in a row (a stall, a store hiccup) let it expire: {what}"
    )


def _remedy(setting: str, refused: int, target: float) -> str:
    """What to do: raise it when it failed; when it did not, say why it may stay."""
    if refused:
        noun = "delivery was" if refused == 1 else "deliveries were"
        return f"{refused} {noun} refused after it expired; raise {setting} to at least {target:g}"
    return (
        "no delivery lost it, so the heartbeat kept up: fine as it is (a short timeout recovers "
        f"a crashed worker's job sooner); to ride out longer stalls, raise {setting} to at "
        f"least {target:g}"
    )


def _timeout_advice(
    setting: str, timeout_s: float, stats: TaskDurations, refused: int
) -> Advice | None:
    target = recommended_s(stats.p99_s, stats.max_s)
    if timeout_s < stats.max_s:
        own_queue = ", or move the slow jobs to their own queue" if refused else ""
        return Advice(
            Severity.PROBLEM if refused else Severity.HINT,
            setting,
            f"{setting}={timeout_s:g} is below the longest run ({stats.max_s:.2f} s), so those "
            f"runs lived on heartbeat renewals alone: {_consequence(setting, timeout_s)}; "
            f"{_remedy(setting, refused, target)}{own_queue}",
            target,
        )
    if timeout_s < HEADROOM * stats.p99_s:
        return Advice(
            Severity.WARNING if refused else Severity.HINT,
            setting,
            f"{setting}={timeout_s:g} is less than {HEADROOM:g}x the p99 duration "
            f"({stats.p99_s:.2f} s); {_remedy(setting, refused, target)}",
            target,
        )
    return None


def _host_advice(stats: TaskDurations, limit: HostLimit) -> Advice | None:
    """A host's limit judged against the durations: every run that outlasted it is evidence
    (the host delivered it again, or cut it off)."""
    target = recommended_s(stats.p99_s, stats.max_s)
    name = f"{limit.host}'s {limit.setting}={limit.timeout_s:g}"
    if limit.timeout_s < stats.max_s:
        runs = "1 run" if stats.host_outlasted == 1 else f"{stats.host_outlasted} runs"
        return Advice(
            Severity.PROBLEM,
            "host_timeout",
            f"{name} is below the longest run ({stats.max_s:.2f} s): {runs} outlasted it, and "
            f"{limit.consequence}; raise {limit.setting} to at least {target:g}",
            target,
        )
    if limit.timeout_s < HEADROOM * stats.p99_s:
        return Advice(
            Severity.WARNING,
            "host_timeout",
            f"{name} is less than {HEADROOM:g}x the p99 duration ({stats.p99_s:.2f} s): a run "
            f"a little slower than usual outlasts it, and {limit.consequence}; raise "
            f"{limit.setting} to at least {target:g}",
            target,
        )
    return None


def advise(stats: TaskDurations) -> tuple[Advice, ...]:
    """Advice for one task's timeouts from its distribution (the ``advice`` field is ignored).

    A host queue's task with a host limit is judged against that limit; its shadow job's lease
    (renewed by the heartbeat) is not what makes its host deliver it again.
    """
    found: list[Advice] = []
    if stats.host_limit is not None:
        host_advice = _host_advice(stats, stats.host_limit)
        if host_advice is not None:
            found.append(host_advice)
    for setting, timeout_s, refused in (
        ("visibility_timeout_s", stats.visibility_timeout_s, stats.lease_refused),
        ("lock_ttl_s", stats.lock_ttl_s, stats.lock_lost),
    ):
        if setting == "visibility_timeout_s" and stats.host_limit is not None:
            continue
        if timeout_s is not None:
            advice = _timeout_advice(setting, timeout_s, stats, refused)
            if advice is not None:
                found.append(advice)
    long_tail = stats.max_s >= LONG_TAIL_RATIO * stats.p50_s
    if (
        any(a.severity != Severity.HINT for a in found)
        and long_tail
        and (stats.runs >= LONG_TAIL_MIN_RUNS)
    ):
        target = recommended_s(stats.p99_s, stats.max_s)
        found.append(
            Advice(
                Severity.HINT,
                "queue",
                f"the slowest runs take {stats.max_s / max(stats.p50_s, 1e-9):.0f}x the median: "
                "move slow jobs to their own queue with a longer timeout, e.g. "
                f"App(queue_visibility_timeouts_s={{'slow': {target:g}}}) (G2.3)",
                target,
            )
        )
    return tuple(found)


def _smallest(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _host_limit_of(job: Job) -> HostLimit | None:
    try:
        headers = json.loads(job.headers or "{}")
    except ValueError:
        return None  # not headers of a host job
    return host_limit(headers) if isinstance(headers, dict) else None


def _shortest_limit(jobs: Iterable[Job]) -> HostLimit | None:
    limits = [limit for limit in map(_host_limit_of, jobs) if limit is not None]
    return min(limits, key=lambda limit: limit.timeout_s) if limits else None


def task_durations(attempts: Iterable[Attempt], jobs: Mapping[int, Job]) -> list[TaskDurations]:
    """The distribution and advice of every task with at least one measured run, by name.

    Args:
        attempts: The attempt log.
        jobs: Jobs by id, where each task's visibility timeout and lock TTL are read.
    """
    durations: dict[str, list[float]] = defaultdict(list)
    job_ids: dict[str, set[int]] = defaultdict(set)
    lease_refused: dict[str, int] = defaultdict(int)
    lock_lost: dict[str, int] = defaultdict(int)
    for attempt in attempts:
        if stalled_s(attempt) is not None:
            continue  # the process stood still, not the handler: reported as a stall
        lease_refused[attempt.task] += attempt.outcome == Outcome.LEASE_REFUSED
        lock_lost[attempt.task] += attempt.outcome in REFUSED and attempt.fence is not None
        if attempt.outcome in RAN_HANDLER and attempt.duration_s is not None:
            durations[attempt.task].append(attempt.duration_s)
            job_ids[attempt.task].add(attempt.job_id)
    found: list[TaskDurations] = []
    for task in sorted(durations):
        values = sorted(durations[task])
        task_jobs = [jobs[job_id] for job_id in job_ids[task] if job_id in jobs]
        limit = _shortest_limit(task_jobs)
        stats = TaskDurations(
            task=task,
            runs=len(values),
            p50_s=percentile(values, 50),
            p95_s=percentile(values, 95),
            p99_s=percentile(values, 99),
            max_s=values[-1],
            visibility_timeout_s=_smallest(job.visibility_timeout_s for job in task_jobs),
            lock_ttl_s=_smallest(job.lock_ttl_s for job in task_jobs),
            lease_refused=lease_refused[task],
            lock_lost=lock_lost[task],
            advice=(),
            host_limit=limit,
            host_outlasted=0 if limit is None else sum(v > limit.timeout_s for v in values),
        )
        found.append(replace(stats, advice=advise(stats)))
    return found


def _timeout_finding(d: TaskDurations, advice: Advice) -> Finding:
    lock = advice.setting == "lock_ttl_s"
    timeout_s = d.lock_ttl_s if lock else d.visibility_timeout_s
    refused = d.lock_lost if lock else d.lease_refused
    if advice.setting == "host_timeout" and d.host_limit is not None:
        timeout_s, refused = d.host_limit.timeout_s, d.host_outlasted
    numbers = {
        "max_s": d.max_s,
        "p99_s": d.p99_s,
        "refused": refused,
    }
    if timeout_s is not None:
        numbers["timeout_s"] = timeout_s
    if advice.recommended_s is not None:
        numbers["recommended_s"] = advice.recommended_s
    return Finding(
        kind=Kind.LOCK_TTL if lock else (Kind.QUEUE if advice.setting == "queue" else Kind.LEASE),
        severity=advice.severity,
        task=d.task,
        summary=f"task {d.task}: {advice.message}",
        advice="",
        numbers=numbers,
    )


def timeout_findings(durations: Iterable[TaskDurations]) -> list[Finding]:
    """One finding per piece of timeout advice, with the advice's severity."""
    return [_timeout_finding(d, advice) for d in durations for advice in d.advice]

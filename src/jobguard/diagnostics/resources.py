"""Resource locks seen from the attempt log: contention, starvation, overlaps, stale fences.

A job's ``resource_key`` names the lock its deliveries take. Per resource key and task:

* **contention**: lock-busy deferrals (``deferred`` attempts whose error is ``ResourceBusy``:
  ``resource is busy``, not an operation claimed by another delivery),
  how long the jobs waited for the lock (from their first delivery to the first that ran the
  handler, or to now) against how long they ran, and which task holds that lock longest. A
  short task that waits :data:`STARVED_RATIO` times its run time, at least
  :data:`STARVED_MIN_WAIT_S`, behind another task's long holds is **starved**;
* **overlaps**: two deliveries of *different* operations (or jobs) running at once under one
  resource key, which the lock exists to prevent. The first of the two must have lost its lock
  and run on, which its refusal proves (``fence_refused``, ``lease_refused``): an attempt's
  ``started_at`` is when it was leased, a moment before it took the lock, so two runs that
  merely follow each other through the lock may seem to touch; a ``running`` row may belong to
  a worker that crashed and whose lock another delivery took, as it should; and a crashed
  delivery's row ends when its lease was taken over, not when it stopped running;
* **stale fences**: ``fence_refused`` deliveries, which lost their lock while running. Their
  ``db_step`` writes were refused, but effects outside ``db_step`` may have run twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.core import messages
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids, seconds
from jobguard.diagnostics.overlaps import NOT_RUN, Run, run_of
from jobguard.models import Attempt, BusyReason, Job, Outcome

BUSY = "ResourceBusy"
# A deferral for a busy lock, not for an operation claimed by another delivery.
LOCK_BUSY = messages.busy(BusyReason.LOCK, "", None)
# Refused after it ran on without its lock: only such a delivery proves it held a lock that
# another delivery was granted.
RAN_ON = frozenset({Outcome.FENCE_REFUSED, Outcome.LEASE_REFUSED})
STARVED_RATIO = 10.0
STARVED_MIN_WAIT_S = 1.0
STARVED_MIN_DEFERRALS = 5


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """How one task's jobs used and waited for one resource lock."""

    resource_key: str
    task: str
    jobs: int
    deferrals: int
    """Lock-busy deferrals of these jobs."""
    wait_s: float
    """Time the jobs waited for the lock, summed."""
    run_s: float
    """Time the handler ran, summed over the runs that reported a duration."""
    max_hold_s: float
    """The longest run of this task under this key."""
    longest_holder: str | None
    """The task whose run under this key was the longest (``None``: no measured run)."""
    longest_hold_s: float
    starved: bool


@dataclass(frozen=True, slots=True)
class ResourceOverlap:
    """Two deliveries of different operations that ran at once under one resource key."""

    resource_key: str
    first: Run
    second: Run
    first_task: str
    second_task: str
    first_operation: str | None
    second_operation: str | None
    overlap_s: float
    cause: str


def _lock_busy(attempt: Attempt) -> bool:
    return (
        attempt.outcome == Outcome.DEFERRED
        and attempt.error_type == BUSY
        and (attempt.error_message or "").startswith(LOCK_BUSY)
    )


def _measured(attempt: Attempt) -> bool:
    return attempt.outcome not in NOT_RUN and not (
        attempt.outcome == Outcome.LOST and attempt.duration_s is None
    )


def _holds(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job]
) -> dict[str, dict[str, list[float]]]:
    """Measured run durations by resource key, then task."""
    holds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for attempt in attempts:
        job = jobs.get(attempt.job_id)
        if job is None or job.resource_key is None or attempt.duration_s is None:
            continue
        if _measured(attempt) and attempt.outcome != Outcome.RUNNING:
            holds[job.resource_key][attempt.task].append(attempt.duration_s)
    return holds


def resource_use(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[ResourceUse]:
    """Contention per resource key and task, most deferred first.

    Args:
        attempts: The attempt log.
        jobs: Jobs by id: their ``resource_key`` says which lock each attempt needed.
        now: The store clock; a job still waiting has waited until now.
    """
    attempts = sorted(attempts, key=lambda a: (a.started_at, a.id))
    holds = _holds(attempts, jobs)
    per_job: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        job = jobs.get(attempt.job_id)
        if job is not None and job.resource_key is not None:
            per_job[attempt.job_id].append(attempt)
    groups: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"jobs": 0, "deferrals": 0, "wait_s": 0.0}
    )
    for job_id, job_attempts in per_job.items():
        job = jobs[job_id]
        assert job.resource_key is not None
        group = groups[(job.resource_key, job.task)]
        group["jobs"] += 1
        busy = [a for a in job_attempts if _lock_busy(a)]
        group["deferrals"] += len(busy)
        if busy:
            ran = next((a for a in job_attempts if _measured(a)), None)
            group["wait_s"] += (ran.started_at if ran else now) - job_attempts[0].started_at
    found: list[ResourceUse] = []
    for (key, task), group in groups.items():
        by_task = holds.get(key, {})
        runs = by_task.get(task, [])
        longest = max(
            ((max(values), name) for name, values in by_task.items() if values), default=None
        )
        run_s = sum(runs)
        wait_s = group["wait_s"]
        starved = (
            longest is not None
            and longest[1] != task
            and group["deferrals"] >= STARVED_MIN_DEFERRALS
            and wait_s >= STARVED_MIN_WAIT_S
            and wait_s >= STARVED_RATIO * run_s
        )
        found.append(
            ResourceUse(
                resource_key=key,
                task=task,
                jobs=int(group["jobs"]),
                deferrals=int(group["deferrals"]),
                wait_s=wait_s,
                run_s=run_s,
                max_hold_s=max(runs, default=0.0),
                longest_holder=longest[1] if longest else None,
                longest_hold_s=longest[0] if longest else 0.0,
                starved=starved,
            )
        )
    found.sort(key=lambda u: (-u.deferrals, -u.wait_s, u.resource_key, u.task))
    return found


def _cause(first: Run, second: Run, job: Job | None) -> str:
    if job is not None and job.lock_ttl_s is not None and first.ran_s > job.lock_ttl_s:
        return (
            f"lock TTL shorter than the job: lock_ttl_s={job.lock_ttl_s:g} and the first "
            f"delivery ran {first.ran_s:.2f} s; the lock expired while it ran (its renewals "
            f"were missed) and was granted to another job (fence {first.fence} then "
            f"{second.fence})"
        )
    return (
        "unexplained: the first delivery ran within its lock TTL; look for a jump of the "
        "store's clock or a worker that stalled"
    )


def find_resource_overlaps(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[ResourceOverlap]:
    """Runs of different operations (or jobs) under one resource key that intersect."""
    runs: dict[str, list[tuple[Run, Attempt]]] = defaultdict(list)
    for attempt in attempts:
        job = jobs.get(attempt.job_id)
        if job is None or job.resource_key is None or not _measured(attempt):
            continue
        run = run_of(attempt, now)
        if run is not None:
            runs[job.resource_key].append((run, attempt))
    found: list[ResourceOverlap] = []
    for key, members in runs.items():
        members.sort(key=lambda m: (m[0].started_at, m[0].attempt_id))
        for i, (first, first_attempt) in enumerate(members):
            for second, second_attempt in members[i + 1 :]:
                if second.started_at >= first.ended_at:
                    break
                same = (
                    first_attempt.operation_key is not None
                    and first_attempt.operation_key == second_attempt.operation_key
                ) or first.job_id == second.job_id
                overlap_s = min(first.ended_at, second.ended_at) - second.started_at
                if same or overlap_s <= 0 or first.outcome not in RAN_ON:
                    continue  # one operation twice is an overlap of :mod:`.overlaps`
                found.append(
                    ResourceOverlap(
                        resource_key=key,
                        first=first,
                        second=second,
                        first_task=first_attempt.task,
                        second_task=second_attempt.task,
                        first_operation=first_attempt.operation_key,
                        second_operation=second_attempt.operation_key,
                        overlap_s=overlap_s,
                        cause=_cause(first, second, jobs.get(first.job_id)),
                    )
                )
    found.sort(key=lambda o: (o.first.started_at, o.second.started_at))
    return found


def fence_refusals(attempts: Iterable[Attempt]) -> list[Attempt]:
    """The ``fence_refused`` attempts, oldest first."""
    return sorted(
        (a for a in attempts if a.outcome == Outcome.FENCE_REFUSED),
        key=lambda a: (a.started_at, a.id),
    )


def resource_findings(
    uses: Iterable[ResourceUse],
    overlaps: Iterable[ResourceOverlap],
    refused: Iterable[Attempt],
    jobs: Mapping[int, Job],
) -> list[Finding]:
    """Problems for resource overlaps and stale fences, warnings for starvation."""
    found = [
        Finding(
            kind=Kind.RESOURCE_OVERLAP,
            severity=Severity.PROBLEM,
            task=o.first_task if o.first_task == o.second_task else None,
            summary=(
                f"resource {o.resource_key}: attempts {o.first.attempt_id} (job "
                f"{o.first.job_id}, {o.first_task}) and {o.second.attempt_id} (job "
                f"{o.second.job_id}, {o.second_task}) ran at once for {seconds(o.overlap_s)} "
                f"under one lock; likely cause: {o.cause}"
            ),
            advice=(
                "the lock was held by two deliveries at once: raise lock_ttl_s above the "
                "longest run; writes through db_step were fenced, but effects outside db_step "
                "may have run twice"
            ),
            keys=Keys(
                job_ids=tuple(sorted({o.first.job_id, o.second.job_id})),
                operation_keys=tuple(
                    sorted(k for k in {o.first_operation, o.second_operation} if k)
                ),
                resource_keys=(o.resource_key,),
                attempt_ids=(o.first.attempt_id, o.second.attempt_id),
            ),
            numbers={"overlap_s": round(o.overlap_s, 3)},
        )
        for o in overlaps
    ]
    by_task: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in refused:
        by_task[attempt.task].append(attempt)
    for task, members in sorted(by_task.items()):
        job_ids = tuple(sorted({a.job_id for a in members}))
        resources = tuple(sorted({k for j in job_ids if j in jobs and (k := jobs[j].resource_key)}))
        found.append(
            Finding(
                kind=Kind.FENCE_REFUSED,
                severity=Severity.PROBLEM,
                task=task,
                summary=(
                    f"task {task}: {len(members)} "
                    f"{'delivery' if len(members) == 1 else 'deliveries'} lost the resource "
                    f"lock while running and had a write refused by its fence (job(s) "
                    f"{ids(job_ids)}, resource(s) {', '.join(resources) or '?'})"
                ),
                advice=(
                    "their db_step writes were refused, but effects outside db_step (an email, "
                    "an API call without an idempotency key) may have run twice; raise "
                    "lock_ttl_s above the longest run and find what stalled the worker"
                ),
                keys=Keys(
                    job_ids=job_ids,
                    resource_keys=resources,
                    attempt_ids=tuple(a.id for a in members),
                ),
                numbers={"attempts": len(members)},
            )
        )
    found.extend(
        Finding(
            kind=Kind.STARVATION,
            severity=Severity.WARNING,
            task=u.task,
            summary=(
                f"task {u.task}: starved on resource {u.resource_key}, its {u.jobs} jobs waited "
                f"{seconds(u.wait_s)} for {seconds(u.run_s)} of work through {u.deferrals} "
                f"lock-busy deferrals, behind task {u.longest_holder} which holds that lock "
                f"for up to {seconds(u.longest_hold_s)}"
            ),
            advice=(
                f"give {u.longest_holder} a narrower resource_key, or split its work into "
                "shorter jobs, or move the short task off that lock"
            ),
            keys=Keys(resource_keys=(u.resource_key,)),
            numbers={
                "jobs": u.jobs,
                "deferrals": u.deferrals,
                "wait_s": round(u.wait_s, 3),
                "run_s": round(u.run_s, 3),
                "longest_hold_s": round(u.longest_hold_s, 3),
            },
        )
        for u in uses
        if u.starved
    )
    return found

"""Resource locks (and concurrency slots) seen from the attempt log: contention, starvation,
overlaps, stale fences.

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

A job's ``concurrency_key`` names the slots its deliveries take (one of ``concurrency_limit``):
per concurrency key and task, the same contention is measured from slot-busy deferrals
(:func:`slot_use`); and an **overrun** is more operations (or jobs) running at once under one key
than its limit, which the slots exist to prevent. As for an overlap, one of them must have lost
its slot and run on, which its refusal proves (:func:`find_slot_overruns`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from jobguard.core import messages
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids, seconds
from jobguard.diagnostics.overlaps import NOT_RUN, Run, run_of
from jobguard.models import Attempt, BusyReason, Job, Outcome

BUSY = "ResourceBusy"
# A deferral for a busy lock, not for an operation claimed by another delivery.
LOCK_BUSY = messages.busy(BusyReason.LOCK, "", None)
# A deferral for a concurrency key whose every slot is held (the message goes on with the
# limit and the key).
SLOT_BUSY = messages.busy(BusyReason.SLOT, None, None).split(":")[0]
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
class SlotUse:
    """How one task's jobs used and waited for the slots of one concurrency key."""

    concurrency_key: str
    limit: int | None
    """The key's concurrency limit, the smallest its jobs were enqueued with."""
    task: str
    jobs: int
    deferrals: int
    """Slot-busy deferrals of these jobs."""
    wait_s: float
    """Time the jobs waited for a slot, summed."""
    run_s: float
    """Time the handler ran, summed over the runs that reported a duration."""
    longest_holder: str | None
    """The task whose run under this key was the longest (``None``: no measured run)."""
    longest_hold_s: float


@dataclass(frozen=True, slots=True)
class _Contention:
    """One key and task: what :class:`ResourceUse` and :class:`SlotUse` report."""

    key: str
    task: str
    jobs: int
    deferrals: int
    wait_s: float
    runs: list[float]
    longest_holder: str | None
    longest_hold_s: float


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


@dataclass(frozen=True, slots=True)
class SlotOverrun:
    """More operations (or jobs) running at once under one concurrency key than its limit."""

    concurrency_key: str
    limit: int
    """The key's concurrency limit, the smallest its jobs were enqueued with."""
    runs: tuple[Run, ...]
    """The deliveries running at that moment, in the order they started."""
    tasks: tuple[str, ...]
    operation_keys: tuple[str, ...]
    overrun_s: float
    """How long they all ran at once (until the first of them ended)."""


def _busy_with(prefix: str) -> Callable[[Attempt], bool]:
    def busy(attempt: Attempt) -> bool:
        return (
            attempt.outcome == Outcome.DEFERRED
            and attempt.error_type == BUSY
            and (attempt.error_message or "").startswith(prefix)
        )

    return busy


_lock_busy = _busy_with(LOCK_BUSY)
_slot_busy = _busy_with(SLOT_BUSY)


def _measured(attempt: Attempt) -> bool:
    return attempt.outcome not in NOT_RUN and not (
        attempt.outcome == Outcome.LOST and attempt.duration_s is None
    )


KeyOf = Callable[[Job], str | None]


def _contention(
    attempts: Iterable[Attempt],
    jobs: Mapping[int, Job],
    now: float,
    key_of: KeyOf,
    busy: Callable[[Attempt], bool],
) -> list[_Contention]:
    """Per key (``key_of`` a job: its resource or concurrency key) and task: the jobs, their
    ``busy`` deferrals, how long they waited (from their first delivery to the first that ran,
    or to now), the measured runs, and the task that held the key longest; most deferred
    first."""
    attempts = sorted(attempts, key=lambda a: (a.started_at, a.id))
    holds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_job: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        job = jobs.get(attempt.job_id)
        key = key_of(job) if job is not None else None
        if key is None:
            continue
        per_job[attempt.job_id].append(attempt)
        measured = _measured(attempt) and attempt.outcome != Outcome.RUNNING
        if measured and attempt.duration_s is not None:
            holds[key][attempt.task].append(attempt.duration_s)
    groups: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"jobs": 0, "deferrals": 0, "wait_s": 0.0}
    )
    for job_id, job_attempts in per_job.items():
        job = jobs[job_id]
        group = groups[(key_of(job) or "", job.task)]
        group["jobs"] += 1
        deferred = [a for a in job_attempts if busy(a)]
        group["deferrals"] += len(deferred)
        if deferred:
            ran = next((a for a in job_attempts if _measured(a)), None)
            group["wait_s"] += (ran.started_at if ran else now) - job_attempts[0].started_at
    found: list[_Contention] = []
    for (key, task), group in groups.items():
        by_task = holds.get(key, {})
        longest = max(
            ((max(values), name) for name, values in by_task.items() if values), default=None
        )
        found.append(
            _Contention(
                key=key,
                task=task,
                jobs=int(group["jobs"]),
                deferrals=int(group["deferrals"]),
                wait_s=group["wait_s"],
                runs=by_task.get(task, []),
                longest_holder=longest[1] if longest else None,
                longest_hold_s=longest[0] if longest else 0.0,
            )
        )
    found.sort(key=lambda c: (-c.deferrals, -c.wait_s, c.key, c.task))
    return found


def resource_use(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[ResourceUse]:
    """Contention per resource key and task, most deferred first.

    Args:
        attempts: The attempt log.
        jobs: Jobs by id: their ``resource_key`` says which lock each attempt needed.
        now: The store clock; a job still waiting has waited until now.
    """
    found: list[ResourceUse] = []
    for c in _contention(attempts, jobs, now, lambda job: job.resource_key, _lock_busy):
        run_s = sum(c.runs)
        starved = (
            c.longest_holder is not None
            and c.longest_holder != c.task
            and c.deferrals >= STARVED_MIN_DEFERRALS
            and c.wait_s >= STARVED_MIN_WAIT_S
            and c.wait_s >= STARVED_RATIO * run_s
        )
        found.append(
            ResourceUse(
                resource_key=c.key,
                task=c.task,
                jobs=c.jobs,
                deferrals=c.deferrals,
                wait_s=c.wait_s,
                run_s=run_s,
                max_hold_s=max(c.runs, default=0.0),
                longest_holder=c.longest_holder,
                longest_hold_s=c.longest_hold_s,
                starved=starved,
            )
        )
    return found


def _limits(jobs: Iterable[Job]) -> dict[str, int]:
    """Each concurrency key's limit: the smallest its jobs were enqueued with."""
    limits: dict[str, int] = {}
    for job in jobs:
        if job.concurrency_key is not None and job.concurrency_limit is not None:
            known = limits.get(job.concurrency_key, job.concurrency_limit)
            limits[job.concurrency_key] = min(known, job.concurrency_limit)
    return limits


def slot_use(attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float) -> list[SlotUse]:
    """Contention per concurrency key and task, most deferred first (as :func:`resource_use`,
    from slot-busy deferrals: every slot of the key was held)."""
    limits = _limits(jobs.values())
    return [
        SlotUse(
            concurrency_key=c.key,
            limit=limits.get(c.key),
            task=c.task,
            jobs=c.jobs,
            deferrals=c.deferrals,
            wait_s=c.wait_s,
            run_s=sum(c.runs),
            longest_holder=c.longest_holder,
            longest_hold_s=c.longest_hold_s,
        )
        for c in _contention(attempts, jobs, now, lambda job: job.concurrency_key, _slot_busy)
    ]


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


def _runs_by(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float, key_of: KeyOf
) -> dict[str, list[tuple[Run, Attempt]]]:
    """The deliveries that ran the handler, per key (``key_of`` their job), in start order."""
    runs: dict[str, list[tuple[Run, Attempt]]] = defaultdict(list)
    for attempt in attempts:
        job = jobs.get(attempt.job_id)
        key = key_of(job) if job is not None else None
        if key is None or not _measured(attempt):
            continue
        run = run_of(attempt, now)
        if run is not None:
            runs[key].append((run, attempt))
    for members in runs.values():
        members.sort(key=lambda m: (m[0].started_at, m[0].attempt_id))
    return runs


def find_resource_overlaps(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[ResourceOverlap]:
    """Runs of different operations (or jobs) under one resource key that intersect."""
    found: list[ResourceOverlap] = []
    for key, members in _runs_by(attempts, jobs, now, lambda job: job.resource_key).items():
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


def find_slot_overruns(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[SlotOverrun]:
    """Each time more operations (or jobs) of one concurrency key ran at once than its limit,
    counted once while it lasts, and only where a delivery that started before the last of
    them was refused after running on (its slot granted again meanwhile): runs that merely
    follow each other through a slot may seem to touch, as for :func:`find_resource_overlaps`.
    Two deliveries of one operation count once here (they are an overlap of :mod:`.overlaps`)."""
    limits = _limits(jobs.values())
    found: list[SlotOverrun] = []
    limited = _runs_by(
        attempts,
        jobs,
        now,
        lambda job: job.concurrency_key if job.concurrency_key in limits else None,
    )
    for key, members in limited.items():
        active: list[tuple[Run, Attempt]] = []
        over = False
        for member in members:
            start = member[0].started_at
            active = [m for m in active if m[0].ended_at > start] + [member]
            held = {m[1].operation_key or f"job {m[0].job_id}" for m in active}
            if len(held) <= limits[key]:
                over = False
            elif not over and any(m[0].outcome in RAN_ON for m in active[:-1]):
                over = True
                operations = {k for _, attempt in active if (k := attempt.operation_key)}
                found.append(
                    SlotOverrun(
                        concurrency_key=key,
                        limit=limits[key],
                        runs=tuple(run for run, _ in active),
                        tasks=tuple(sorted({attempt.task for _, attempt in active})),
                        operation_keys=tuple(sorted(operations)),
                        overrun_s=min(run.ended_at for run, _ in active) - start,
                    )
                )
    found.sort(key=lambda o: (o.runs[0].started_at, o.concurrency_key))
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
    overruns: Iterable[SlotOverrun],
) -> list[Finding]:
    """Problems for resource overlaps, slot overruns and stale fences, warnings for
    starvation."""
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
    found.extend(
        Finding(
            kind=Kind.SLOT_OVERRUN,
            severity=Severity.PROBLEM,
            task=o.tasks[0] if len(o.tasks) == 1 else None,
            summary=(
                f"concurrency key {o.concurrency_key}: {len(o.runs)} deliveries ran at once "
                f"for {seconds(o.overrun_s)} where its limit is {o.limit} (attempts "
                f"{ids(r.attempt_id for r in o.runs)}, job(s) {ids(r.job_id for r in o.runs)}); "
                "one of them lost its slot while running (its lock TTL ran out) and ran on"
            ),
            advice=(
                "raise lock_ttl_s above the longest run (a slot is held as long as a lock) and "
                "find what stalled the worker; writes through db_step were fenced, but effects "
                "outside db_step ran beyond the limit"
            ),
            keys=Keys(
                job_ids=tuple(sorted({r.job_id for r in o.runs})),
                operation_keys=o.operation_keys,
                attempt_ids=tuple(r.attempt_id for r in o.runs),
            ),
            numbers={"limit": o.limit, "runs": len(o.runs), "overrun_s": round(o.overrun_s, 3)},
        )
        for o in overruns
    )
    by_task: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in refused:
        by_task[attempt.task].append(attempt)
    for task, members in sorted(by_task.items()):
        job_ids = tuple(sorted({a.job_id for a in members}))
        known = [jobs[j] for j in job_ids if j in jobs]
        resources = tuple(sorted({k for job in known if (k := job.resource_key)}))
        slots = tuple(sorted({k for job in known if (k := job.concurrency_key)}))
        # A fence guards a resource lock and a concurrency slot alike: name what the jobs held.
        held = [
            *([f"resource(s) {', '.join(resources)}"] if resources else []),
            *([f"concurrency key(s) {', '.join(slots)}"] if slots else []),
        ]
        found.append(
            Finding(
                kind=Kind.FENCE_REFUSED,
                severity=Severity.PROBLEM,
                task=task,
                summary=(
                    f"task {task}: {len(members)} "
                    f"{'delivery' if len(members) == 1 else 'deliveries'} lost "
                    f"{'its lock or slot' if slots else 'the resource lock'} while running and "
                    f"had a write refused by its fence (job(s) {ids(job_ids)}, "
                    f"{'; '.join(held) or 'resource(s) ?'})"
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

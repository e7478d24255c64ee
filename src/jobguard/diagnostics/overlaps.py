"""G10.2: one operation executed by two deliveries at overlapping times.

Each attempt that ran (or may have run) the handler covers an interval of store time, from
``started_at`` to its end. Its end is what the row says: ``ended_at``, or ``started_at +
duration_s`` when the worker measured a longer run than that. The difference matters: when a
lease is taken over, the old attempt is closed as ``lost`` at that moment, but the stale worker
may go on running and report later (``lease_refused``) with the duration it really ran. A
``running`` attempt ends now. Two such intervals of one operation key (or, for jobs without one,
of one job) that intersect are an overlap: the work ran twice at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, seconds
from jobguard.diagnostics.stalls import stalled_s
from jobguard.models import Attempt, Job, Outcome

# Deliveries that ended before the handler could start: they cannot have overlapped anything.
NOT_RUN = frozenset({Outcome.DEFERRED, Outcome.ALREADY_PROCESSED})


@dataclass(frozen=True, slots=True)
class Run:
    """One delivery's side of an overlap: who ran it, under which lease and fence, and when."""

    attempt_id: int
    job_id: int
    attempt: int
    worker_id: str
    lease_token: str
    lock_owner: str | None
    fence: int | None
    outcome: Outcome
    started_at: float
    ended_at: float
    """The end used for the comparison (see the module docstring), store clock."""
    stalled_s: float | None = None
    """How long its worker process stood still, when that is why it lost its lease."""

    @property
    def ran_s(self) -> float:
        """How long the delivery was running the job."""
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two deliveries of one operation (or one job) that were running at the same time."""

    key: str
    """The operation key, or ``job ID`` for a job without one."""
    operation_key: str | None
    task: str
    """The task of the first delivery."""
    first: Run
    second: Run
    overlap_s: float
    causes: tuple[str, ...]
    """Likely causes, most likely first."""


def run_of(attempt: Attempt, now: float) -> Run | None:
    """The interval an attempt was running, or ``None`` if it never ran the handler."""
    if attempt.outcome in NOT_RUN:
        return None
    if attempt.ended_at is not None:
        end = attempt.ended_at
    elif attempt.outcome == Outcome.RUNNING:
        end = now
    else:
        end = attempt.started_at  # closed but no end recorded: it proves nothing
    if attempt.duration_s is not None:
        end = max(end, attempt.started_at + attempt.duration_s)
    return Run(
        attempt_id=attempt.id,
        job_id=attempt.job_id,
        attempt=attempt.attempt,
        worker_id=attempt.worker_id,
        lease_token=attempt.lease_token,
        lock_owner=attempt.lock_owner,
        fence=attempt.fence,
        outcome=attempt.outcome,
        started_at=attempt.started_at,
        ended_at=end,
        stalled_s=stalled_s(attempt),
    )


def likely_causes(first: Run, second: Run, job: Job | None) -> tuple[str, ...]:
    """Why ``second`` could start while ``first`` was still running, most likely first.

    "No resource lock" is offered only when the first delivery's lease had not expired: a lock
    is renewed with the lease, so one that expired would have let the second delivery in too.
    """
    if job is None:
        return ("unknown: the job row is gone, so its timeouts cannot be compared",)
    causes: list[str] = []
    if first.stalled_s is not None:
        causes.append(
            f"a stall: the first delivery's worker process stood still for "
            f"{first.stalled_s:.2f} s (stopped, paused or swapped out), so its heartbeat could "
            "not renew the lease, which expired; the job was delivered again and the first "
            "delivery ran on when the process resumed (a longer lease only helps shorter stalls)"
        )
    if first.stalled_s is None and first.ran_s > job.visibility_timeout_s:
        causes.append(
            f"lease shorter than the job: the first delivery ran {first.ran_s:.2f} s with "
            f"visibility_timeout_s={job.visibility_timeout_s:g}; its lease expired while it "
            "ran (heartbeat off, or renewals missed) and the job was delivered again"
        )
    lease_expired = bool(causes)  # by a stall or a lease shorter than the run
    if job.resource_key is not None and job.lock_ttl_s is not None and first.ran_s > job.lock_ttl_s:
        causes.append(
            f"lock TTL shorter than the job: lock_ttl_s={job.lock_ttl_s:g} on "
            f"{job.resource_key!r}; the lock expired while the first delivery held it and was "
            f"granted again (fence {first.fence} then {second.fence})"
        )
    if first.job_id != second.job_id:
        causes.append(
            f"two jobs ({first.job_id} and {second.job_id}) carry this operation key: "
            "enqueue with a dedup_key so one business action is one job (G6)"
        )
    if job.resource_key is None and not lease_expired:
        # A lock expires with the lease it is renewed with: it keeps a second delivery out
        # only when the first one's lease did not expire.
        causes.append(
            "no resource lock: the task sets no resource_key, so no lock kept the second "
            "delivery out"
        )
    if not causes:
        causes.append(
            "unexplained: the first delivery ran within its lease and lock TTL; look for a "
            "jump of the store's clock or a worker that stalled"
        )
    return tuple(causes)


def _group_key(attempt: Attempt) -> tuple[str, str]:
    if attempt.operation_key is not None:
        return ("operation", attempt.operation_key)
    return ("job", str(attempt.job_id))


def find_overlaps(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], now: float
) -> list[Overlap]:
    """Every pair of deliveries of one operation key (or one job) whose runs intersect.

    Args:
        attempts: The attempt log to search.
        jobs: Jobs by id, for the timeouts the likely causes are judged against.
        now: The store clock; a ``running`` attempt ends here.

    Returns:
        The overlaps, earliest first.
    """
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    task_of: dict[int, str] = {}
    for attempt in attempts:
        run = run_of(attempt, now)
        if run is not None:
            groups[_group_key(attempt)].append(run)
            task_of[attempt.id] = attempt.task
    found: list[Overlap] = []
    for (kind, name), runs in groups.items():
        runs.sort(key=lambda r: (r.started_at, r.attempt_id))
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                if second.started_at >= first.ended_at:
                    break  # sorted by start: no later run can overlap ``first`` either
                overlap_s = min(first.ended_at, second.ended_at) - second.started_at
                if overlap_s <= 0:
                    continue  # ``second`` started and ended at the same instant
                found.append(
                    Overlap(
                        key=name if kind == "operation" else f"job {name}",
                        operation_key=name if kind == "operation" else None,
                        task=task_of[first.attempt_id],
                        first=first,
                        second=second,
                        overlap_s=overlap_s,
                        causes=likely_causes(first, second, jobs.get(first.job_id)),
                    )
                )
    found.sort(key=lambda o: (o.first.started_at, o.second.started_at))
    return found


def overlap_findings(overlaps: Iterable[Overlap]) -> list[Finding]:
    """A problem per overlap, with its most likely cause."""
    return [
        Finding(
            kind=Kind.OVERLAP,
            severity=Severity.PROBLEM,
            task=o.task,
            summary=(
                f"operation {o.key}: attempts {o.first.attempt_id} and {o.second.attempt_id} "
                f"overlapped for {seconds(o.overlap_s)}"
            ),
            advice=f"likely cause: {o.causes[0]}" if o.causes else "",
            keys=Keys(
                job_ids=tuple(sorted({o.first.job_id, o.second.job_id})),
                operation_keys=(o.operation_key,) if o.operation_key else (),
                attempt_ids=(o.first.attempt_id, o.second.attempt_id),
            ),
            numbers={"overlap_s": round(o.overlap_s, 3)},
        )
        for o in overlaps
    ]

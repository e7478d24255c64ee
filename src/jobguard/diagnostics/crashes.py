"""A crash loop and its culprit: the job present at every crash of the workers that ran it.

A worker that dies (SIGKILL, out of memory, a native crash) never reports back: each delivery
it held is closed as ``lost`` with no duration when its lease is taken over. Grouped by the
worker that held them, ``lost`` attempts tell which jobs were in each dead process. A job lost
in :data:`MIN_CRASHES` crashes or more, present at every one of them, is the likely cause (its
delivery kills the process); the other jobs lost in those crashes are collateral. A few workers
killed once each, their jobs recovered by their leases, is no loop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids
from jobguard.models import Attempt, Job, JobStatus

MIN_CRASHES = 2


@dataclass(frozen=True, slots=True)
class CrashLoop:
    """Worker crashes that had the same job(s) in them every time."""

    task: str
    culprit_job_ids: tuple[int, ...]
    """The jobs present at every one of these crashes."""
    collateral_job_ids: tuple[int, ...]
    """Other jobs lost in the same crashes."""
    workers: tuple[str, ...]
    """The workers that died, in order of their crash."""
    buried_job_ids: tuple[int, ...]
    """Culprits that ended in the dead letter queue."""
    operation_keys: tuple[str, ...]
    """The culprits' operation keys (often left stuck in ``processing``)."""
    lost_attempt_ids: tuple[int, ...]


def crashed(attempt: Attempt) -> bool:
    """Whether the delivery died with its worker: closed as lost at takeover, never reported."""
    return attempt.never_reported


def find_crash_loops(
    attempts: Iterable[Attempt], jobs: Mapping[int, Job], *, min_crashes: int = MIN_CRASHES
) -> list[CrashLoop]:
    """Groups of worker crashes with a job present at each, most crashes first.

    Args:
        attempts: The attempt log.
        jobs: Jobs by id (to tell which culprits were buried).
        min_crashes: A job lost in fewer crashes than this is not a loop's culprit.
    """
    lost = [a for a in attempts if crashed(a)]
    in_crash: dict[str, set[int]] = defaultdict(set)
    crashes_of: dict[int, set[str]] = defaultdict(set)
    first_seen: dict[str, float] = {}
    for attempt in sorted(lost, key=lambda a: (a.started_at, a.id)):
        in_crash[attempt.worker_id].add(attempt.job_id)
        crashes_of[attempt.job_id].add(attempt.worker_id)
        first_seen.setdefault(attempt.worker_id, attempt.started_at)
    loops: dict[frozenset[str], set[int]] = defaultdict(set)
    for job_id, crashes in crashes_of.items():
        if len(crashes) >= min_crashes:
            loops[frozenset(crashes)].add(job_id)
    found: list[CrashLoop] = []
    for crash_set, culprits in loops.items():
        if any(crash_set < other for other in loops):
            continue  # these jobs were at a subset of another loop's crashes: collateral there
        collateral = set().union(*(in_crash[w] for w in crash_set)) - culprits
        culprit_ids = tuple(sorted(culprits))
        first = jobs.get(culprit_ids[0])
        found.append(
            CrashLoop(
                task=first.task if first is not None else "?",
                culprit_job_ids=culprit_ids,
                collateral_job_ids=tuple(sorted(collateral)),
                workers=tuple(sorted(crash_set, key=lambda w: first_seen[w])),
                buried_job_ids=tuple(
                    job_id
                    for job_id in culprit_ids
                    if job_id in jobs and jobs[job_id].status == JobStatus.DEAD
                ),
                operation_keys=tuple(
                    sorted(
                        {
                            key
                            for job_id in culprit_ids
                            if job_id in jobs and (key := jobs[job_id].operation_key)
                        }
                    )
                ),
                lost_attempt_ids=tuple(
                    sorted(a.id for a in lost if a.worker_id in crash_set and a.job_id in culprits)
                ),
            )
        )
    found.sort(key=lambda loop: (-len(loop.workers), loop.culprit_job_ids))
    return found


def crash_findings(loops: Iterable[CrashLoop]) -> list[Finding]:
    """One problem per crash loop, naming the culprits and the collateral."""
    found = []
    for loop in loops:
        buried = (
            f"; it was buried as never reported back (job {ids(loop.buried_job_ids)})"
            if loop.buried_job_ids
            else ""
        )
        collateral = (
            f"; jobs {ids(loop.collateral_job_ids)} died with it as collateral (their attempts "
            "were charged, and they ran again elsewhere)"
            if loop.collateral_job_ids
            else ""
        )
        found.append(
            Finding(
                kind=Kind.CRASH_LOOP,
                severity=Severity.PROBLEM,
                task=loop.task,
                summary=(
                    f"task {loop.task}: crash loop, job {ids(loop.culprit_job_ids)} was running "
                    f"in every one of {len(loop.workers)} worker crashes "
                    f"({', '.join(loop.workers)}){buried}{collateral}"
                ),
                advice=(
                    "its delivery kills the worker process (out of memory, a native crash, an "
                    "exit in the handler): look at what that job does differently, fix it or "
                    "purge it; do not replay it as it is"
                ),
                keys=Keys(
                    job_ids=loop.culprit_job_ids,
                    other_job_ids=loop.collateral_job_ids,
                    operation_keys=loop.operation_keys,
                    attempt_ids=loop.lost_attempt_ids,
                ),
                numbers={
                    "crashes": len(loop.workers),
                    "collateral_jobs": len(loop.collateral_job_ids),
                    "buried": len(loop.buried_job_ids),
                },
            )
        )
    return found

"""An outage is not poison: many jobs failing the same way within a short window.

When a dependency is down, every job that needs it fails with one error signature (see
:func:`~.poison.signature_of`) until it is back. Failed deliveries (``retry`` and ``dead``) of
one task and signature are cut into bursts wherever :data:`WINDOW_S` passes without such a
failure; a burst that struck :data:`MIN_JOBS` jobs or more, and at least :data:`MIN_SHARE` of
the task's jobs that ran in its span, is an outage, whether its jobs were retried or buried,
and however the retry rules treated them. The share keeps a busy task's steady trickle of
transient errors from reading as an outage. One job failing again and again alone is a poison
candidate instead (:mod:`.poison`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids, seconds
from jobguard.diagnostics.poison import failures_by_signature
from jobguard.diagnostics.retries import RUNS
from jobguard.models import Attempt, Job, JobStatus, Outcome

WINDOW_S = 60.0
MIN_JOBS = 5
MIN_SHARE = 0.5
MASS_BURIAL = 2
"""This many jobs of one outage buried makes it a problem rather than a warning."""


@dataclass(frozen=True, slots=True)
class Outage:
    """One burst of failures with one signature that struck many jobs of one task."""

    task: str
    error_type: str
    signature: str
    where: str | None
    message: str
    """The message of the latest failure (shortened)."""
    first_at: float
    last_at: float
    failures: int
    retried: int
    dead: int
    """Failures that buried their job."""
    job_ids: tuple[int, ...]
    """Every job the burst struck, in numeric order."""
    dead_job_ids: tuple[int, ...]


def _bursts(members: list[Attempt], window_s: float) -> list[list[Attempt]]:
    bursts: list[list[Attempt]] = []
    for attempt in members:
        if bursts and attempt.started_at - bursts[-1][-1].started_at <= window_s:
            bursts[-1].append(attempt)
        else:
            bursts.append([attempt])
    return bursts


def find_outages(
    attempts: Iterable[Attempt], *, window_s: float = WINDOW_S, min_jobs: int = MIN_JOBS
) -> list[Outage]:
    """Bursts of one error signature that struck at least ``min_jobs`` jobs, earliest first.

    Args:
        attempts: The attempt log.
        window_s: Failures further apart than this belong to different bursts.
        min_jobs: A burst that struck fewer jobs, or less than :data:`MIN_SHARE` of the jobs
            of its task that ran in its span, is not an outage.
    """
    attempts = list(attempts)
    runs: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.outcome in RUNS:
            runs[attempt.task].append(attempt)
    groups, wheres = failures_by_signature(attempts)
    found: list[Outage] = []
    for (task, signature), members in groups.items():
        for burst in _bursts(members, window_s):
            jobs = {a.job_id for a in burst}
            first_at, last_at = burst[0].started_at, burst[-1].started_at
            ran = {a.job_id for a in runs[task] if first_at <= a.started_at <= last_at}
            if len(jobs) < min_jobs or len(jobs) < MIN_SHARE * len(ran):
                continue
            dead = [a for a in burst if a.outcome == Outcome.DEAD]
            latest = burst[-1]
            found.append(
                Outage(
                    task=task,
                    error_type=latest.error_type or "",
                    signature=signature,
                    where=wheres[(task, signature)],
                    message=(latest.error_message or "")[:120],
                    first_at=first_at,
                    last_at=max(a.ended_at or a.started_at for a in burst),
                    failures=len(burst),
                    retried=len(burst) - len(dead),
                    dead=len(dead),
                    job_ids=tuple(sorted(jobs)),
                    dead_job_ids=tuple(sorted({a.job_id for a in dead})),
                )
            )
    found.sort(key=lambda o: (o.first_at, o.task))
    return found


def _advice(outage: Outage, still_dead: list[int], pending: list[int]) -> tuple[Severity, str]:
    ride_out = (
        "let the task ride out the next one: declare the error transient, with max_attempts "
        "and backoff_cap_s that outlast an outage"
    )
    if len(outage.dead_job_ids) < MASS_BURIAL:
        return Severity.WARNING, (
            "many jobs failing together is a dependency that was down, not a poison job; "
            "they were retried, check that the dependency is back"
        )
    if still_dead:
        return Severity.PROBLEM, (
            "many jobs failing together is a dependency that was down, not a poison job; once "
            f"it is back, replay the buried jobs (jobguard dlq replay ID), and {ride_out}"
        )
    if pending:
        return Severity.WARNING, f"the replayed jobs have not finished yet; {ride_out}"
    return Severity.HINT, ride_out


def _state(outage: Outage, still_dead: list[int], pending: list[int]) -> str:
    buried = len(outage.dead_job_ids)
    if buried < MASS_BURIAL or still_dead:
        left = f"; {len(still_dead)} jobs still buried" if 0 < len(still_dead) < buried else ""
        return f"{buried} jobs buried: {ids(outage.dead_job_ids) or 'none'}{left}"
    if pending:
        return f"{buried} jobs buried and replayed, {len(pending)} not finished: {ids(pending)}"
    return f"resolved: all {buried} buried jobs were replayed and completed"


def outage_findings(outages: Iterable[Outage], jobs: Mapping[int, Job]) -> list[Finding]:
    """One finding per outage: a problem while it has jobs buried en masse, a hint once every
    buried job was replayed and completed, else a warning.

    Args:
        outages: From :func:`find_outages`.
        jobs: Jobs by id, to tell whether the buried jobs are still in the dead letter queue.
    """
    found = []
    for outage in outages:
        now = {job_id: jobs[job_id].status for job_id in outage.dead_job_ids if job_id in jobs}
        still_dead = [job_id for job_id, state in now.items() if state == JobStatus.DEAD]
        pending = [
            job_id
            for job_id, state in now.items()
            if state in (JobStatus.QUEUED, JobStatus.RUNNING)
        ]
        severity, advice = _advice(outage, still_dead, pending)
        span_s = outage.last_at - outage.first_at
        summary = (
            f"task {outage.task}: outage, {len(outage.job_ids)} jobs failed with the same "
            f"{outage.error_type} at {outage.where or '?'} within {seconds(span_s)} "
            f"({outage.retried} retried, {_state(outage, still_dead, pending)})"
        )
        found.append(
            Finding(
                kind=Kind.OUTAGE,
                severity=severity,
                task=outage.task,
                summary=summary,
                advice=advice,
                keys=Keys(job_ids=outage.job_ids, other_job_ids=tuple(still_dead)),
                numbers={
                    "jobs": len(outage.job_ids),
                    "failures": outage.failures,
                    "retried": outage.retried,
                    "dead": outage.dead,
                    "dead_jobs": len(outage.dead_job_ids),
                    "still_dead_jobs": len(still_dead),
                    "window_s": round(span_s, 3),
                    "first_at": outage.first_at,
                    "last_at": outage.last_at,
                },
            )
        )
    return found

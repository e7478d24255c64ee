"""Worker deaths: how many worker processes died, what they took down, and what recovered.

A worker that dies (SIGKILL, the OOM killer, a native crash, a host lost) never reports back:
each delivery it held is closed as ``lost``, with no duration, when its lease is taken over
(see :mod:`.crashes`). Grouped by worker, those attempts say how many processes died and which
jobs died with them; the jobs' states now say what became of them: completed again
(recovered), queued or running again (still recovering), or buried (a job allowed no further
delivery goes to the dead letter queue). One job present at several deaths is a crash loop,
reported on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.diagnostics.crashes import crashed
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids
from jobguard.models import Attempt, Job, JobStatus


@dataclass(frozen=True, slots=True)
class WorkerDeaths:
    """The worker processes that died, and the jobs that died with them."""

    workers: tuple[str, ...]
    """The dead workers, in the order they took the deliveries they lost."""
    lost_attempt_ids: tuple[int, ...]
    job_ids: tuple[int, ...]
    recovered_job_ids: tuple[int, ...]
    """Jobs completed since."""
    pending_job_ids: tuple[int, ...]
    """Jobs queued or running again: their recovery is under way."""
    buried_job_ids: tuple[int, ...]
    """Jobs in the dead letter queue."""


def worker_deaths(attempts: Iterable[Attempt], jobs: Mapping[int, Job]) -> WorkerDeaths | None:
    """The deaths in the attempt log (``None``: no worker died).

    Args:
        attempts: The attempt log.
        jobs: Jobs by id, to tell what became of the jobs that died with a worker.
    """
    lost = sorted((a for a in attempts if crashed(a)), key=lambda a: (a.started_at, a.id))
    if not lost:
        return None
    job_ids = sorted({a.job_id for a in lost})

    def having(*states: JobStatus) -> tuple[int, ...]:
        return tuple(i for i in job_ids if i in jobs and jobs[i].status in states)

    return WorkerDeaths(
        workers=tuple(dict.fromkeys(a.worker_id for a in lost)),
        lost_attempt_ids=tuple(sorted(a.id for a in lost)),
        job_ids=tuple(job_ids),
        recovered_job_ids=having(JobStatus.COMPLETED),
        pending_job_ids=having(JobStatus.QUEUED, JobStatus.RUNNING),
        buried_job_ids=having(JobStatus.DEAD),
    )


def _fate(deaths: WorkerDeaths) -> str:
    recovered, pending, buried = (
        deaths.recovered_job_ids,
        deaths.pending_job_ids,
        deaths.buried_job_ids,
    )
    if len(recovered) == len(deaths.job_ids):
        return f"all {len(recovered)} recovered"
    parts = [f"{len(recovered)} recovered"]
    if pending:
        parts.append(f"{len(pending)} queued or running again: job {ids(pending)}")
    if buried:
        parts.append(f"buried: job {ids(buried)}")
    return ", ".join(parts)


def death_findings(deaths: WorkerDeaths | None) -> list[Finding]:
    """One line for every worker death: a warning when a job was buried, else a hint."""
    if deaths is None:
        return []
    count = len(deaths.workers)
    noun = "worker process died" if count == 1 else "worker processes died"
    summary = (
        f"{count} {noun} without reporting back ({', '.join(deaths.workers[:10])}"
        f"{' and more' if count > 10 else ''}): {len(deaths.lost_attempt_ids)} deliveries of "
        f"{len(deaths.job_ids)} jobs died with them (jobs {ids(deaths.job_ids)}); "
        f"{_fate(deaths)}"
    )
    why = (
        "look at why the processes died (the OOM killer, a SIGKILL, a native crash, a deploy "
        "that does not stop workers gracefully)"
    )
    if deaths.buried_job_ids:
        advice = (
            "a job whose last allowed delivery dies with its worker is buried: once the cause "
            f"is known, replay it (jobguard dlq replay ID); {why}"
        )
    else:
        advice = f"their leases brought the jobs back to other workers; {why}"
    return [
        Finding(
            kind=Kind.WORKER_DEATHS,
            severity=Severity.WARNING if deaths.buried_job_ids else Severity.HINT,
            task=None,
            summary=summary,
            advice=advice,
            keys=Keys(
                job_ids=deaths.job_ids,
                other_job_ids=deaths.buried_job_ids,
                attempt_ids=deaths.lost_attempt_ids,
            ),
            numbers={
                "workers": count,
                "lost_deliveries": len(deaths.lost_attempt_ids),
                "jobs": len(deaths.job_ids),
                "recovered": len(deaths.recovered_job_ids),
                "pending": len(deaths.pending_job_ids),
                "buried": len(deaths.buried_job_ids),
            },
        )
    ]

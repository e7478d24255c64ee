"""The whole diagnosis: every check over one snapshot, and what counts as a problem."""

from __future__ import annotations

from dataclasses import dataclass

from jobguard.diagnostics.audit import Audit, audit
from jobguard.diagnostics.durations import Severity, TaskDurations, task_durations
from jobguard.diagnostics.overlaps import Overlap, find_overlaps
from jobguard.diagnostics.poison import ErrorGroup, repeated_errors
from jobguard.diagnostics.retries import TaskRetries, retry_rates
from jobguard.diagnostics.snapshot import Snapshot


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What ``jobguard doctor`` reports (R8.2-R8.5).

    Attributes:
        now: The store clock when the data was read.
        task: Only this task was looked at (``None``: every task).
        since: Only data active at or after this store time (``None``: all read).
        attempts: How many attempts were looked at.
        overlaps: R8.2, deliveries of one operation (or job) that ran at the same time.
        durations: R8.3, per task, the duration distribution against its timeouts, with advice.
        retries: R8.4, per task, retry rates and spikes.
        errors: R8.4, the errors that repeat most, with poison candidates.
        audit: R8.5, the traces completed operations left.
    """

    now: float
    task: str | None
    since: float | None
    attempts: int
    overlaps: tuple[Overlap, ...]
    durations: tuple[TaskDurations, ...]
    retries: tuple[TaskRetries, ...]
    errors: tuple[ErrorGroup, ...]
    audit: Audit

    @property
    def problems(self) -> list[str]:
        """What must be fixed: overlaps, and timeouts below the longest run. Empty if none.

        Warnings (a timeout near p99, retry spikes, poison candidates, audit findings) are
        reported in their sections but are not counted here.
        """
        found = [
            f"operation {o.key}: attempts {o.first.attempt_id} and {o.second.attempt_id} "
            f"overlapped for {_seconds(o.overlap_s)}"
            for o in self.overlaps
        ]
        found.extend(
            f"task {d.task}: {advice.message}"
            for d in self.durations
            for advice in d.advice
            if advice.severity == Severity.PROBLEM
        )
        return found

    @property
    def warnings(self) -> list[str]:
        """What deserves a look but is not counted as a problem."""
        found = [
            f"task {d.task}: {advice.message}"
            for d in self.durations
            for advice in d.advice
            if advice.severity != Severity.PROBLEM
        ]
        found.extend(
            f"task {r.task}: retry spike, {r.recent_retry_rate:.0%} of the last "
            f"{r.recent_runs} runs were retried"
            for r in self.retries
            if r.spike
        )
        found.extend(
            f"task {e.task}: poison candidate {e.error_type} at {e.where or '?'} "
            f"({e.max_per_job} times on one job)"
            for e in self.errors
            if e.poison
        )
        found.extend(
            f"job {job_id}: completed with an operation key but no completed operation record"
            for job_id in self.audit.missing_records
        )
        found.extend(
            f"operation {key}: stuck in processing with no queued or running job"
            for key in self.audit.stuck_processing
        )
        return found


def diagnose(snapshot: Snapshot) -> Diagnosis:
    """Run every check over ``snapshot`` (pure: no I/O)."""
    attempts = snapshot.attempts
    return Diagnosis(
        now=snapshot.now,
        task=snapshot.task,
        since=snapshot.since,
        attempts=len(attempts),
        overlaps=tuple(find_overlaps(attempts, snapshot.jobs, snapshot.now)),
        durations=tuple(task_durations(attempts, snapshot.jobs)),
        retries=tuple(retry_rates(attempts)),
        errors=tuple(repeated_errors(attempts)),
        audit=audit(
            snapshot.jobs_in_scope(),
            snapshot.jobs.values(),
            snapshot.operations,
            snapshot.now,
        ),
    )

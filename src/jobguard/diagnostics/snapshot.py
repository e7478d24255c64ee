"""What the diagnostics look at: recent attempts, the jobs behind them, their operation records.

This is the only module of the package that touches the store, and only through the ports
(:meth:`~jobguard.backends.base.AttemptPort.attempts`, ``find_jobs``, ``get_job`` and
``get_operation``); every check is a pure function over the :class:`Snapshot` it returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from jobguard.exceptions import ConfigurationError, NotFoundError
from jobguard.models import Attempt, Job, JobStatus, Operation

if TYPE_CHECKING:
    from jobguard.backends.base import Backend

DEFAULT_LIMIT = 5000


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent-enough read of the attempt log for one diagnosis.

    Attributes:
        now: The store clock when the snapshot was taken.
        attempts: The attempts in scope (task and time window applied), oldest first.
        jobs: Every job read, by id: those of the attempts, the newest ones, and every queued
            or running one (so "is anything still going to run this operation?" can be answered).
        operations: The operation record of every operation key in scope (``None``: no record).
        task: Only this task was looked at (``None``: every task).
        since: Only attempts and jobs active at or after this store time (``None``: all read).
    """

    now: float
    attempts: tuple[Attempt, ...]
    jobs: Mapping[int, Job] = field(default_factory=dict)
    operations: Mapping[str, Operation | None] = field(default_factory=dict)
    task: str | None = None
    since: float | None = None

    def job_in_scope(self, job: Job) -> bool:
        """Whether ``job`` is of the task looked at and was active inside the window."""
        if self.task is not None and job.task != self.task:
            return False
        if self.since is None or job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return True
        return max(job.created_at, job.finished_at or job.created_at) >= self.since

    def jobs_in_scope(self) -> list[Job]:
        """The jobs :meth:`job_in_scope` keeps, by id."""
        return [job for _, job in sorted(self.jobs.items()) if self.job_in_scope(job)]


def attempt_in_scope(attempt: Attempt, *, task: str | None, since: float | None) -> bool:
    """Whether an attempt is of ``task`` and was running at or after ``since``."""
    if task is not None and attempt.task != task:
        return False
    return since is None or attempt.ended_at is None or attempt.ended_at >= since


def measured(attempt: Attempt) -> Attempt:
    """``attempt`` with a duration that is no number of seconds (infinite, NaN, negative: a row
    this version did not write) taken as not measured, so no check computes with it."""
    duration = attempt.duration_s
    if duration is None or (math.isfinite(duration) and duration >= 0):
        return attempt
    return replace(attempt, duration_s=None)


def read_snapshot(
    backend: Backend,
    *,
    task: str | None = None,
    since_s: float | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Snapshot:
    """Read what the checks need through the store's ports.

    Args:
        backend: The store.
        task: Only this task.
        since_s: Only attempts and jobs active in the last ``since_s`` seconds (store clock).
        limit: At most this many recent attempts, and this many newest jobs, are read.

    Raises:
        ConfigurationError: ``limit`` below 1 or ``since_s`` not positive.
    """
    if limit < 1:
        raise ConfigurationError("limit must be >= 1")
    if since_s is not None and since_s <= 0:
        raise ConfigurationError("since_s must be > 0")
    now = backend.now()
    since = None if since_s is None else now - since_s
    attempts = tuple(
        measured(attempt)
        for attempt in backend.attempts(limit=limit)
        if attempt_in_scope(attempt, task=task, since=since)
    )
    jobs: dict[int, Job] = {}
    for status in (None, JobStatus.QUEUED, JobStatus.RUNNING):
        jobs.update((job.id, job) for job in backend.find_jobs(status=status, limit=limit))
    for job_id in sorted({attempt.job_id for attempt in attempts} - set(jobs)):
        try:
            jobs[job_id] = backend.get_job(job_id)
        except NotFoundError:
            continue  # purged since the attempt was read
    snapshot = Snapshot(now=now, attempts=attempts, jobs=jobs, task=task, since=since)
    keys = {job.operation_key for job in snapshot.jobs_in_scope()}
    keys.update(attempt.operation_key for attempt in attempts)
    operations = {key: backend.get_operation(key) for key in sorted(k for k in keys if k)}
    return Snapshot(
        now=now, attempts=attempts, jobs=jobs, operations=operations, task=task, since=since
    )

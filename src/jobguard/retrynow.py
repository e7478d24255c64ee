"""Retry-now: an operator makes a job that waits on its backoff due at once (#17).

The store only moves the row (a queued job whose run time is still ahead becomes due on the
store's clock); whether that applies, and what to tell the operator when it does not, is
decided here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobguard.core import checks
from jobguard.core.text import utc_text
from jobguard.exceptions import JobStateError
from jobguard.models import Job, JobStatus

if TYPE_CHECKING:
    from jobguard.app import App

ACTION = "retry-now"


def retry_now(app: App, job_id: int, actor: str) -> Job:
    """Make queued job ``job_id`` due now, audited under ``actor``; see :meth:`App.retry_now`."""
    job_id, actor = checks.job_id(job_id), checks.actor(actor)
    before = app.backend.get_job(job_id)  # NotFoundError names an unknown id
    moved = app.backend.retry_now(job_id)
    if moved is None:
        raise JobStateError(refusal(app.backend.get_job(job_id), app.backend.now()))
    app.backend.record_audit(
        actor, ACTION, f"job {job_id}", f"{moved.task}: was due {utc_text(before.run_at)} UTC"
    )
    return moved


def refusal(job: Job, now: float) -> str:
    """Why retry-now does not apply to ``job`` as it is now, and what would."""
    head = f"job {job.id} is {job.status}"
    if job.status == JobStatus.QUEUED:
        return f"{head} and already due (since {utc_text(job.run_at)} UTC); nothing to hurry"
    if job.status == JobStatus.RUNNING:
        return f"{head} (attempt {job.attempts}/{job.max_attempts}); it is not waiting to retry"
    if job.status == JobStatus.DEAD:
        return f"{head}: replay it from the dead letter queue (jobguard dlq replay {job.id})"
    if job.status == JobStatus.COMPLETED:
        return f"{head}; there is nothing to retry"
    return f"{head}; retry-now applies only to a queued job waiting for its run time"

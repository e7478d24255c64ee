"""The dead letter queue's operator actions: list, show, replay and purge, one or many (G8, #17).

Everything here goes through the app's backend; bulk actions run in batches of one transaction
each and write one audit entry per action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jobguard.core import checks
from jobguard.core.selection import DeadFilter, DeadPreview, ReplayReport
from jobguard.core.text import utc_text
from jobguard.exceptions import ConfigurationError, NotFoundError
from jobguard.models import DeadJob, Job, JobStatus

if TYPE_CHECKING:
    from jobguard.app import App


class DeadLetterQueue:
    """Jobs that will not be retried: fatal errors, spent attempts, poison (G8)."""

    def __init__(self, app: App) -> None:
        self._app = app

    def list(self, limit: int = 100) -> list[Job]:
        """Dead jobs, most recently buried first."""
        limit = checks.count("limit", limit)
        return self._app.backend.dead_jobs(limit)

    def show(self, job_id: int) -> DeadJob:
        """One dead job with its reason and every attempt's metadata."""
        job = self._app.get_job(job_id)
        if job.status != JobStatus.DEAD:
            raise NotFoundError(f"job {job_id} is {job.status}, not in the dead letter queue")
        return DeadJob(
            job=job,
            reason=job.dead_reason or "",
            attempts=self._app.backend.attempts(job_id=job_id),
        )

    def replay(self, job_id: int, *, actor: str | None = None) -> Job:
        """Queue a dead job again with the same id, arguments and keys (G8.3).

        Its operation key is kept, so work that completed is not redone (G8.3). With
        ``actor``, the replay is written to the audit trail under that name.
        """
        job_id = checks.job_id(job_id)
        actor = checks.optional_text("actor", actor)
        job = self._app.backend.replay(job_id)
        resend = self._app.host_replays.get(job.task)
        if resend is not None:
            # A guarded task of another queue: its host delivers it, so send it there again.
            resend(job)
        if actor is not None:
            self._app.backend.record_audit(actor, "replay", f"job {job_id}", job.task)
        return job

    def purge(self, job_id: int | None = None, *, actor: str | None = None) -> int:
        """Delete one dead job, or all of them, with their attempt rows; return how many.

        With ``actor``, the purge is written to the audit trail under that name.
        """
        job_id = None if job_id is None else checks.job_id(job_id)
        actor = checks.optional_text("actor", actor)
        purged = self._app.backend.purge(job_id)
        if actor is not None:
            target = "all dead jobs" if job_id is None else f"job {job_id}"
            self._app.backend.record_audit(actor, "purge", target, f"{purged} purged")
        return purged

    def count(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches (#17)."""
        return self._app.backend.count_dead(_selection(selection))

    def preview(self, selection: DeadFilter, rows: int = 10) -> DeadPreview:
        """What a bulk action on ``selection`` would touch now: the count, how many a replay
        would leave dead for their dedup key, and the first ``rows`` jobs (#17).

        Its :attr:`~DeadPreview.selection` carries the store time of the preview as its
        ``cutoff``: give that one to :meth:`replay_many` or :meth:`purge_many` so a job buried
        after the preview (not shown) is not touched.
        """
        selection = _selection(selection)
        rows = checks.count("rows", rows)
        # The clock first, then the reads: every job these count was buried before it, or is
        # excluded from the count and the action alike.
        stamped = replace(selection, cutoff=self._app.backend.now())
        return DeadPreview(
            selection=stamped,
            count=self._app.backend.count_dead(stamped),
            held=self._app.backend.count_dead_held(stamped),
            first=self._app.backend.select_dead(stamped, rows),
        )

    def select(self, selection: DeadFilter, limit: int = 10) -> Sequence[Job]:
        """The first ``limit`` dead jobs ``selection`` matches, in id order: what a bulk action
        would touch first (#17)."""
        limit = checks.count("limit", limit)
        return self._app.backend.select_dead(_selection(selection), limit)

    def replay_many(
        self, selection: DeadFilter, *, actor: str = "api", batch_size: int = 500
    ) -> ReplayReport:
        """Queue every dead job ``selection`` matches again, ``batch_size`` per transaction.

        Each job is replayed once even when another operator replays the same selection at the
        same time: a job the other one moved first is counted in ``gone``. A job whose dedup key
        a live job holds stays dead and is listed in ``held``; the rest go on. One audit entry
        (action ``replay-dead``) records the selection and the counts.

        Args:
            selection: Which dead jobs (:class:`DeadFilter`; ``DeadFilter()`` is all of them).
            actor: Who acts, for the audit trail.
            batch_size: Jobs per transaction.

        Returns:
            What was replayed, held back and already gone.
        """
        selection = _selection(selection)
        actor = checks.text("actor", actor)
        batch_size = checks.count("batch_size", batch_size)
        replayed: list[int] = []
        held: list[tuple[int, int]] = []
        gone = 0
        after = 0
        while True:
            batch = self._app.backend.replay_dead(selection, batch_size, after)
            self._resend_to_hosts(batch.replayed)
            replayed += batch.replayed
            held += batch.held
            gone += batch.gone
            if batch.last_id == after:
                break
            after = batch.last_id
        report = ReplayReport(replayed, held, gone)
        self._app.backend.record_audit(
            actor, "replay-dead", selection.describe(), report.summary() + _previewed(selection)
        )
        return report

    def _resend_to_hosts(self, job_ids: Sequence[int]) -> None:
        """Send replayed jobs of guarded tasks of another queue to their host again, as
        :meth:`replay` does for one."""
        if not self._app.host_replays:
            return
        for job_id in job_ids:
            job = self._app.get_job(job_id)
            resend = self._app.host_replays.get(job.task)
            if resend is not None:
                resend(job)

    def purge_many(
        self, selection: DeadFilter, *, actor: str = "api", batch_size: int = 500
    ) -> int:
        """Delete every dead job ``selection`` matches with its attempts; return how many.

        ``batch_size`` jobs per transaction; one audit entry (action ``purge-dead``) records the
        selection and the count.

        Args:
            selection: Which dead jobs (:class:`DeadFilter`; ``DeadFilter()`` is all of them).
            actor: Who acts, for the audit trail.
            batch_size: Jobs per transaction.
        """
        selection = _selection(selection)
        actor = checks.text("actor", actor)
        batch_size = checks.count("batch_size", batch_size)
        purged = 0
        after = 0
        while True:
            count, last = self._app.backend.purge_dead(selection, batch_size, after)
            purged += count
            if last == after:
                break
            after = last
        self._app.backend.record_audit(
            actor, "purge-dead", selection.describe(), f"{purged} purged{_previewed(selection)}"
        )
        return purged


def _previewed(selection: DeadFilter) -> str:
    """The audit detail's note of the preview an action was confirmed on, if any."""
    if selection.cutoff is None:
        return ""
    return f"; as previewed at {utc_text(selection.cutoff)} UTC"


def _selection(value: Any) -> DeadFilter:
    if not isinstance(value, DeadFilter):
        raise ConfigurationError(f"selection must be a DeadFilter, got {type(value).__name__}")
    return value

"""Dead jobs made to order for the bulk DLQ tests (#17): stored, then buried by SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from jobguard import App
from jobguard.models import DeadCode, JobSpec
from tests.support import stores

# 2026-01-01T00:00:00Z and one hour later: burial times the filters select on.
JAN_1 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
HOUR = 3600.0


@dataclass(frozen=True)
class Buried:
    """How one test job is buried."""

    task: str = "mail"
    queue: str = "default"
    code: DeadCode = DeadCode.EXHAUSTED
    at: float = JAN_1
    dedup_key: str | None = None


def bury(app: App, url: str, jobs: Sequence[Buried]) -> list[int]:
    """Store ``jobs`` and move them into the dead letter queue; their ids in order."""
    specs = [
        JobSpec(
            task=job.task,
            queue=job.queue,
            payload=f'{{"n": {n}}}',
            max_attempts=3,
            visibility_timeout_s=30.0,
            dedup_key=job.dedup_key,
        )
        for n, job in enumerate(jobs)
    ]
    stored = app.backend.enqueue_many(specs)
    table = stores.table(url, "jobs")
    stores.execute(
        url,
        [
            f"UPDATE {table} SET status = 'dead', dead_code = ?, dead_reason = 'buried by test', "
            "finished_at = ? WHERE id = ?"
        ],
        [(job.code.value, job.at, row.id) for job, row in zip(jobs, stored, strict=True)],
    )
    return [row.id for row in stored]


def replayed_in_audit(app: App) -> int:
    """Sum of the counts the bulk replay audit entries record ("N replayed, ...")."""
    return sum(
        int(entry.detail.split(" replayed")[0])
        for entry in app.audit_trail(1000)
        if entry.action == "replay-dead"
    )

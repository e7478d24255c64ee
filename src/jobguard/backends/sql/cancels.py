"""Cancelling a job on one SQL database: one statement, and its audit row, in one transaction.

A queued job (ready or scheduled for later) is buried at once, so no fetch leases it again. A
running one keeps running but carries the request: its worker reads it with each renewal and
tells the run to stop, and a later fetch of the job (its worker died, or its run ended without
learning it) buries it instead of running it.
"""

from __future__ import annotations

from jobguard.backends.sql import rows
from jobguard.backends.sql.driver import Driver, Tx
from jobguard.models import DeadCode, Job

CANCEL_ACTION = "cancel job"


class Cancels:
    """Cancel jobs over one driver."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def cancel(self, job_id: int, actor: str, reason: str) -> Job | None:
        """Bury a queued job, or ask a running one to stop, audited; ``None`` (nothing written)
        if no job ``job_id`` is queued or running."""

        def op(tx: Tx) -> Job | None:
            now = tx.now()
            params = {
                "job_id": job_id,
                "actor": actor,
                "reason": reason,
                "code": DeadCode.CANCELLED.value,
                "now": now,
            }
            row = tx.one("cancel_job", params)
            if row is None:
                return None
            job = rows.job(row)
            detail = f"was {'running: told to stop' if job.status == 'running' else 'queued'}"
            audit = {"actor": actor, "action": CANCEL_ACTION, "target": f"job {job_id}"}
            tx.run("insert_audit", {**audit, "detail": detail, "now": now})
            return job

        return self.driver.write(op)

"""Paused queues on one SQL database: the rows a fetch's ready-jobs query skips.

A pause is a row in ``paused_queues``. It takes effect when its transaction commits: every
fetch whose ready-jobs statement starts after that sees the row. A fetch that started before
it read its clock earlier still, so the pause's time is stamped in a second transaction after
the first committed: no job of the queue is leased after ``paused_at``. The audit row is
written with the stamp.
"""

from __future__ import annotations

from jobguard.backends.sql.driver import Driver, Tx
from jobguard.models import PausedQueue

PAUSE_ACTION = "pause queue"
RESUME_ACTION = "resume queue"


class Pauses:
    """Pause, resume and list queues over one driver."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def pause_queue(self, queue: str, actor: str) -> bool:
        """Pause ``queue`` (audited); ``False``, writing nothing, if it was paused already."""
        params = {"queue": queue, "actor": actor}

        def insert(tx: Tx) -> bool:
            return tx.one("pause_queue", {**params, "now": tx.now()}) is not None

        if not self.driver.write(insert):
            return False

        def stamp(tx: Tx) -> None:
            now = tx.now()
            tx.run("stamp_pause", {**params, "now": now})
            audit = {"actor": actor, "action": PAUSE_ACTION, "target": queue, "detail": ""}
            tx.run("insert_audit", {**audit, "now": now})

        self.driver.write(stamp)
        return True

    def resume_queue(self, queue: str, actor: str) -> bool:
        """Resume ``queue`` (audited) and wake its idle workers; ``False`` if it was not paused."""

        def delete(tx: Tx) -> bool:
            if tx.one("resume_queue", {"queue": queue}) is None:
                return False
            audit = {"actor": actor, "action": RESUME_ACTION, "target": queue, "detail": ""}
            tx.run("insert_audit", {**audit, "now": tx.now()})
            return True

        resumed = self.driver.write(delete)
        if resumed:
            # Idle workers sleep until an enqueue wakes them; a resume is as good as one.
            self.driver.jobs_added([queue])
        return resumed

    def paused_queues(self) -> list[PausedQueue]:
        """Every paused queue, by name."""
        found = self.driver.read(lambda tx: tx.all("paused_queues", {}))
        return [PausedQueue(r["queue"], float(r["paused_at"]), r["paused_by"]) for r in found]

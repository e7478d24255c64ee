"""Reads and operator writes on one SQL database: jobs, attempts, operator views, schedules.

Everything here is what a person or a scheduler asks of the store, not a delivery: reading jobs
and the attempt log, the dashboard's bounded views, moving dead jobs back (replay) or out
(purge, retention), the audit trail and the schedules' cursors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobguard.backends.sql import rows
from jobguard.backends.sql.driver import Driver, Row, Tx
from jobguard.backends.sql.leases import insert_job
from jobguard.core.selection import DeadFilter, ReplayBatch
from jobguard.exceptions import ConfigurationError, DuplicateJobError, NotFoundError
from jobguard.models import (
    Attempt,
    AuditEntry,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
    OutcomeCount,
    QueueStats,
    ScheduleState,
)


class Reads:
    """The read-mostly ports (jobs, attempts, operator views, schedules) over one driver."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def _read_all(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        return self.driver.read(lambda tx: tx.all(name, params))

    def get_job(self, job_id: int) -> Job:
        """One job by id."""
        found = self._read_all("job_by_id", {"id": job_id})
        if not found:
            raise NotFoundError(f"no job with id {job_id}")
        return rows.job(found[0])

    def count_jobs(self) -> dict[JobStatus, int]:
        """Jobs per state (every state present, zero if none)."""
        counts = dict.fromkeys(JobStatus, 0)
        for row in self._read_all("count_by_status", {}):
            counts[JobStatus(row["status"])] = int(row["n"])
        return counts

    def dead_jobs(self, limit: int = 100) -> list[Job]:
        """Jobs in the dead letter queue, most recently buried first."""
        return [rows.job(row) for row in self._read_all("dead_jobs", {"limit": limit})]

    def replay(self, job_id: int) -> Job:
        """Dead job back to the queue with the same id and keys."""

        def op(tx: Tx) -> Job:
            now = tx.now()
            row = tx.one("job_by_id_for_update", {"id": job_id})
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            if row["status"] != JobStatus.DEAD:
                raise NotFoundError(
                    f"job {job_id} is {row['status']}, not in the dead letter queue"
                )
            if row["dedup_key"] is not None:
                tx.run("lock_dedup_key", {"dedup_key": row["dedup_key"]})
                holder = tx.one("live_dedup_job", {"dedup_key": row["dedup_key"], "now": now})
                if holder is not None:
                    raise DuplicateJobError(
                        f"job {job_id} cannot be replayed: job {holder['id']} ({holder['status']}) "
                        f"holds its dedup key {row['dedup_key']!r}; replaying would run the same "
                        "work twice"
                    )
            replayed = tx.one("replay_job", {"job_id": job_id, "now": tx.statement_now()})
            assert replayed is not None  # the row was locked and dead
            return rows.job(replayed)

        job = self.driver.write(op)
        self.driver.jobs_added([job.queue])
        return job

    def retry_now(self, job_id: int) -> Job | None:
        """Make a queued job that waits for its run time eligible now, on the store's clock.

        Nothing else changes (attempts, limits, keys). ``None`` if the job is not queued with a
        run time still ahead; the caller says why.
        """

        def op(tx: Tx) -> Row | None:
            return tx.one("retry_now", {"job_id": job_id, "now": tx.statement_now()})

        moved = self.driver.write(op)
        if moved is None:
            return None
        job = rows.job(moved)
        # Idle workers sleep until an enqueue wakes them; a job due now is as good as one.
        self.driver.jobs_added([job.queue])
        return job

    def prune_completed(self, older_than_s: float, batch_size: int = 1000) -> int:
        """Delete completed jobs finished over ``older_than_s`` ago, with their attempt rows.

        One short transaction per ``batch_size`` jobs, so workers are never held up for long.
        """
        if not older_than_s >= 0 or batch_size < 1:
            raise ConfigurationError("older_than_s must be >= 0 and batch_size >= 1")

        def op(tx: Tx) -> int:
            now = tx.now()
            params = {"cutoff": now - older_than_s, "now": now, "limit": batch_size}
            ids = [row["id"] for row in tx.all("prunable_jobs", params)]
            if not ids:
                return 0
            tx.run("prune_attempts", {"ids": ids})
            return tx.run("prune_jobs", {"ids": ids})

        pruned = 0
        while batch := self.driver.write(op):
            pruned += batch
        return pruned

    def purge(self, job_id: int | None = None) -> int:
        """Delete dead jobs (one, or all) and their attempts."""

        def op(tx: Tx) -> int:
            tx.run("purge_attempts", {"job_id": job_id})
            return tx.run("purge_jobs", {"job_id": job_id})

        return self.driver.write(op)

    # -- bulk DLQ actions (#17): one transaction per batch, in id order ----------------------

    def count_dead(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches."""
        found = self._read_all("count_dead_selection", _selection_params(selection))
        return int(found[0]["n"])

    def count_dead_held(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches that a replay would leave dead: a live job,
        or an earlier job of the selection (replayed first), holds their dedup key."""
        params = _selection_params(selection)

        def op(tx: Tx) -> int:
            found = tx.all("count_dead_held", {**params, "now": tx.now()})
            return int(found[0]["n"])

        return self.driver.read(op)

    def select_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> list[Job]:
        """The first ``limit`` dead jobs ``selection`` matches with ids above ``after_id``."""
        params = {**_selection_params(selection), "after_id": after_id, "limit": limit}
        return [rows.job(row) for row in self._read_all("dead_selection", params)]

    def replay_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> ReplayBatch:
        """Replay up to ``limit`` matching dead jobs with ids above ``after_id`` (one transaction).

        Each job's UPDATE moves it only if it is still dead, so a job another operator replayed
        (or purged) first is counted as gone, never replayed twice; a job whose dedup key a live
        job holds stays dead and is reported with its holder.
        """

        def op(tx: Tx) -> tuple[ReplayBatch, list[str]]:
            now = tx.now()
            params = {**_selection_params(selection), "after_id": after_id, "limit": limit}
            found = tx.all("dead_selection", params)
            replayed: list[int] = []
            held: list[tuple[int, int]] = []
            queues: set[str] = set()
            for row in found:
                if row["dedup_key"] is not None:
                    tx.run("lock_dedup_key", {"dedup_key": row["dedup_key"]})
                    holder = tx.one("live_dedup_job", {"dedup_key": row["dedup_key"], "now": now})
                    if holder is not None:
                        held.append((int(row["id"]), int(holder["id"])))
                        continue
                moved = tx.one("replay_job", {"job_id": row["id"], "now": tx.statement_now()})
                if moved is not None:
                    replayed.append(int(moved["id"]))
                    queues.add(str(moved["queue"]))
            last_id = int(found[-1]["id"]) if found else after_id
            gone = len(found) - len(replayed) - len(held)
            return ReplayBatch(replayed, held, gone, last_id), sorted(queues)

        batch, queues = self.driver.write(op)
        if queues:
            self.driver.jobs_added(queues)
        return batch

    def purge_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> tuple[int, int]:
        """Delete up to ``limit`` matching dead jobs above ``after_id`` with their attempts.

        One transaction; returns ``(purged, last id looked at)``. A job that left the DLQ
        meanwhile is not deleted.
        """

        def op(tx: Tx) -> tuple[int, int]:
            params = {**_selection_params(selection), "after_id": after_id, "limit": limit}
            ids = [int(row["id"]) for row in tx.all("dead_selection", params)]
            if not ids:
                return 0, after_id
            tx.run("purge_dead_attempts", {"ids": ids})
            return tx.run("purge_dead_jobs", {"ids": ids}), ids[-1]

        return self.driver.write(op)

    # -- attempt port ---------------------------------------------------------------------------

    def attempts(
        self,
        *,
        job_id: int | None = None,
        operation_key: str | None = None,
        limit: int = 1000,
    ) -> list[Attempt]:
        """Attempts of a job or an operation in order, else the most recent ``limit``."""
        if job_id is not None:
            found = self._read_all("attempts_of_job", {"job_id": job_id})
        elif operation_key is not None:
            found = self._read_all("attempts_of_operation", {"operation_key": operation_key})
        else:
            found = list(reversed(self._read_all("recent_attempts", {"limit": limit})))
        return [rows.attempt(row) for row in found]

    # -- inspect port (operator views) ----------------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        """Per queue: backlog, running and dead counts, oldest ready and running, paused (four
        reads)."""

        def op(tx: Tx) -> list[QueueStats]:
            found: dict[str, dict[str, Any]] = {}
            now = tx.now()
            for query in ("queue_backlog", "queue_running", "queue_dead"):
                for row in tx.all(query, {"now": now}):
                    values = found.setdefault(row["queue"], {})
                    for name in _QUEUE_FIELDS.get(query, ()):
                        values[name] = row[name]
            for row in tx.all("paused_queues", {}):
                found.setdefault(row["queue"], {})["paused"] = True
            return [rows.queue_stats(queue, values) for queue, values in sorted(found.items())]

        return self.driver.read(op)

    def find_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        """Newest first, every filter given applied."""
        params = {
            "status": status.value if status else None,
            "queue": queue,
            "task": task,
            "limit": limit,
            "offset": offset,
        }
        return [rows.job(row) for row in self._read_all("find_jobs", params)]

    def outcome_timeline(self, since: float, bucket_s: float, window: int) -> list[OutcomeCount]:
        """Recent attempts per time bucket and outcome."""
        params = {"since": since, "bucket_s": bucket_s, "window": window}
        return [
            OutcomeCount(
                since + row["bucket"] * bucket_s, Outcome.stored(row["outcome"]), int(row["n"])
            )
            for row in self._read_all("outcome_timeline", params)
        ]

    def record_audit(self, actor: str, action: str, target: str, detail: str) -> None:
        """Append one operator action."""
        params = {"actor": actor, "action": action, "target": target, "detail": detail}
        self.driver.write(lambda tx: tx.run("insert_audit", {**params, "now": tx.now()}))

    def audit_trail(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent operator actions, newest first."""
        return [rows.audit_entry(row) for row in self._read_all("audit_trail", {"limit": limit})]

    # -- schedule port --------------------------------------------------------------------------

    def schedule_states(self) -> list[ScheduleState]:
        """Every schedule's cursor and newest enqueued tick, by name."""
        return [rows.schedule_state(row) for row in self._read_all("schedule_states", {})]

    def advance_schedule(
        self,
        name: str,
        expected: int | None,
        cursor: int,
        ticks: Sequence[tuple[int, JobSpec]],
    ) -> list[Job] | None:
        """Compare-and-set the cursor and enqueue the ticks' jobs, in one transaction."""

        def op(tx: Tx) -> list[Job] | None:
            now = tx.now()
            params = {"name": name, "cursor": cursor, "expected": expected, "now": now}
            query = "insert_schedule" if expected is None else "advance_schedule"
            if tx.run(query, params) != 1:
                return None  # another scheduler decided first; nothing is written
            jobs = [insert_job(tx, spec, now) for _, spec in ticks]
            if ticks:
                tx.run(
                    "record_schedule_job",
                    {"name": name, "tick": ticks[-1][0], "job_id": jobs[-1].id},
                )
            return jobs

        jobs = self.driver.write(op)
        added = sorted({job.queue for job in jobs or () if not job.deduplicated})
        if added:
            self.driver.jobs_added(added)
        return jobs


# Which columns of each per-queue read feed QueueStats.
_QUEUE_FIELDS = {
    "queue_backlog": ("ready", "scheduled", "oldest_ready_at"),
    "queue_running": ("running", "oldest_running_since", "shortest_lease_s"),
    "queue_dead": ("dead",),
}


def _selection_params(selection: DeadFilter) -> dict[str, Any]:
    """The named parameters of the dead-selection queries."""
    return {
        "task": selection.task,
        "queue": selection.queue,
        "code": selection.code.value if selection.code else None,
        "since": selection.since,
        "until": selection.buried_before,
    }

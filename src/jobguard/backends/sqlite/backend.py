"""The embedded SQLite backend: every port in one database file (the default store).

Queue, locks, operations and attempts share one database, so "finish" (operation completed + job
acked + attempt closed + lock released) is one transaction. Several processes on one host may
share the file; the host clock is the store clock (all processes read the same one).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from jobguard.backends._sql import load_queries
from jobguard.backends.base import (
    BeginRequest,
    Begun,
    Closing,
    ErrorInfo,
    FinishRequest,
    Renewal,
    RenewalResult,
)
from jobguard.backends.sqlite import rows
from jobguard.backends.sqlite.connection import (
    ProcessLocal,
    SQLiteOptions,
    UserCodeError,
    migrate,
    open_connection,
)
from jobguard.exceptions import (
    ConfigurationError,
    DuplicateJobError,
    GuardLost,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    StoreUnavailableError,
)
from jobguard.models import (
    Attempt,
    Delivery,
    Guard,
    Job,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    OperationStatus,
    Outcome,
)

T = TypeVar("T")

Q = load_queries("jobguard.backends.sqlite")


def _deny_transaction_control(action: int, *_: str | None) -> int:
    """SQLite authorizer for user code inside a db_step: no BEGIN/COMMIT/ROLLBACK/SAVEPOINT."""
    if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _stale_fence(lock: LockGrant, newest: int) -> StaleFenceError:
    return StaleFenceError(
        f"resource {lock.resource!r}: fence {lock.fence} is stale "
        f"(fence {newest} was granted since)"
    )


class StepConnection:
    """What ``ctx.db_step`` hands to user code: ``execute`` inside the step's transaction.

    ``commit``, ``rollback`` and ``executescript`` are deliberately absent: the step record and the
    business writes must commit together (invariant 10), so the transaction is not the caller's.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        """Run one statement in the step's transaction."""
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any) -> sqlite3.Cursor:
        """Run one statement for each parameter set, in the step's transaction."""
        return self._conn.executemany(sql, seq_of_parameters)


class SQLiteBackend:
    """All four ports on one SQLite file. Safe to share between threads and forked processes."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._options = SQLiteOptions(path, synchronous, busy_timeout_s)
        self._clock = clock
        conn = open_connection(self._options)
        try:
            migrate(conn)
        finally:
            conn.close()
        self._local = ProcessLocal(self._options)

    # -- plumbing -------------------------------------------------------------------------------

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._local.committer().run(fn)

    def _read(self, sql: str, params: dict[str, Any]) -> list[sqlite3.Row]:
        try:
            return self._local.reader().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite read failed: {exc}") from exc

    def close(self) -> None:
        """Close this process's connections."""
        self._local.close()

    def now(self) -> float:
        """The store clock."""
        return self._clock()

    @staticmethod
    def _check_fence(conn: sqlite3.Connection, guard: Guard) -> None:
        """Refuse a write whose lock grant is no longer the newest for its resource.

        Unlike :meth:`_verify`, the lease is left to the write's own ``WHERE lease_token``, so
        an unlocked job pays no extra query on the hot path (finish).
        """
        if guard.lock is None:
            return
        row = conn.execute(Q["lock_row"], {"resource": guard.lock.resource}).fetchone()
        if row is not None and row["fence"] > guard.lock.fence:
            raise _stale_fence(guard.lock, row["fence"])

    def _close_attempt(
        self,
        conn: sqlite3.Connection,
        guard: Guard,
        closing: Closing,
        outcome: Outcome,
        error: ErrorInfo | None,
        now: float,
    ) -> None:
        conn.execute(
            Q["close_attempt"],
            {
                "attempt_id": guard.attempt_id,
                "outcome": outcome.value,
                "now": now,
                "duration_s": closing.duration_s,
                "error_type": error.type if error else None,
                "error_message": error.message if error else None,
                "traceback": error.traceback if error else None,
                "lock_owner": guard.lock.owner if guard.lock else None,
                "fence": guard.lock.fence if guard.lock else None,
                "steps_run": closing.steps_run,
                "steps_skipped": closing.steps_skipped,
            },
        )

    @staticmethod
    def _release_claim(
        conn: sqlite3.Connection,
        guard: Guard,
        key: str | None,
        status: OperationStatus,
        error: str | None,
        now: float,
    ) -> None:
        if key is None:
            return
        conn.execute(
            Q["fail_operation"],
            {
                "key": key,
                "owner_lease": guard.lease_token,
                "status": status.value,
                "last_error": error,
                "now": now,
            },
        )

    @staticmethod
    def _drop_lock(conn: sqlite3.Connection, guard: Guard) -> None:
        if guard.lock is not None:
            conn.execute(
                Q["release_lock"], {"resource": guard.lock.resource, "owner": guard.lock.owner}
            )

    def _transition(self, conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> None:
        if conn.execute(Q[query], params).rowcount != 1:
            raise LeaseLostError(f"job {params['job_id']}: lease is stale; {query} refused")

    # -- queue port -----------------------------------------------------------------------------

    def _insert(self, conn: sqlite3.Connection, spec: JobSpec, now: float) -> Job:
        if spec.dedup_key is not None:
            existing = conn.execute(
                Q["live_dedup_job"], {"dedup_key": spec.dedup_key, "now": now}
            ).fetchone()
            if existing is not None:
                conn.execute(Q["count_dedup_hit"], {"id": existing["id"]})
                return rows.job(existing, deduplicated=True)
        row = conn.execute(
            Q["insert_job"],
            {
                "task": spec.task,
                "queue": spec.queue,
                "payload": spec.payload,
                "priority": spec.priority,
                "run_at": now + spec.delay_s,
                "max_attempts": spec.max_attempts,
                "visibility_timeout_s": spec.visibility_timeout_s,
                "operation_key": spec.operation_key,
                "resource_key": spec.resource_key,
                "lock_ttl_s": spec.lock_ttl_s,
                "dedup_key": spec.dedup_key,
                "dedup_window_s": spec.dedup_window_s,
                "now": now,
            },
        ).fetchone()
        return rows.job(row)

    def enqueue(self, spec: JobSpec) -> Job:
        """Store a job or return the live holder of its dedup key (one transaction)."""
        return self._write(lambda conn: self._insert(conn, spec, self._clock()))

    def enqueue_many(self, specs: Sequence[JobSpec]) -> list[Job]:
        """Store many jobs in one transaction (each deduplicated as by :meth:`enqueue`)."""

        def op(conn: sqlite3.Connection) -> list[Job]:
            now = self._clock()
            return [self._insert(conn, spec, now) for spec in specs]

        return self._write(op)

    def fetch(self, queues: Sequence[str], limit: int, worker_id: str) -> list[Delivery]:
        """Lease up to ``limit`` ready jobs (one transaction); see :class:`QueuePort`."""
        # Idle polling must not queue up behind writers: look first, on the read connection.
        now = self._clock()
        if not any(self._read(Q["any_ready"], {"queue": queue, "now": now}) for queue in queues):
            return []

        def op(conn: sqlite3.Connection) -> list[Delivery]:
            now = self._clock()
            picked: list[sqlite3.Row] = []
            for queue in queues:
                if len(picked) >= limit:
                    break
                picked.extend(
                    conn.execute(
                        Q["ready_jobs"], {"queue": queue, "now": now, "limit": limit - len(picked)}
                    ).fetchall()
                )
            if not picked:
                return []
            expired = [row for row in picked if row["status"] == JobStatus.RUNNING]
            spent = {row["id"] for row in expired if row["attempts"] >= row["max_attempts"]}
            if expired:
                tokens = [row["lease_token"] for row in expired]
                conn.execute(Q["close_lost_attempts"], {"tokens": json.dumps(tokens), "now": now})
            if spent:
                conn.execute(Q["bury_exhausted"], {"ids": json.dumps(sorted(spent)), "now": now})
            order = [row["id"] for row in picked if row["id"] not in spent]
            if not order:
                return []
            ids = json.dumps(order)
            leased = {
                row["id"]: row
                for row in conn.execute(
                    Q["lease_jobs"], {"ids": ids, "worker_id": worker_id, "now": now}
                ).fetchall()
            }
            attempt_ids = {
                row["job_id"]: row["id"]
                for row in conn.execute(Q["insert_attempts"], {"ids": ids, "now": now}).fetchall()
            }
            return [rows.delivery(leased[job_id], attempt_ids[job_id]) for job_id in order]

        return self._write(op)

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        """Extend every lease and lock still ours, in one transaction."""

        def op(conn: sqlite3.Connection) -> list[RenewalResult]:
            now = self._clock()
            results: list[RenewalResult] = []
            for item in renewals:
                lease_ok = (
                    conn.execute(
                        Q["extend_lease"],
                        {
                            "job_id": item.guard.job_id,
                            "lease_token": item.guard.lease_token,
                            "visibility_timeout_s": item.visibility_timeout_s,
                            "now": now,
                        },
                    ).rowcount
                    == 1
                )
                lock_ok = True
                lock = item.guard.lock
                if lock is not None and item.lock_ttl_s is not None:
                    lock_ok = (
                        conn.execute(
                            Q["renew_lock"],
                            {
                                "resource": lock.resource,
                                "owner": lock.owner,
                                "expires_at": now + item.lock_ttl_s,
                            },
                        ).rowcount
                        == 1
                    )
                results.append(RenewalResult(lease_ok=lease_ok, lock_ok=lock_ok))
            return results

        return self._write(op)

    def _finish_one(self, conn: sqlite3.Connection, request: FinishRequest, now: float) -> None:
        guard = request.guard
        params = {"job_id": guard.job_id, "lease_token": guard.lease_token, "now": now}
        self._transition(conn, "finish_job", params)
        self._check_fence(conn, guard)
        if request.operation_key is not None and request.outcome == Outcome.COMPLETED:
            completed = conn.execute(
                Q["complete_operation"],
                {
                    "key": request.operation_key,
                    "owner_lease": guard.lease_token,
                    "result": request.result_json,
                    "external_ref": request.external_ref,
                    "fence": guard.lock.fence if guard.lock else None,
                    "now": now,
                },
            ).rowcount
            if completed != 1:
                raise LeaseLostError(
                    f"operation {request.operation_key!r}: claim lost; not completed"
                )
        self._close_attempt(conn, guard, request.closing, request.outcome, None, now)
        self._drop_lock(conn, guard)

    def finish(
        self,
        guard: Guard,
        closing: Closing,
        *,
        outcome: Outcome = Outcome.COMPLETED,
        operation_key: str | None = None,
        result_json: str | None = None,
        external_ref: str | None = None,
    ) -> None:
        """Operation completed + job acked + attempt closed + lock released, one transaction."""
        request = FinishRequest(guard, closing, outcome, operation_key, result_json, external_ref)
        self._write(lambda conn: self._finish_one(conn, request, self._clock()))

    def finish_many(self, requests: Sequence[FinishRequest]) -> list[GuardLost | None]:
        """:meth:`finish` for many deliveries in one transaction, each all-or-nothing."""

        def op(conn: sqlite3.Connection) -> list[GuardLost | None]:
            now = self._clock()
            refused: list[GuardLost | None] = []
            for request in requests:
                conn.execute("SAVEPOINT finish_one")
                try:
                    self._finish_one(conn, request, now)
                    refused.append(None)
                except GuardLost as exc:
                    conn.execute("ROLLBACK TO finish_one")
                    refused.append(exc)
                conn.execute("RELEASE finish_one")
            return refused

        return self._write(op)

    def _settle(
        self,
        guard: Guard,
        closing: Closing,
        *,
        query: str,
        outcome: Outcome,
        delay_s: float = 0.0,
        reason: str | None = None,
        error: ErrorInfo | None = None,
        claim_key: str | None = None,
        claim_status: OperationStatus = OperationStatus.PROCESSING,
    ) -> None:
        """End a delivery: move the job, drop the operation claim, close the attempt, unlock."""

        def op(conn: sqlite3.Connection) -> None:
            now = self._clock()
            last_error = f"{error.type}: {error.message}" if error else None
            self._transition(
                conn,
                query,
                {
                    "job_id": guard.job_id,
                    "lease_token": guard.lease_token,
                    "now": now,
                    "run_at": now + delay_s,
                    "reason": reason,
                    "last_error": last_error,
                    "error_signature": error.signature if error else None,
                    "same_error_count": error.same_count if error else 0,
                },
            )
            note = reason or last_error
            self._release_claim(conn, guard, claim_key, claim_status, note, now)
            self._close_attempt(conn, guard, closing, outcome, error, now)
            self._drop_lock(conn, guard)

        self._write(op)

    def retry(
        self,
        guard: Guard,
        closing: Closing,
        *,
        delay_s: float,
        error: ErrorInfo,
        operation_key: str | None = None,
    ) -> None:
        """Requeue after ``delay_s`` with the error recorded (one transaction)."""
        self._settle(
            guard,
            closing,
            query="retry_job",
            outcome=Outcome.RETRY,
            delay_s=delay_s,
            error=error,
            claim_key=operation_key,
        )

    def defer(self, guard: Guard, closing: Closing, *, delay_s: float, reason: str) -> None:
        """Requeue after ``delay_s`` without charging the attempt (one transaction)."""
        busy = ErrorInfo(type="ResourceBusy", message=reason)
        self._settle(
            guard, closing, query="defer_job", outcome=Outcome.DEFERRED, delay_s=delay_s, error=busy
        )

    def bury(
        self,
        guard: Guard,
        closing: Closing,
        *,
        reason: str,
        error: ErrorInfo | None,
        operation_key: str | None = None,
    ) -> None:
        """Move the job to the dead letter queue; fail its operation (one transaction)."""
        self._settle(
            guard,
            closing,
            query="bury_job",
            outcome=Outcome.DEAD,
            reason=reason,
            error=error,
            claim_key=operation_key,
            claim_status=OperationStatus.FAILED,
        )

    def release(self, guards: Sequence[Guard]) -> int:
        """Hand leases back without charging attempts; skip stale ones (one transaction)."""

        def op(conn: sqlite3.Connection) -> int:
            now = self._clock()
            released = 0
            for guard in guards:
                params = {"job_id": guard.job_id, "lease_token": guard.lease_token, "now": now}
                if conn.execute(Q["release_job"], params).rowcount != 1:
                    continue
                released += 1
                conn.execute(
                    Q["fail_operation_by_lease"], {"owner_lease": guard.lease_token, "now": now}
                )
                self._close_attempt(conn, guard, Closing(0.0), Outcome.RELEASED, None, now)
                self._drop_lock(conn, guard)
            return released

        return self._write(op)

    def record_refusal(
        self, guard: Guard, outcome: Outcome, closing: Closing, message: str
    ) -> None:
        """Mark the stale delivery's attempt row as refused (metadata only)."""

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                Q["mark_attempt"],
                {
                    "attempt_id": guard.attempt_id,
                    "outcome": outcome.value,
                    "now": self._clock(),
                    "duration_s": closing.duration_s,
                    "error_type": "LeaseLostError"
                    if outcome == Outcome.LEASE_REFUSED
                    else "StaleFenceError",
                    "error_message": message,
                    "steps_run": closing.steps_run,
                    "steps_skipped": closing.steps_skipped,
                },
            )

        self._write(op)

    def get_job(self, job_id: int) -> Job:
        """One job by id."""
        found = self._read(Q["job_by_id"], {"id": job_id})
        if not found:
            raise NotFoundError(f"no job with id {job_id}")
        return rows.job(found[0])

    def list_jobs(self, status: JobStatus | None = None, limit: int = 100) -> list[Job]:
        """Newest first, optionally filtered by status."""
        params = {"status": status.value if status else None, "limit": limit}
        return [rows.job(row) for row in self._read(Q["jobs_by_status"], params)]

    def count_jobs(self) -> dict[JobStatus, int]:
        """Jobs per state (every state present, zero if none)."""
        counts = dict.fromkeys(JobStatus, 0)
        for row in self._read(Q["count_by_status"], {}):
            counts[JobStatus(row["status"])] = row["n"]
        return counts

    def dead_jobs(self, limit: int = 100) -> list[Job]:
        """Jobs in the dead letter queue, most recently buried first."""
        return [rows.job(row) for row in self._read(Q["dead_jobs"], {"limit": limit})]

    def replay(self, job_id: int) -> Job:
        """Dead job back to the queue with the same id and keys."""

        def op(conn: sqlite3.Connection) -> Job:
            now = self._clock()
            row = conn.execute(Q["job_by_id"], {"id": job_id}).fetchone()
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            if row["status"] != JobStatus.DEAD:
                raise NotFoundError(
                    f"job {job_id} is {row['status']}, not in the dead letter queue"
                )
            if row["dedup_key"] is not None:
                holder = conn.execute(
                    Q["live_dedup_job"], {"dedup_key": row["dedup_key"], "now": now}
                ).fetchone()
                if holder is not None:
                    raise DuplicateJobError(
                        f"job {job_id} cannot be replayed: job {holder['id']} ({holder['status']}) "
                        f"holds its dedup key {row['dedup_key']!r}; replaying would run the same "
                        "work twice"
                    )
            conn.execute(Q["replay_job"], {"job_id": job_id, "now": now})
            return rows.job(conn.execute(Q["job_by_id"], {"id": job_id}).fetchone())

        return self._write(op)

    def prune_completed(self, older_than_s: float, batch_size: int = 1000) -> int:
        """Delete completed jobs finished over ``older_than_s`` ago, with their attempt rows.

        One short transaction per ``batch_size`` jobs, so workers are never held up for long.
        """
        if older_than_s < 0 or batch_size < 1:
            raise ConfigurationError("older_than_s must be >= 0 and batch_size >= 1")

        def op(conn: sqlite3.Connection) -> int:
            now = self._clock()
            params = {"cutoff": now - older_than_s, "now": now, "limit": batch_size}
            ids = [row["id"] for row in conn.execute(Q["prunable_jobs"], params)]
            if not ids:
                return 0
            conn.execute(Q["prune_attempts"], {"ids": json.dumps(ids)})
            return int(conn.execute(Q["prune_jobs"], {"ids": json.dumps(ids)}).rowcount)

        pruned = 0
        while batch := self._write(op):
            pruned += batch
        return pruned

    def purge(self, job_id: int | None = None) -> int:
        """Delete dead jobs (one, or all) and their attempts."""

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(Q["purge_attempts"], {"job_id": job_id})
            return int(conn.execute(Q["purge_jobs"], {"job_id": job_id}).rowcount)

        return self._write(op)

    def bury_queued(self, job_id: int, reason: str) -> None:
        """Dead-letter a queued job that can never run."""

        def op(conn: sqlite3.Connection) -> None:
            params = {"job_id": job_id, "reason": reason, "now": self._clock()}
            conn.execute(Q["bury_queued"], params)

        self._write(op)

    # -- lock port ------------------------------------------------------------------------------

    def _grant(
        self,
        conn: sqlite3.Connection,
        resource: str,
        owner: str,
        ttl_s: float,
        attempt_id: int | None,
        now: float,
    ) -> LockGrant | None:
        row = conn.execute(
            Q["grant_lock"],
            {"resource": resource, "owner": owner, "expires_at": now + ttl_s, "now": now},
        ).fetchone()
        if row is None:
            return None
        if attempt_id is not None:
            conn.execute(
                Q["attempt_lock"],
                {"attempt_id": attempt_id, "lock_owner": owner, "fence": row["fence"]},
            )
        return LockGrant(resource=resource, owner=owner, fence=row["fence"], expires_at=now + ttl_s)

    def acquire_lock(
        self, resource: str, owner: str, ttl_s: float, *, attempt_id: int | None = None
    ) -> LockGrant | None:
        """Grant the lock if free or expired, with the next fence (one transaction)."""
        return self._write(
            lambda conn: self._grant(conn, resource, owner, ttl_s, attempt_id, self._clock())
        )

    def renew_lock(self, grant: LockGrant, ttl_s: float) -> bool:
        """Extend the lock if ``grant.owner`` still owns it."""

        def op(conn: sqlite3.Connection) -> bool:
            params = {
                "resource": grant.resource,
                "owner": grant.owner,
                "expires_at": self._clock() + ttl_s,
            }
            return bool(conn.execute(Q["renew_lock"], params).rowcount == 1)

        return self._write(op)

    def release_lock(self, grant: LockGrant) -> bool:
        """Free the lock if ``grant.owner`` still owns it."""

        def op(conn: sqlite3.Connection) -> bool:
            params = {"resource": grant.resource, "owner": grant.owner}
            return bool(conn.execute(Q["release_lock"], params).rowcount == 1)

        return self._write(op)

    def lock_fence(self, resource: str) -> int:
        """The last fence issued for ``resource`` (0 if never locked)."""
        found = self._read(Q["lock_row"], {"resource": resource})
        return int(found[0]["fence"]) if found else 0

    # -- operation port -------------------------------------------------------------------------

    def _claim(
        self,
        conn: sqlite3.Connection,
        guard: Guard,
        key: str,
        resource_key: str | None,
        now: float,
    ) -> Operation | None:
        fence = guard.lock.fence if guard.lock else None
        row = conn.execute(Q["operation_row"], {"key": key}).fetchone()
        # Insert and claim return the row as written: no second read of it.
        if row is None:
            row = conn.execute(
                Q["insert_operation"],
                {
                    "key": key,
                    "resource_key": resource_key,
                    "owner_lease": guard.lease_token,
                    "fence": fence,
                    "now": now,
                },
            ).fetchone()
        elif row["status"] != OperationStatus.COMPLETED:
            holder = row["owner_lease"]
            if holder and holder != guard.lease_token:
                alive = conn.execute(
                    Q["operation_by_lease_holder"], {"owner_lease": holder, "now": now}
                ).fetchone()
                if alive is not None:
                    return None
            row = conn.execute(
                Q["claim_operation"],
                {"key": key, "owner_lease": guard.lease_token, "fence": fence, "now": now},
            ).fetchone()
        steps = conn.execute(Q["steps_of_operation"], {"key": key}).fetchall()
        return rows.operation(row, steps)

    def begin_operation(self, guard: Guard, key: str, resource_key: str | None) -> Operation | None:
        """Get-or-create and claim the operation record (one transaction)."""

        def op(conn: sqlite3.Connection) -> Operation | None:
            self._verify(conn, guard, None)
            return self._claim(conn, guard, key, resource_key, self._clock())

        return self._write(op)

    def _begin_one(
        self, conn: sqlite3.Connection, guard: Guard, request: BeginRequest, now: float
    ) -> Begun:
        self._verify(conn, guard, None)
        current = guard
        if request.resource_key is not None:
            grant = self._grant(
                conn,
                request.resource_key,
                request.lock_owner,
                request.lock_ttl_s,
                guard.attempt_id,
                now,
            )
            if grant is None:
                return Begun(busy=f"resource is busy: {request.resource_key}")
            current = replace(guard, lock=grant)
        if request.operation_key is None:
            return Begun(grant=current.lock)
        operation = self._claim(conn, current, request.operation_key, request.resource_key, now)
        if operation is None:
            self._drop_lock(conn, current)
            # The attempt row must not name a lock this delivery gave straight back.
            params = {"attempt_id": guard.attempt_id, "lock_owner": None, "fence": None}
            conn.execute(Q["attempt_lock"], params)
            return Begun(busy=f"operation {request.operation_key!r} is in progress")
        return Begun(grant=current.lock, operation=operation)

    def begin(self, guard: Guard, request: BeginRequest) -> Begun:
        """Lock the resource and claim the operation together (one transaction)."""
        return self._write(lambda conn: self._begin_one(conn, guard, request, self._clock()))

    def begin_many(self, items: Sequence[tuple[Guard, BeginRequest]]) -> list[Begun | None]:
        """:meth:`begin` for many deliveries in one transaction; ``None`` for a stale lease."""

        def op(conn: sqlite3.Connection) -> list[Begun | None]:
            now = self._clock()
            results: list[Begun | None] = []
            for guard, request in items:
                conn.execute("SAVEPOINT begin_one")
                try:
                    results.append(self._begin_one(conn, guard, request, now))
                except LeaseLostError:
                    conn.execute("ROLLBACK TO begin_one")
                    results.append(None)
                conn.execute("RELEASE begin_one")
            return results

        return self._write(op)

    @staticmethod
    def _verify(conn: sqlite3.Connection, guard: Guard, claim_key: str | None) -> None:
        """Refuse a write whose lease is stale, whose fence is old, or (with ``claim_key``)
        whose delivery no longer holds the operation's claim."""
        state = conn.execute(
            Q["guard_state"],
            {
                "job_id": guard.job_id,
                "lease_token": guard.lease_token,
                "resource": guard.lock.resource if guard.lock else None,
                "key": claim_key,
            },
        ).fetchone()
        if state["lease_ok"] is None:
            raise LeaseLostError(f"job {guard.job_id}: lease {guard.lease_token[:8]} is stale")
        if (
            guard.lock is not None
            and state["fence"] is not None
            and state["fence"] > guard.lock.fence
        ):
            raise _stale_fence(guard.lock, state["fence"])
        if claim_key is not None and state["claim_ok"] is None:
            raise LeaseLostError(f"operation {claim_key!r} is no longer claimed by this delivery")

    def _insert_step(
        self, conn: sqlite3.Connection, guard: Guard, key: str, name: str, result_json: str
    ) -> None:
        params = {
            "key": key,
            "name": name,
            "result": result_json,
            "fence": guard.lock.fence if guard.lock else None,
            "now": self._clock(),
        }
        conn.execute(Q["insert_step"], params)

    def put_step(self, guard: Guard, key: str, name: str, result_json: str) -> None:
        """Record a completed step (one transaction, guarded)."""

        def op(conn: sqlite3.Connection) -> None:
            self._verify(conn, guard, key)
            self._insert_step(conn, guard, key, name, result_json)

        self._write(op)

    def db_step(
        self, guard: Guard, key: str, name: str, fn: Callable[..., T], args: Sequence[Any]
    ) -> tuple[bool, Any]:
        """Run ``fn(conn, *args)`` and record the step, both in one transaction."""

        def op(conn: sqlite3.Connection) -> tuple[bool, Any]:
            self._verify(conn, guard, key)
            stored = conn.execute(Q["step_row"], {"key": key, "name": name}).fetchone()
            if stored is not None:
                return False, json.loads(stored["result"])
            try:
                # fn must not end the step's transaction (COMMIT, ROLLBACK, RELEASE): its rows
                # would then commit without the step record (invariant 10).
                conn.set_authorizer(_deny_transaction_control)
                try:
                    value = fn(StepConnection(conn), *args)
                finally:
                    conn.set_authorizer(None)
                result_json = json.dumps(value)
            except Exception as exc:
                raise UserCodeError(exc) from exc
            self._insert_step(conn, guard, key, name, result_json)
            return True, value

        return self._write(op)

    def get_operation(self, key: str) -> Operation | None:
        """The operation record with its steps, or ``None``."""
        found = self._read(Q["operation_row"], {"key": key})
        if not found:
            return None
        return rows.operation(found[0], self._read(Q["steps_of_operation"], {"key": key}))

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
            found = self._read(Q["attempts_of_job"], {"job_id": job_id})
        elif operation_key is not None:
            found = self._read(Q["attempts_of_operation"], {"operation_key": operation_key})
        else:
            found = list(reversed(self._read(Q["recent_attempts"], {"limit": limit})))
        return [rows.attempt(row) for row in found]

"""Every port on one SQL database, written once: the guard's order of writes.

Queue, locks, operations and attempts share one database, so "finish" (operation completed + job
acked + attempt closed + lock released) is one transaction, and so is ``db_step`` (the user's
rows + the step record). What differs between databases (connections, transactions, the clock,
the SQL text) is the :class:`~jobguard.backends.sql.driver.Driver`'s; each statement is named
and lives in the driver's ``queries.sql``. Decisions (retry or bury, reason codes) are made above
the port and arrive here as facts; sentences come from :mod:`jobguard.core.messages`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from jobguard.backends.base import (
    BeginRequest,
    Begun,
    Closing,
    DeliveryRules,
    ErrorInfo,
    FinishRequest,
    HostAdmission,
    Prepared,
    Renewal,
    RenewalResult,
)
from jobguard.backends.sql import rows
from jobguard.backends.sql.driver import Driver, Row, Tx, UserCodeError
from jobguard.core import messages
from jobguard.core.hosts import Admit, Found, admission
from jobguard.exceptions import (
    ConfigurationError,
    DuplicateJobError,
    GuardLost,
    JobGuardError,
    NotFoundError,
    StoreUnavailableError,
)
from jobguard.models import (
    Attempt,
    AuditEntry,
    BusyReason,
    DeadCode,
    Delivery,
    Guard,
    Job,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    OperationStatus,
    Outcome,
    OutcomeCount,
    QueueStats,
    ScheduleState,
)

T = TypeVar("T")


class _RedoCarefully(Exception):
    """A batch item failed after it wrote: roll the batch back and run it with savepoints."""


def _fence_of(guard: Guard) -> int | None:
    return guard.lock.fence if guard.lock else None


def _claim_of(request: FinishRequest) -> str | None:
    """The operation a finish completes (only a completed outcome completes one)."""
    return request.operation_key if request.outcome == Outcome.COMPLETED else None


class SQLStore:
    """All four ports over one :class:`Driver`; safe to share between threads.

    Args:
        driver: The database's driver.
    """

    transactional_steps = True

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.url = driver.url
        # Whether the next fetch will likely find work (the last one did, or an enqueue woke
        # us): then it skips the read-only look. A hint, never a decision.
        self._expect_work = False

    def close(self) -> None:
        """Close this process's connections."""
        self.driver.close()

    def now(self) -> float:
        """The store clock."""
        return self.driver.now()

    def check_usable(self) -> None:
        """Raise :class:`~jobguard.exceptions.StoreBrokenError` if the store is no longer usable
        (see the driver's check)."""
        self.driver.check_usable()

    # -- guards ---------------------------------------------------------------------------------

    @staticmethod
    def _verify(tx: Tx, guard: Guard, claim_key: str | None, step: str | None = None) -> Row:
        """Refuse a write whose lease is stale, whose fence is old, or (with ``claim_key``)
        whose delivery no longer holds the operation's claim. Returns the state read, with the
        stored result of ``step`` (if given and already recorded) in ``step_result``."""
        state = tx.one(
            "guard_state",
            {
                "job_id": guard.job_id,
                "lease_token": guard.lease_token,
                "resource": guard.lock.resource if guard.lock else None,
                "key": claim_key,
                "step": step,
            },
        )
        assert state is not None  # a SELECT of sub-queries always returns its one row
        if state["lease_ok"] is None:
            raise messages.stale_lease(guard.job_id, guard.lease_token)
        newest = state["fence"]
        if guard.lock is not None and newest is not None and newest > guard.lock.fence:
            raise messages.stale_fence(guard.lock.resource, guard.lock.fence, newest)
        if claim_key is not None and state["claim_ok"] is None:
            raise messages.claim_lost(claim_key)
        return state

    @staticmethod
    def _transition(tx: Tx, query: str, params: dict[str, Any]) -> None:
        if tx.run(query, params) != 1:
            raise messages.stale_lease(params["job_id"], params["lease_token"], query)

    @staticmethod
    def _close_attempt(
        tx: Tx,
        guard: Guard,
        closing: Closing,
        outcome: Outcome,
        error: ErrorInfo | None,
        now: float,
    ) -> None:
        tx.run(
            "close_attempt",
            {
                "attempt_id": guard.attempt_id,
                "outcome": outcome.value,
                "now": now,
                "duration_s": closing.duration_s,
                "error_type": error.type if error else None,
                "error_message": error.message if error else None,
                "traceback": error.traceback if error else None,
                "lock_owner": guard.lock.owner if guard.lock else None,
                "fence": _fence_of(guard),
                "steps_run": closing.steps_run,
                "steps_skipped": closing.steps_skipped,
            },
        )

    @staticmethod
    def _drop_lock(tx: Tx, guard: Guard) -> None:
        if guard.lock is not None:
            tx.run("release_lock", {"resource": guard.lock.resource, "owner": guard.lock.owner})

    # -- queue port -----------------------------------------------------------------------------

    @staticmethod
    def _insert(tx: Tx, spec: JobSpec, now: float) -> Job:
        if spec.dedup_key is not None:
            # Serialises enqueues of one key where writers run in parallel (PostgreSQL).
            tx.run("lock_dedup_key", {"dedup_key": spec.dedup_key})
            existing = tx.one("live_dedup_job", {"dedup_key": spec.dedup_key, "now": now})
            if existing is not None:
                tx.run("count_dedup_hit", {"id": existing["id"]})
                return rows.job(existing, deduplicated=True)
        return rows.job(SQLStore._insert_row(tx, spec, now))

    @staticmethod
    def _insert_row(tx: Tx, spec: JobSpec, now: float) -> Row:
        row = tx.one(
            "insert_job",
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
                "headers": spec.headers,
                "now": now,
            },
        )
        assert row is not None  # INSERT ... RETURNING
        return row

    def enqueue(self, spec: JobSpec, *, connection: Any = None) -> Job:
        """Store a job or return the live holder of its dedup key (one transaction)."""
        return self.enqueue_many([spec], connection=connection)[0]

    def enqueue_many(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store jobs in one transaction (each deduplicated); see :class:`QueuePort`."""

        def op(tx: Tx) -> list[Job]:
            now = tx.now()
            return [self._insert(tx, spec, now) for spec in specs]

        if connection is not None:
            # The caller's transaction: its commit wakes workers (PostgreSQL) or they poll.
            return op(self.driver.adopt(connection))
        jobs = self.driver.write(op)
        added = sorted({job.queue for job in jobs if not job.deduplicated})
        if added:
            self.driver.jobs_added(added)
        return jobs

    def admit_host_delivery(
        self, spec: JobSpec, worker_id: str, rules: DeliveryRules, host_delivery: str
    ) -> HostAdmission:
        """Admit a host queue's delivery against its shadow job; see :class:`QueuePort`."""
        if spec.dedup_key is None:
            raise ConfigurationError("a host delivery is admitted by its shadow job's key")
        task_rules = {spec.task: rules}

        def op(tx: Tx) -> HostAdmission:
            now = tx.now()
            tx.run("lock_dedup_key", {"dedup_key": spec.dedup_key})
            row = tx.one("host_job", {"dedup_key": spec.dedup_key})
            found = None if row is None else Found(JobStatus(row["status"]), row["available_at"])
            decided = admission(found, now)
            if decided.admit in (Admit.HELD, Admit.EARLY, Admit.DEAD):
                assert row is not None
                return HostAdmission(decided.admit, row["id"], wait_s=decided.wait_s)
            if decided.admit == Admit.INSERT:
                row = self._insert_row(tx, spec, now)
            assert row is not None
            if self._close_expired(tx, [row], task_rules, now):
                return HostAdmission(Admit.DEAD, row["id"])
            delivery = self._lease(tx, [row], task_rules, worker_id, now)[0]
            tx.run("attempt_host_delivery", {"id": delivery.attempt_id, "host": host_delivery})
            return HostAdmission(decided.admit, row["id"], delivery)

        return self.driver.write(op)

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> None:
        """Block until an enqueue may have added work, or ``timeout_s`` passed."""
        if self.driver.wait_for_jobs(queues, timeout_s):
            self._expect_work = True  # woken by an enqueue: the look before fetching is moot

    def fetch_prepared(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules] | None = None,
        begin: Callable[[Delivery], BeginRequest | None] | None = None,
    ) -> list[Prepared]:
        """Lease ready jobs and begin them (lock + claim) in the same transaction.

        See :class:`QueuePort`. Tried first without savepoints; if one item's begin fails
        unexpectedly, the whole fetch is rolled back and run again with a savepoint per begin,
        where that item is left unbegun (its delivery begins on its own later).
        """
        task_rules = rules or {}

        # Idle polling must not queue up behind writers: look first, on a read connection.
        # While jobs keep coming the look is a wasted round trip.
        def ready(tx: Tx) -> bool:
            return tx.one("any_ready", {"queues": list(queues), "now": tx.now()}) is not None

        if not self._expect_work and not self.driver.read(ready):
            return []

        def op(tx: Tx, careful: bool) -> list[Prepared]:
            now = tx.now()
            picked: list[Row] = []
            for queue in queues:
                if len(picked) >= limit:
                    break
                params = {"queue": queue, "now": now, "limit": limit - len(picked)}
                picked.extend(tx.all("ready_jobs", params))
            spent = self._close_expired(tx, picked, task_rules, now)
            live = [row for row in picked if row["id"] not in spent]
            if not live:
                return []
            deliveries = self._lease(tx, live, task_rules, worker_id, now)
            if begin is None:
                return [Prepared(delivery) for delivery in deliveries]
            return self._begin_fetched(tx, deliveries, begin, now, careful=careful)

        try:
            prepared = self.driver.write(lambda tx: op(tx, False))
        except _RedoCarefully:
            prepared = self.driver.write(lambda tx: op(tx, True))
        self._expect_work = bool(prepared)
        return prepared

    @staticmethod
    def _request_of(
        begin: Callable[[Delivery], BeginRequest | None], delivery: Delivery, careful: bool
    ) -> BeginRequest | None:
        try:
            return begin(delivery)
        except Exception as exc:
            if not careful:
                raise _RedoCarefully() from exc
            return None  # its handler's own begin meets the same error, as that job's

    def _begin_fetched(
        self,
        tx: Tx,
        deliveries: Sequence[Delivery],
        begin: Callable[[Delivery], BeginRequest | None],
        now: float,
        *,
        careful: bool,
    ) -> list[Prepared]:
        """Begin deliveries leased in this transaction, one by one in :func:`_lock_order`, or
        as a set (a few statements for the batch) when no two of them ask for the same
        resource or operation, so that none depends on what another got; ``careful``-ly, each
        in a savepoint."""
        requests = [self._request_of(begin, delivery, careful) for delivery in deliveries]
        wanted = [index for index, request in enumerate(requests) if request is not None]
        order = sorted(wanted, key=lambda i: _lock_order(requests[i]))
        guards = [Guard(d.job_id, d.lease_token, d.attempt_id) for d in deliveries]
        begun: list[Begun | None] = [None] * len(deliveries)
        if not careful:
            try:
                if _independent([requests[index] for index in order]):
                    self._begin_set(tx, guards, requests, order, begun, now)
                else:
                    for index in order:
                        request = requests[index]
                        assert request is not None
                        begun[index] = self._begin_one(tx, guards[index], request, now, leased=True)
            except Exception as exc:
                raise _RedoCarefully() from exc
        else:
            for index in order:
                request = requests[index]
                assert request is not None
                try:
                    with tx.savepoint():
                        begun[index] = self._begin_one(tx, guards[index], request, now, leased=True)
                except Exception:
                    begun[index] = None  # begun again, on its own, when its handler starts
        return [
            Prepared(delivery, request, result)
            for delivery, request, result in zip(deliveries, requests, begun, strict=True)
        ]

    def _begin_set(
        self,
        tx: Tx,
        guards: list[Guard],
        requests: Sequence[BeginRequest | None],
        order: Sequence[int],
        begun: list[Begun | None],
        now: float,
    ) -> None:
        """:meth:`_begin_one` for a batch of fresh deliveries that ask for distinct resources
        and operations: one statement grants every lock, one records the grants on the
        attempts, one inserts every new operation; only operations already recorded are
        claimed one at a time. Fills ``guards`` (grants) and ``begun``."""
        wanted = {index: request for index in order if (request := requests[index]) is not None}
        self._grant_set(tx, guards, wanted, begun, now)
        claiming = {
            request.operation_key: index
            for index, request in wanted.items()
            if begun[index] is None and request.operation_key is not None
        }
        inserted: dict[str, Row] = {}
        if claiming:
            items = [
                {
                    "key": key,
                    "resource_key": wanted[index].resource_key,
                    "owner_lease": guards[index].lease_token,
                    "fence": _fence_of(guards[index]),
                }
                for key, index in claiming.items()
            ]
            found = tx.all("insert_operations", {"items": items, "now": now})
            inserted = {row["key"]: row for row in found}
        for index, request in wanted.items():
            key, guard = request.operation_key, guards[index]
            if begun[index] is not None:
                continue
            if key is None:
                begun[index] = Begun(grant=guard.lock)
            elif key in inserted:
                begun[index] = Begun(grant=guard.lock, operation=rows.operation(inserted[key], []))
            else:  # recorded already: claimed, or busy with a live delivery's claim
                begun[index] = self._claim_or_busy(tx, guard, request, now)

    @staticmethod
    def _grant_set(
        tx: Tx,
        guards: list[Guard],
        wanted: Mapping[int, BeginRequest],
        begun: list[Begun | None],
        now: float,
    ) -> None:
        """Every lock of the batch in one statement; the ones not granted are busy."""
        asking = {
            request.resource_key: index
            for index, request in wanted.items()
            if request.resource_key is not None
        }
        if not asking:
            return
        items = [
            {
                "resource": resource,
                "owner": wanted[index].lock_owner,
                "expires_at": now + wanted[index].lock_ttl_s,
            }
            for resource, index in asking.items()
        ]
        granted = tx.all("grant_locks", {"items": items, "now": now})
        fences = {row["resource"]: row["fence"] for row in granted}
        marks = []
        for resource, index in asking.items():
            if resource not in fences:
                begun[index] = Begun(busy=BusyReason.LOCK)
                continue
            request = wanted[index]
            expires_at = now + request.lock_ttl_s
            grant = LockGrant(resource, request.lock_owner, fences[resource], expires_at)
            guards[index] = replace(guards[index], lock=grant)
            marks.append(
                {
                    "attempt_id": guards[index].attempt_id,
                    "lock_owner": grant.owner,
                    "fence": grant.fence,
                }
            )
        if marks:
            tx.run("attempt_locks", {"items": marks})

    @staticmethod
    def _close_expired(
        tx: Tx, picked: Sequence[Row], rules: Mapping[str, DeliveryRules], now: float
    ) -> set[int]:
        """Close the attempts of expired leases as lost; bury the jobs whose attempts are spent.

        Returns the ids of the buried jobs (they are not leased again).
        """
        expired = [row for row in picked if row["status"] == JobStatus.RUNNING]
        if not expired:
            return set()
        tokens = [row["lease_token"] for row in expired]
        tx.run("close_lost_attempts", {"tokens": tokens, "now": now})
        spent = set()
        for row in expired:
            rule = rules.get(row["task"])
            if row["attempts"] >= (rule.max_attempts if rule else row["max_attempts"]):
                spent.add(row["id"])
        if spent:
            params = {"ids": sorted(spent), "code": DeadCode.LOST.value, "now": now}
            tx.run("bury_lost", params)
        return spent

    @staticmethod
    def _lease(
        tx: Tx,
        picked: Sequence[Row],
        rules: Mapping[str, DeliveryRules],
        worker_id: str,
        now: float,
    ) -> list[Delivery]:
        """New leases for ``picked`` (one statement per lease length), each with an attempt row."""
        by_lease: dict[float | None, list[int]] = {}
        for row in picked:
            rule = rules.get(row["task"])
            by_lease.setdefault(rule.visibility_timeout_s if rule else None, []).append(row["id"])
        leased: dict[int, Row] = {}
        for lease_s, ids in by_lease.items():
            params = {"ids": ids, "worker_id": worker_id, "lease_s": lease_s, "now": now}
            leased.update((row["id"], row) for row in tx.all("lease_jobs", params))
        order = [row["id"] for row in picked]
        attempt_ids = {
            row["job_id"]: row["id"]
            for row in tx.all("insert_attempts", {"ids": order, "now": now})
        }
        return [rows.delivery(leased[job_id], attempt_ids[job_id]) for job_id in order]

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        """Extend every lease and lock still ours, in one transaction."""

        def op(tx: Tx) -> list[RenewalResult]:
            now = tx.now()
            results: list[RenewalResult] = []
            for item in renewals:
                lease_ok = (
                    tx.run(
                        "extend_lease",
                        {
                            "job_id": item.guard.job_id,
                            "lease_token": item.guard.lease_token,
                            "visibility_timeout_s": item.visibility_timeout_s,
                            "now": now,
                        },
                    )
                    == 1
                )
                lock_ok = True
                lock = item.guard.lock
                if lock is not None and item.lock_ttl_s is not None:
                    params = {
                        "resource": lock.resource,
                        "owner": lock.owner,
                        "expires_at": now + item.lock_ttl_s,
                    }
                    lock_ok = tx.run("renew_lock", params) == 1
                results.append(RenewalResult(lease_ok=lease_ok, lock_ok=lock_ok))
            return results

        return self.driver.write(op)

    def finish_many(self, requests: Sequence[FinishRequest]) -> list[JobGuardError | None]:
        """Ack many deliveries in one transaction, each all-or-nothing on its own.

        First as a set (a few statements for the whole batch, each item's refusals found before
        it writes); if that fails (a row the driver cannot store, or a claim taken in between),
        the transaction is rolled back and the batch runs again one item at a time, each in its
        own savepoint.
        """
        try:
            return self.driver.write(lambda tx: self._finish_batch(tx, requests, careful=False))
        except _RedoCarefully:
            return self.driver.write(lambda tx: self._finish_batch(tx, requests, careful=True))

    def _finish_batch(
        self, tx: Tx, requests: Sequence[FinishRequest], *, careful: bool
    ) -> list[JobGuardError | None]:
        now = tx.now()
        if not careful:
            try:
                return self._finish_set(tx, requests, now)
            except _RedoCarefully:
                raise
            except Exception as exc:  # a row the driver cannot store, say: find which, alone
                raise _RedoCarefully() from exc
        # Carefully: the same statements, one item at a time, each in a savepoint.
        refused: list[JobGuardError | None] = []
        for request in requests:
            try:
                with tx.savepoint():
                    (refusal,) = self._finish_set(tx, [request], now)
                refused.append(refusal)
            except _RedoCarefully:  # its claim was taken between its proof and its write
                refused.append(messages.claim_lost(_claim_of(request) or ""))
            except StoreUnavailableError as exc:
                refused.append(exc)
            except Exception as exc:
                # One job's unstorable row (text the driver cannot encode, say) must not
                # fail the acks of the others: its own finish is left to its lease.
                job = request.guard.job_id
                failed = StoreUnavailableError(f"job {job}: its finish could not be stored: {exc}")
                failed.__cause__ = exc
                refused.append(failed)
        return refused

    def _finish_set(
        self, tx: Tx, requests: Sequence[FinishRequest], now: float
    ) -> list[JobGuardError | None]:
        """Every finish of the batch in four statements: jobs finished where every proof holds,
        then their locks released, operations completed and attempts closed."""
        if len({request.guard.job_id for request in requests}) < len(requests):
            # Two deliveries of one job (a stale lease and the current one): what finish_jobs
            # returns (job ids) cannot tell them apart, so the careful path takes them in turn.
            raise _RedoCarefully()
        claims = [_claim_of(request) for request in requests]
        items = [
            {
                "job_id": request.guard.job_id,
                "lease_token": request.guard.lease_token,
                "resource": request.guard.lock.resource if request.guard.lock else None,
                "fence": _fence_of(request.guard),
                "key": claim,
            }
            for request, claim in zip(requests, claims, strict=True)
        ]
        done = {row["id"] for row in tx.all("finish_jobs", {"items": items, "now": now})}
        refused: list[JobGuardError | None] = []
        for request, claim in zip(requests, claims, strict=True):
            refused.append(
                None if request.guard.job_id in done else self._refusal(tx, request, claim)
            )
        finished = [
            (request, claim)
            for request, claim, no in zip(requests, claims, refused, strict=True)
            if no is None
        ]
        # Lock rows before operation rows, as a fetch's begin takes them: two workers, one
        # finishing and one beginning, never wait for each other in opposite orders.
        releasing = [
            {"resource": request.guard.lock.resource, "owner": request.guard.lock.owner}
            for request, _ in finished
            if request.guard.lock is not None
        ]
        if releasing:
            tx.run("release_locks", {"items": releasing})
        completing = [
            {
                "key": claim,
                "owner_lease": request.guard.lease_token,
                "result": request.result_json,
                "external_ref": request.external_ref,
                "fence": _fence_of(request.guard),
            }
            for request, claim in finished
            if claim is not None
        ]
        if completing and tx.run("complete_operations", {"items": completing, "now": now}) != len(
            completing
        ):
            raise _RedoCarefully()  # proven by finish_jobs a moment ago: a claim taken since
        closing = [
            {
                "attempt_id": request.guard.attempt_id,
                "outcome": request.outcome.value,
                "duration_s": request.closing.duration_s,
                "lock_owner": request.guard.lock.owner if request.guard.lock else None,
                "fence": _fence_of(request.guard),
                "steps_run": request.closing.steps_run,
                "steps_skipped": request.closing.steps_skipped,
            }
            for request, _ in finished
        ]
        if closing:
            tx.run("close_attempts", {"items": closing, "now": now})
        return refused

    def _refusal(self, tx: Tx, request: FinishRequest, claim: str | None) -> GuardLost:
        """Why a finish changed no row: which of its proofs failed."""
        guard = request.guard
        try:
            self._verify(tx, guard, claim)
        except GuardLost as exc:
            return exc
        # Every proof holds now: the lease moved on and back in between (it cannot, but say so).
        return messages.stale_lease(guard.job_id, guard.lease_token, "finish")

    def _settle(
        self,
        guard: Guard,
        closing: Closing,
        *,
        query: str,
        outcome: Outcome,
        delay_s: float = 0.0,
        code: DeadCode | None = None,
        reason: str | None = None,
        error: ErrorInfo | None = None,
        claim_key: str | None = None,
        claim_status: OperationStatus = OperationStatus.PROCESSING,
    ) -> None:
        """End a delivery: move the job, drop the operation claim, close the attempt, unlock."""

        def op(tx: Tx) -> None:
            now = tx.now()
            last_error = f"{error.type}: {error.message}" if error else None
            self._transition(
                tx,
                query,
                {
                    "job_id": guard.job_id,
                    "lease_token": guard.lease_token,
                    "now": now,
                    "run_at": now + delay_s,
                    "code": code.value if code else None,
                    "reason": reason,
                    "last_error": last_error,
                    "error_signature": error.signature if error else None,
                    "same_error_count": error.same_count if error else 0,
                },
            )
            self._drop_lock(tx, guard)  # lock rows before operation rows (see _finish_set)
            if claim_key is not None:
                tx.run(
                    "fail_operation",
                    {
                        "key": claim_key,
                        "owner_lease": guard.lease_token,
                        "status": claim_status.value,
                        "last_error": reason or last_error,
                        "now": now,
                    },
                )
            self._close_attempt(tx, guard, closing, outcome, error, now)

        self.driver.write(op)

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
        code: DeadCode,
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
            code=code,
            reason=reason,
            error=error,
            claim_key=operation_key,
            claim_status=OperationStatus.FAILED,
        )

    def release(self, guards: Sequence[Guard]) -> int:
        """Hand leases back without charging attempts; skip stale ones (one transaction)."""

        def op(tx: Tx) -> int:
            now = tx.now()
            released = 0
            for guard in guards:
                params = {"job_id": guard.job_id, "lease_token": guard.lease_token, "now": now}
                if tx.run("release_job", params) != 1:
                    continue
                released += 1
                self._drop_lock(tx, guard)  # lock rows before operation rows (see _finish_set)
                tx.run("unclaim_operation", {"owner_lease": guard.lease_token, "now": now})
                self._close_attempt(tx, guard, Closing(0.0), Outcome.RELEASED, None, now)
            return released

        return self.driver.write(op)

    def record_refusal(
        self, guard: Guard, outcome: Outcome, closing: Closing, message: str
    ) -> None:
        """Mark the stale delivery's attempt row as refused (metadata only)."""

        def op(tx: Tx) -> None:
            tx.run(
                "mark_attempt",
                {
                    "attempt_id": guard.attempt_id,
                    "outcome": outcome.value,
                    "now": tx.now(),
                    "duration_s": closing.duration_s,
                    "error_type": "LeaseLostError"
                    if outcome == Outcome.LEASE_REFUSED
                    else "StaleFenceError",
                    "error_message": message,
                    "steps_run": closing.steps_run,
                    "steps_skipped": closing.steps_skipped,
                },
            )

        self.driver.write(op)

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
            replayed = tx.one("replay_job", {"job_id": job_id, "now": now})
            assert replayed is not None  # the row was locked and dead
            return rows.job(replayed)

        job = self.driver.write(op)
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

    # -- lock port ------------------------------------------------------------------------------

    @staticmethod
    def _grant(
        tx: Tx,
        resource: str,
        owner: str,
        ttl_s: float,
        attempt_id: int | None,
        now: float,
    ) -> LockGrant | None:
        expires_at = now + ttl_s
        params = {"resource": resource, "owner": owner, "expires_at": expires_at, "now": now}
        row = tx.one("grant_lock", params)
        if row is None:
            return None
        if attempt_id is not None:
            params = {"attempt_id": attempt_id, "lock_owner": owner, "fence": row["fence"]}
            tx.run("attempt_lock", params)
        return LockGrant(resource=resource, owner=owner, fence=row["fence"], expires_at=expires_at)

    def acquire_lock(
        self, resource: str, owner: str, ttl_s: float, *, attempt_id: int | None = None
    ) -> LockGrant | None:
        """Grant the lock if free or expired, with the next fence (one transaction)."""
        return self.driver.write(
            lambda tx: self._grant(tx, resource, owner, ttl_s, attempt_id, tx.now())
        )

    def renew_lock(self, grant: LockGrant, ttl_s: float) -> bool:
        """Extend the lock if ``grant.owner`` still owns it."""

        def op(tx: Tx) -> bool:
            params = {
                "resource": grant.resource,
                "owner": grant.owner,
                "expires_at": tx.now() + ttl_s,
            }
            return tx.run("renew_lock", params) == 1

        return self.driver.write(op)

    def release_lock(self, grant: LockGrant) -> bool:
        """Free the lock if ``grant.owner`` still owns it."""

        def op(tx: Tx) -> bool:
            return tx.run("release_lock", {"resource": grant.resource, "owner": grant.owner}) == 1

        return self.driver.write(op)

    def lock_fence(self, resource: str) -> int:
        """The last fence issued for ``resource`` (0 if never locked)."""
        found = self._read_all("lock_row", {"resource": resource})
        return int(found[0]["fence"]) if found else 0

    # -- operation port -------------------------------------------------------------------------

    @staticmethod
    def _claim(
        tx: Tx, guard: Guard, key: str, resource_key: str | None, now: float
    ) -> Operation | None:
        """Get-or-create the record and claim it; ``None`` if a live delivery holds it."""
        fence = _fence_of(guard)
        params = {
            "key": key,
            "resource_key": resource_key,
            "owner_lease": guard.lease_token,
            "fence": fence,
            "now": now,
        }
        # Most operations are new: insert first (returning the row as written, no second read
        # of it); a key already recorded is read and locked instead.
        row = tx.one("insert_operation", params)
        if row is not None:
            return rows.operation(row, [])
        row = tx.one("operation_row_for_update", {"key": key})
        assert row is not None  # it exists: the insert found it (or waited for its commit)
        if row["status"] != OperationStatus.COMPLETED:
            holder = row["owner_lease"]
            if holder and holder != guard.lease_token:
                alive = tx.one("lease_holder_alive", {"owner_lease": holder, "now": now})
                if alive is not None:
                    return None
            params = {"key": key, "owner_lease": guard.lease_token, "fence": fence, "now": now}
            row = tx.one("claim_operation", params)
            assert row is not None  # the row is locked and not completed
        steps = tx.all("steps_of_operation", {"key": key})
        return rows.operation(row, steps)

    def _begin_one(
        self, tx: Tx, guard: Guard, request: BeginRequest, now: float, *, leased: bool = False
    ) -> Begun:
        """``leased``: the lease was taken in this same transaction, so it needs no proof."""
        if not leased:
            self._verify(tx, guard, None)
        current = guard
        held = guard.lock is not None and guard.lock.resource == request.resource_key
        if request.resource_key is not None and not held:
            grant = self._grant(
                tx,
                request.resource_key,
                request.lock_owner,
                request.lock_ttl_s,
                guard.attempt_id,
                now,
            )
            if grant is None:
                return Begun(busy=BusyReason.LOCK)
            current = replace(guard, lock=grant)
        if request.operation_key is None:
            return Begun(grant=current.lock)
        return self._claim_or_busy(tx, current, request, now)

    def _claim_or_busy(self, tx: Tx, guard: Guard, request: BeginRequest, now: float) -> Begun:
        """Claim the operation for a delivery that holds what it locked; busy if a live
        delivery holds the claim, in which case its lock is given straight back."""
        assert request.operation_key is not None
        operation = self._claim(tx, guard, request.operation_key, request.resource_key, now)
        if operation is None:
            self._drop_lock(tx, guard)
            if guard.lock is not None:
                # The attempt row must not name a lock this delivery gave straight back.
                params = {"attempt_id": guard.attempt_id, "lock_owner": None, "fence": None}
                tx.run("attempt_lock", params)
            return Begun(busy=BusyReason.OPERATION)
        return Begun(grant=guard.lock, operation=operation)

    def begin(self, guard: Guard, request: BeginRequest) -> Begun:
        """Lock the resource and claim the operation together (one transaction)."""
        return self.driver.write(lambda tx: self._begin_one(tx, guard, request, tx.now()))

    def _insert_step(
        self, tx: Tx, guard: Guard, key: str, name: str, result_json: str, now: float
    ) -> None:
        params = {
            "key": key,
            "name": name,
            "result": result_json,
            "fence": _fence_of(guard),
            "now": now,
        }
        tx.run("insert_step", params)

    def put_step(self, guard: Guard, key: str, name: str, result_json: str) -> None:
        """Record a completed step (one transaction, guarded)."""

        def op(tx: Tx) -> None:
            self._verify(tx, guard, key)
            self._insert_step(tx, guard, key, name, result_json, tx.now())

        self.driver.write(op)

    def db_step(
        self, guard: Guard, key: str, name: str, fn: Callable[..., T], args: Sequence[Any]
    ) -> tuple[bool, Any]:
        """Run ``fn(conn, *args)`` and record the step, both in one transaction."""

        def op(tx: Tx) -> tuple[bool, Any]:
            stored = self._verify(tx, guard, key, step=name)["step_result"]
            if stored is not None:
                return False, json.loads(stored)
            try:
                with self.driver.step_connection(tx) as conn:
                    value = fn(conn, *args)
                result_json = json.dumps(value)
            except Exception as exc:
                # The user's own error: nothing of the step commits, and it reaches the handler
                # as raised (SQL errors of its statements already wrapped as StepSQLError).
                raise UserCodeError(exc) from exc
            self._insert_step(tx, guard, key, name, result_json, tx.now())
            return True, value

        return self.driver.write(op)

    def get_operation(self, key: str) -> Operation | None:
        """The operation record with its steps, or ``None``."""

        def op(tx: Tx) -> Operation | None:
            row = tx.one("operation_row", {"key": key})
            if row is None:
                return None
            return rows.operation(row, tx.all("steps_of_operation", {"key": key}))

        return self.driver.read(op)

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
        """Per queue: backlog, running and dead counts, oldest ready and running (three reads)."""

        def op(tx: Tx) -> list[QueueStats]:
            found: dict[str, dict[str, Any]] = {}
            now = tx.now()
            for query in ("queue_backlog", "queue_running", "queue_dead"):
                for row in tx.all(query, {"now": now}):
                    values = found.setdefault(row["queue"], {})
                    for name in _QUEUE_FIELDS.get(query, ()):
                        values[name] = row[name]
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
            OutcomeCount(since + row["bucket"] * bucket_s, Outcome(row["outcome"]), int(row["n"]))
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
            jobs = [self._insert(tx, spec, now) for _, spec in ticks]
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


def _independent(requests: Sequence[BeginRequest | None]) -> bool:
    """No two requests ask for the same resource or the same operation."""
    resources = [r.resource_key for r in requests if r is not None and r.resource_key is not None]
    keys = [r.operation_key for r in requests if r is not None and r.operation_key is not None]
    return len(set(resources)) == len(resources) and len(set(keys)) == len(keys)


def _lock_order(request: BeginRequest | None) -> tuple[str, str]:
    """Begins of one batch lock rows in this order, so two workers beginning overlapping batches
    do not deadlock: by resource key (first come, first served), then unlocked ones by
    operation key. Python compares text by code point, which is the byte order of UTF-8: the
    set statements sort the same way (COLLATE "C" on PostgreSQL)."""
    assert request is not None
    if request.resource_key is not None:
        return request.resource_key, ""
    return "", request.operation_key or ""


# Which columns of each per-queue read feed QueueStats.
_QUEUE_FIELDS = {
    "queue_backlog": ("ready", "scheduled", "oldest_ready_at"),
    "queue_running": ("running", "oldest_running_since", "shortest_lease_s"),
    "queue_dead": ("dead",),
}

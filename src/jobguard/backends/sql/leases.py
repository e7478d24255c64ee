"""Jobs in and leases out on one SQL database: enqueue, fetch (with each batch's begin), renew,
and the admission of a host queue's delivery (a lease on its shadow job, jobguard.hosts).

A fetch is one transaction: ready jobs picked, expired leases closed as lost (or buried when
their attempts are spent), new leases and attempt rows written, and each delivery's lock and
operation claim taken, from what its row and its task's rule say. On PostgreSQL a batch that
needs nothing but new leases, locks, operations and attempt rows is all of that in one
statement, committed on its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from jobguard.backends.base import (
    BeginRequest,
    Begun,
    DeliveryRules,
    HostAdmission,
    Prepared,
    Renewal,
    RenewalResult,
    begin_request,
)
from jobguard.backends.sql import rows
from jobguard.backends.sql.driver import Driver, Row, StatementRefused, Tx
from jobguard.backends.sql.proofs import Proofs, begun_in_row
from jobguard.core.hosts import Admit, Found, Reserve, admission, reservation
from jobguard.exceptions import ConfigurationError, StoreUnavailableError
from jobguard.models import DeadCode, Delivery, Guard, Job, JobSpec, JobStatus


def insert_job(tx: Tx, spec: JobSpec, now: float) -> Job:
    """Store one job, or find the live job holding its dedup key."""
    row, deduplicated = insert_row(tx, spec, now)
    return rows.job(row, deduplicated=deduplicated)


def insert_row(tx: Tx, spec: JobSpec, now: float, *, key_locked: bool = False) -> tuple[Row, bool]:
    """Store one job and return its row and ``False``, or the live job holding its dedup key and
    ``True``.

    ``key_locked``: the caller already holds the key's dedup lock in this transaction.
    """
    if spec.dedup_key is not None:
        if not key_locked:
            # Serialises enqueues of one key where writers run in parallel (PostgreSQL).
            tx.run("lock_dedup_key", {"dedup_key": spec.dedup_key})
        existing = tx.one("live_dedup_job", {"dedup_key": spec.dedup_key, "now": now})
        if existing is not None:
            tx.run("count_dedup_hit", {"id": existing["id"]})
            return existing, True
    row = tx.one(
        "insert_job",
        {
            "task": spec.task,
            "queue": spec.queue,
            "payload": spec.payload,
            "priority": spec.priority,
            "delay_s": spec.delay_s,
            "max_attempts": spec.max_attempts,
            "visibility_timeout_s": spec.visibility_timeout_s,
            "operation_key": spec.operation_key,
            "resource_key": spec.resource_key,
            "lock_ttl_s": spec.lock_ttl_s,
            "dedup_key": spec.dedup_key,
            "dedup_window_s": spec.dedup_window_s,
            "headers": spec.headers,
            "soft_time_limit_s": spec.soft_time_limit_s,
            "time_limit_s": spec.time_limit_s,
            "concurrency_key": spec.concurrency_key,
            "concurrency_limit": spec.concurrency_limit,
            # Stamped on the clock a fetch judges by (on PostgreSQL the server's, read by the
            # statement): a job due now is never a moment in the future for a fetch after its
            # commit (see Tx.statement_now).
            "now": tx.statement_now(),
        },
    )
    assert row is not None  # INSERT ... RETURNING
    return row, False


class Leases:
    """The queue port's way in and out over one driver: enqueue, fetch, renew."""

    def __init__(self, driver: Driver, proofs: Proofs) -> None:
        self.driver = driver
        self.proofs = proofs
        # Whether the next fetch will likely find work (the last one came back full, or an
        # enqueue woke us): then it skips the read-only look. A hint, never a decision.
        self._expect_work = False

    def enqueue(self, spec: JobSpec, *, connection: Any = None) -> Job:
        """Store a job or return the live holder of its dedup key (one transaction)."""
        return self.enqueue_many([spec], connection=connection)[0]

    def enqueue_many(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store jobs in one transaction (each deduplicated); see :class:`QueuePort`."""

        def op(tx: Tx) -> list[Job]:
            now = tx.now()
            return [insert_job(tx, spec, now) for spec in specs]

        if connection is not None:
            # The caller's transaction: its commit wakes workers (PostgreSQL) or they poll.
            return op(self.driver.adopt(connection))
        jobs = self.driver.write(op)
        added = sorted({job.queue for job in jobs if not job.deduplicated})
        if added:
            self.driver.jobs_added(added)
        return jobs

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> None:
        """Block until an enqueue may have added work, or ``timeout_s`` passed."""
        if self.driver.wait_for_jobs(queues, timeout_s):
            self._expect_work = True  # woken by an enqueue: the look before fetching is moot

    def interrupt_wait(self) -> None:
        """End a :meth:`wait_for_jobs` under way in this process now."""
        self.driver.interrupt_wait()

    def fetch_prepared(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules] | None = None,
    ) -> list[Prepared]:
        """Lease ready jobs and begin them (lock + claim) in the same transaction (on
        PostgreSQL, a batch that needs nothing more, in one statement).

        See :class:`~jobguard.backends.base.QueuePort`. What each delivery asks for comes from
        its row and its task's rule; nothing above the store is asked.
        """
        task_rules = rules or {}

        # Idle polling must not queue up behind writers: look first, on a read connection.
        # While jobs keep coming the look is a wasted round trip.
        def ready(tx: Tx) -> bool:
            params = {"queues": list(queues), "now": tx.statement_now()}
            return tx.one("any_ready", params) is not None

        if not self._expect_work and not self.driver.read(ready):
            return []
        prepared: list[Prepared] = []
        rest = list(queues)

        def op(tx: Tx) -> list[Prepared]:
            granted_at = time.monotonic()  # before the lease's start is read from the store
            picked, now = self._pick(tx, rest, limit - len(prepared), task_rules, worker_id)
            waiting = [row for row in picked if not _leased(row)]
            spent = self._close_expired(tx, waiting, task_rules, now)
            leased = self._lease(
                tx, [row for row in waiting if row["id"] not in spent], task_rules, worker_id, now
            )
            deliveries = [
                rows.delivery(row if _leased(row) else leased[row["id"]], 0)
                for row in picked
                if row["id"] not in spent
            ]
            if not deliveries:
                return []
            requests = [begin_request(d, task_rules.get(d.task), worker_id) for d in deliveries]
            return self._begin_fetched(tx, deliveries, requests, now, granted_at)

        try:
            if self.driver.dialect == "postgres":
                rest = self._lease_and_begin(queues, limit, worker_id, task_rules, prepared)
            if rest and len(prepared) < limit:
                prepared += self.driver.write(op)
        except StoreUnavailableError:
            if not prepared:
                raise
            # What one statement each took is committed: it goes to work, and the next fetch
            # meets the failure again.
        # A batch short of the limit took what was ready: until an enqueue wakes us, look first.
        self._expect_work = len(prepared) >= limit
        return prepared

    def _lease_and_begin(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules],
        taken: list[Prepared],
    ) -> list[str]:
        """The fetch on PostgreSQL in one statement per queue, run on its own (one commit, no
        transaction around it: ``lease_and_begin``), while each queue's batch needs nothing
        more than that statement does. Adds what it took to ``taken`` (as each statement
        commits, so a later failure keeps it); returns the queues left to the fetch's
        transaction of several statements: from the first whose batch needs more."""
        rule_items = _rule_items(rules)
        for index, queue in enumerate(queues):
            if len(taken) >= limit:
                break
            params = {
                "queue": queue,
                "limit": limit - len(taken),
                "rules": rule_items,
                "worker_id": worker_id,
                "begin": True,
            }
            granted_at = time.monotonic()  # before the lease's start is read from the store
            try:
                found = self.driver.write_statement("lease_and_begin", params)
            except StatementRefused:
                # An operation of the batch was recorded after the statement looked (its key
                # is unique): nothing of the statement was written.
                return list(queues[index:])
            head = found[0]
            if not head["fast_picked"]:
                continue
            if not head["fast_fit"]:
                return list(queues[index:])
            for row in found:
                delivery = rows.delivery(row, row["attempt_id"])
                rule = rules.get(delivery.task)
                request = begin_request(delivery, rule, worker_id, row["lock_owner"])
                begun = begun_in_row(row, request, head["fast_now"])[1]
                taken.append(Prepared(delivery, request, begun, granted_at))
        return []

    def _begin_fetched(
        self,
        tx: Tx,
        deliveries: Sequence[Delivery],
        requests: Sequence[BeginRequest | None],
        now: float,
        granted_at: float | None = None,
        host_delivery: str | None = None,
    ) -> list[Prepared]:
        """Begin deliveries leased in this transaction, one by one in :func:`_lock_order`, or
        as a set (a few statements for the batch) when no two of them ask for the same
        resource or operation, so that none depends on what another got; then write their
        attempt rows, each with the lock it holds (one row written once, not marked after). On
        PostgreSQL a set without concurrency slots is begun, attempt rows included, by one
        statement (see :meth:`Proofs.begin_set`)."""
        wanted = [index for index, request in enumerate(requests) if request is not None]
        order = sorted(wanted, key=lambda i: _lock_order(requests[i]))
        guards = [Guard(d.job_id, d.lease_token, d.attempt_id) for d in deliveries]
        begun: list[Begun | None] = [None] * len(deliveries)
        attempt_ids = None
        if _independent([requests[index] for index in order]):
            attempt_ids = self.proofs.begin_set(
                tx, guards, requests, order, begun, now, host_delivery
            )
        else:
            for index in order:
                request = requests[index]
                assert request is not None
                begun[index] = self.proofs.begin_one(tx, guards[index], request, now, leased=True)
        if attempt_ids is None:
            attempt_ids = _insert_attempts(tx, deliveries, begun, now, host_delivery)
        return [
            Prepared(
                replace(delivery, attempt_id=attempt_ids[delivery.job_id]),
                request,
                result,
                granted_at,
            )
            for delivery, request, result in zip(deliveries, requests, begun, strict=True)
        ]

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
            if _spent(row["attempts"], rule.max_attempts if rule else row["max_attempts"]):
                spent.add(row["id"])
        if spent:
            params = {"ids": sorted(spent), "code": DeadCode.LOST.value, "now": now}
            tx.run("bury_lost", params)
        return spent

    def _pick(
        self,
        tx: Tx,
        queues: Sequence[str],
        limit: int,
        rules: Mapping[str, DeliveryRules],
        worker_id: str,
    ) -> tuple[list[Row], float]:
        """Up to ``limit`` ready jobs of ``queues``, the first queue first, in the order taken,
        and the store clock's time they were judged ready at (the rest of the fetch's time).

        On PostgreSQL the queued ones come back leased already (``lease_and_begin`` without its
        begin: one statement, not a pick and then a lease), judged on the server's clock unless
        a test injected one; the rest, and on SQLite all, are leased by :meth:`_lease` once
        expired leases are closed.
        """
        if self.driver.dialect != "postgres":
            now = tx.now()
            picked: list[Row] = []
            for queue in queues:
                if len(picked) < limit:
                    params = {"queue": queue, "now": now, "limit": limit - len(picked)}
                    picked.extend(tx.all("ready_jobs", params))
            return picked, now
        picked = []
        rule_items = _rule_items(rules)
        at = tx.statement_now()  # None: the first statement reads the server's clock
        for queue in queues:
            if len(picked) >= limit:
                break
            params = {
                "queue": queue,
                "now": at,
                "limit": limit - len(picked),
                "rules": rule_items,
                "worker_id": worker_id,
                "begin": False,
            }
            found = tx.all("lease_and_begin", params)
            if at is None:
                at = float(found[0]["fast_now"])  # the rest of the fetch on the same time
            # One row of NULL job columns says nothing was picked.
            picked.extend(row for row in found if row["id"])
        return picked, tx.now() if at is None else at

    @staticmethod
    def _lease(
        tx: Tx,
        picked: Sequence[Row],
        rules: Mapping[str, DeliveryRules],
        worker_id: str,
        now: float,
    ) -> dict[int, Row]:
        """New leases for ``picked`` (one statement per lease length and attempt limit); the
        row keeps the attempt limit the worker enforces. The leased rows by job id; their
        attempt rows are written by :meth:`_begin_fetched`, with what each begin got."""
        by_rule: dict[tuple[float | None, int | None], list[int]] = {}
        for row in picked:
            rule = rules.get(row["task"])
            key = (rule.visibility_timeout_s, rule.max_attempts) if rule else (None, None)
            by_rule.setdefault(key, []).append(row["id"])
        leased: dict[int, Row] = {}
        for (lease_s, max_attempts), ids in by_rule.items():
            params = {
                "ids": ids,
                "worker_id": worker_id,
                "lease_s": lease_s,
                "max_attempts": max_attempts,
                "now": now,
            }
            leased.update((row["id"], row) for row in tx.all("lease_jobs", params))
        return leased

    def admit_host_delivery(
        self, spec: JobSpec, worker_id: str, rules: DeliveryRules, host_delivery: str
    ) -> HostAdmission:
        """Admit a host queue's delivery against its shadow job; see :class:`QueuePort`."""
        key = _shadow_key(spec)
        task_rules = {spec.task: rules}

        def op(tx: Tx) -> HostAdmission:
            granted_at = time.monotonic()
            now = tx.now()
            row, found = _shadow_job(tx, key)
            decided = admission(found, now)
            if decided.admit in (Admit.HELD, Admit.EARLY, Admit.DEAD):
                assert row is not None
                return HostAdmission(decided.admit, row["id"], wait_s=decided.wait_s)
            if decided.admit == Admit.INSERT:
                # Nothing live holds the key: a new job (the key is locked already).
                row, held = insert_row(tx, spec, now, key_locked=True)
                if held:  # an older job of the key was made live again (a replay)
                    row = tx.one("host_job", key)
            assert row is not None
            if self._close_expired(tx, [row], task_rules, now):
                return HostAdmission(Admit.DEAD, row["id"])  # its attempts were spent
            delivery = rows.delivery(
                self._lease(tx, [row], task_rules, worker_id, now)[row["id"]], 0
            )
            # Begun in the lease's transaction, as a fetch begins what it leases; its attempt
            # row names the host's delivery id as it is written.
            request = begin_request(delivery, rules, worker_id)
            (prepared,) = self._begin_fetched(
                tx, [delivery], [request], now, granted_at, host_delivery
            )
            return HostAdmission(decided.admit, row["id"], prepared)

        return self.driver.write(op)

    def reserve_host_job(self, spec: JobSpec, unsent_s: float) -> Job:
        """A deduplicated send of a host task: its shadow job; see :class:`QueuePort`."""
        key = _shadow_key(spec)

        def op(tx: Tx) -> Job:
            now = tx.now()
            row, found = _shadow_job(tx, key)
            decided = reservation(found, now, unsent_s)
            if decided == Reserve.INSERT:
                inserted, held = insert_row(tx, spec, now, key_locked=True)
                return rows.job(inserted, deduplicated=held)
            assert row is not None
            if decided == Reserve.RETAKE:
                params = {"id": row["id"], "headers": spec.headers, "now": now}
                retaken = tx.one("retake_host_job", {**params, "due_before": now - unsent_s})
                if retaken is not None:
                    return rows.job(retaken)
            tx.run("count_dedup_hit", {"id": row["id"]})
            return rows.job(row, deduplicated=True)

        return self.driver.write(op)

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        """Extend every lease, lock and slot still ours: one set statement for the leases and
        one for the locks and one for the slots, each atomic on its own, so that on a slow
        network the first renewal of a delivery just fetched lands well within its lease."""
        leases = [
            {
                "job_id": item.guard.job_id,
                "lease_token": item.guard.lease_token,
                "visibility_timeout_s": item.visibility_timeout_s,
            }
            for item in renewals
        ]
        extended = {
            (row["id"], row["lease_token"]): row["cancel_requested_by"]
            for row in self.driver.write_statement("extend_leases", {"items": leases})
        }
        locks = [
            (item.guard.lock, item.lock_ttl_s)
            for item in renewals
            if item.guard.lock is not None and item.lock_ttl_s is not None
        ]
        kept = self.proofs.renew_locks(locks) if locks else set()
        slots = [
            item for item in renewals if item.guard.slot is not None and item.lock_ttl_s is not None
        ]
        slots_kept = self._renew_slots(slots) if slots else set()
        results = []
        for item in renewals:
            key = (item.guard.job_id, item.guard.lease_token)
            lock, slot = item.guard.lock, item.guard.slot
            lock_ok = lock is None or item.lock_ttl_s is None or (lock.resource, lock.owner) in kept
            if slot is not None and item.lock_ttl_s is not None:
                lock_ok = lock_ok and (slot.resource, slot.slot, slot.owner) in slots_kept
            results.append(RenewalResult(key in extended, lock_ok, extended.get(key)))
        return results

    def _renew_slots(self, renewals: Sequence[Renewal]) -> set[tuple[str, int | None, str]]:
        """Extend the concurrency slots still owned (one statement, as the locks); the (key,
        slot, owner) of each extended."""
        items = []
        for item in renewals:
            slot = item.guard.slot
            assert slot is not None
            items.append(
                {
                    "key": slot.resource,
                    "slot": slot.slot,
                    "owner": slot.owner,
                    "ttl_s": item.lock_ttl_s,
                }
            )
        rows = self.driver.write_statement("renew_slots", {"items": items})
        return {(row["key"], row["slot"], row["owner"]) for row in rows}


def _rule_items(rules: Mapping[str, DeliveryRules]) -> list[dict[str, Any]]:
    """Each task's lease, attempt limit and lock length as the fetch statements take them (a
    task's rule wins over what its rows say)."""
    return [
        {
            "task": task,
            "lease_s": rule.visibility_timeout_s,
            "max_attempts": rule.max_attempts,
            "lock_ttl_s": rule.lock_ttl_s,
        }
        for task, rule in rules.items()
    ]


def _shadow_key(spec: JobSpec) -> dict[str, Any]:
    """The parameters that find a host task's shadow job (its dedup key)."""
    if spec.dedup_key is None:
        raise ConfigurationError("a host queue's task is found by its shadow job's dedup key")
    return {"dedup_key": spec.dedup_key}


def _shadow_job(tx: Tx, key: dict[str, Any]) -> tuple[Row | None, Found | None]:
    """The newest shadow job of one operation and its facts, read under the key's dedup lock
    (sends and admissions of one operation take turns)."""
    tx.run("lock_dedup_key", key)
    row = tx.one("host_job", key)
    found = None if row is None else Found(JobStatus(row["status"]), row["available_at"])
    return row, found


def _insert_attempts(
    tx: Tx,
    deliveries: Sequence[Delivery],
    begun: Sequence[Begun | None],
    now: float,
    host_delivery: str | None,
) -> dict[int, int]:
    """The attempt rows of deliveries leased and begun in this transaction, each naming the
    lock its begin granted (none if it was busy) and ``host_delivery`` (a host queue's delivery
    id, if given), in one statement; their ids by job."""
    items = []
    for delivery, result in zip(deliveries, begun, strict=True):
        grant = result.grant if result is not None else None
        items.append(
            {
                "job_id": delivery.job_id,
                "lock_owner": grant.owner if grant else None,
                "fence": grant.fence if grant else None,
            }
        )
    found = tx.all("insert_attempts", {"items": items, "now": now, "host": host_delivery})
    return {row["job_id"]: row["id"] for row in found}


def _leased(row: Row) -> bool:
    """Whether a picked row came back leased already (``lease_and_begin``), or is still to
    lease."""
    return bool(row["leased"])


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


def _spent(attempts: Any, max_attempts: Any) -> bool:
    """Whether a lost delivery used the job's last attempt. A stored count that is not a
    number (text in a SQLite column) cannot be compared: that job is not run again either."""
    try:
        return bool(attempts >= max_attempts)
    except TypeError:
        return True

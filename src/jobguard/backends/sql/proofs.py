"""The guard's proofs on one SQL database: resource locks and concurrency slots with fences,
operation claims, steps.

What a delivery must hold before its handler runs (a lock, a slot and an operation claim, taken
together by :meth:`Proofs.begin`, alone or for a fetched batch at once), and what a write of its
effects must show before it lands (:func:`verify`: the lease, the newest fences, the claim, in
one round trip). A slot is a lock among N of one key: granted, renewed, released and fenced the
same way, by the same steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from jobguard.backends.base import BeginRequest, Begun
from jobguard.backends.sql import rows
from jobguard.backends.sql.driver import Driver, Row, StatementRefused, Tx, UserCodeError
from jobguard.core import checks, messages
from jobguard.exceptions import StepSQLError, StoreUnavailableError
from jobguard.models import BusyReason, Guard, LockGrant, Operation, OperationStatus

if TYPE_CHECKING:
    from jobguard.steptx import StepCall, StepTransactions

T = TypeVar("T")


def fence_of(guard: Guard) -> int | None:
    """The fence ``guard``'s lock was granted with, if it holds one."""
    return guard.lock.fence if guard.lock else None


def slot_proof(guard: Guard) -> dict[str, Any]:
    """What proves ``guard``'s concurrency slot (all ``None`` without one)."""
    slot = guard.slot
    return {
        "slot_key": slot.resource if slot else None,
        "slot": slot.slot if slot else None,
        "slot_fence": slot.fence if slot else None,
    }


def verify(tx: Tx, guard: Guard, claim_key: str | None, step: str | None = None) -> Row:
    """Refuse a write whose lease is stale, whose lock's or slot's fence is old, or (with
    ``claim_key``) whose delivery no longer holds the operation's claim. Returns the state read,
    with the stored result of ``step`` (if given and already recorded) in ``step_result``."""
    proof = slot_proof(guard)
    state = tx.one(
        "guard_state",
        {
            "job_id": guard.job_id,
            "lease_token": guard.lease_token,
            "resource": guard.lock.resource if guard.lock else None,
            "slot_key": proof["slot_key"],
            "slot": proof["slot"],
            "key": claim_key,
            "step": step,
        },
    )
    assert state is not None  # a SELECT of sub-queries always returns its one row
    if state["lease_ok"] is None:
        raise messages.stale_lease(guard.job_id, guard.lease_token)
    for grant, newest in ((guard.lock, state["fence"]), (guard.slot, state["slot_fence"])):
        if grant is not None and newest is not None and newest > grant.fence:
            raise messages.stale_fence(messages.held_name(grant), grant.fence, newest)
    if claim_key is not None and state["claim_ok"] is None:
        raise messages.claim_lost(claim_key)
    return state


def step_record(guard: Guard, key: str, name: str, result_json: str) -> dict[str, Any]:
    """The parameters of a step's record and of the proofs it is written under."""
    return {
        "key": key,
        "name": name,
        "result": result_json,
        "fence": fence_of(guard),
        "job_id": guard.job_id,
        "lease_token": guard.lease_token,
        "resource": guard.lock.resource if guard.lock else None,
        **slot_proof(guard),
    }


def release_locks(tx: Tx, guards: Sequence[Guard]) -> int:
    """Free the locks and the slots these guards hold, where each owner still holds them (lock
    rows first, then slot rows: the order a begin takes them in)."""
    locks = [
        {"resource": guard.lock.resource, "owner": guard.lock.owner}
        for guard in guards
        if guard.lock is not None
    ]
    slots = [
        {"key": guard.slot.resource, "slot": guard.slot.slot, "owner": guard.slot.owner}
        for guard in guards
        if guard.slot is not None
    ]
    freed = tx.run("release_locks", {"items": locks}) if locks else 0
    return freed + (tx.run("release_slots", {"items": slots}) if slots else 0)


def _give_back(tx: Tx, guards: Sequence[Guard], *, marked: bool) -> None:
    """Deliveries that cannot begin after all: what they were granted in this begin is freed,
    and their attempt rows, if already ``marked`` with the lock, do not name a lock they gave
    straight back (a fetch writes its attempt rows after the begin)."""
    if not guards:
        return
    release_locks(tx, guards)
    if not marked:
        return
    unmark = [
        {"attempt_id": guard.attempt_id, "lock_owner": None, "fence": None}
        for guard in guards
        if guard.lock is not None
    ]
    if unmark:
        tx.run("attempt_locks", {"items": unmark})


def grant_slots(
    tx: Tx, guards: list[Guard], wanted: Mapping[int, BeginRequest], now: float
) -> set[int]:
    """One slot for each of ``wanted`` (by index into ``guards``) that asks for one, all in one
    statement; fills ``guards`` with the grants. Returns the indices left without a slot."""
    asking = [
        index
        for index, request in wanted.items()
        if request.concurrency_key is not None and request.concurrency_limit is not None
    ]
    if not asking:
        return set()
    seen: dict[str, int] = {}
    items = []
    for index in asking:
        request = wanted[index]
        key = request.concurrency_key
        assert key is not None
        nth = seen[key] = seen.get(key, -1) + 1  # the nth free slot: distinct within a key
        items.append(
            {
                "key": key,
                # A row written by another tool may hold any number: the begin looks at no
                # more slots than a limit may have.
                "lim": min(request.concurrency_limit or 0, checks.MAX_CONCURRENCY),
                "owner": request.lock_owner,
                "expires_at": now + request.lock_ttl_s,
                "nth": nth,
            }
        )
    granted = {row["owner"]: row for row in tx.all("grant_slots", {"items": items, "now": now})}
    missing = set()
    for index in asking:
        request = wanted[index]
        row = granted.get(request.lock_owner)
        if row is None:
            missing.add(index)
            continue
        expires_at = now + request.lock_ttl_s
        grant = LockGrant(row["key"], row["owner"], row["fence"], expires_at, slot=row["slot"])
        guards[index] = replace(guards[index], slot=grant)
    return missing


def _lock_grant(request: BeginRequest, fence: int, now: float) -> LockGrant:
    """The lock ``request`` asked for, granted at ``now`` with ``fence``."""
    assert request.resource_key is not None
    return LockGrant(request.resource_key, request.lock_owner, fence, now + request.lock_ttl_s)


def begun_in_row(
    row: Row, request: BeginRequest | None, now: float
) -> tuple[LockGrant | None, Begun | None]:
    """What one delivery's begin by ``begin_batch`` or ``lease_and_begin`` got, from its row
    (``fence``: the lock granted, NULL if busy; ``claimed``: whether its operation row was
    inserted, as the statement inserts a claim at ``now``): the lock it holds, and its
    :class:`Begun`; ``None`` if it asked for nothing, or for an operation already recorded
    (claimed one at a time next, holding that lock)."""
    if request is None:
        return None, None
    grant = None
    if request.resource_key is not None:
        if row["fence"] is None:
            return None, Begun(busy=BusyReason.LOCK)
        grant = _lock_grant(request, row["fence"], now)
    key = request.operation_key
    if key is None:
        return grant, Begun(grant=grant)
    if not row["claimed"]:
        return grant, None
    operation = rows.new_claim(key, request.resource_key, row["fence"], now)
    return grant, Begun(grant=grant, operation=operation)


class Proofs:
    """The lock and operation ports, and the begin of fetched batches, over one driver."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def begin_set(
        self,
        tx: Tx,
        guards: list[Guard],
        requests: Sequence[BeginRequest | None],
        order: Sequence[int],
        begun: list[Begun | None],
        now: float,
        host_delivery: str | None = None,
    ) -> dict[int, int] | None:
        """:meth:`begin_one` for a batch of deliveries leased in this transaction that ask for
        distinct resources and operations: one statement grants every lock, one inserts every
        new operation; only operations already recorded are claimed one at a time, in
        ``order``. Fills ``guards`` (grants) and ``begun``. On PostgreSQL, when none asks for a
        concurrency slot (granted between the locks and the operations, by a statement of its
        own), one statement does all of it and writes the attempt rows too: then it returns
        their ids by job (``host_delivery``: the host queue's delivery they name). Else
        ``None``: the caller writes them, with what each holds then."""
        in_one = self.driver.dialect == "postgres" and all(
            request is None or request.concurrency_key is None for request in requests
        )
        if in_one:
            self._begin_and_record(tx, guards, requests, begun, now, host_delivery)
            for index in order:
                request = requests[index]
                if begun[index] is None and request is not None and request.operation_key:
                    begun[index] = self._claim_or_busy(tx, guards[index], request, now, marked=True)
            return {guard.job_id: guard.attempt_id for guard in guards}
        wanted = {index: request for index in order if (request := requests[index]) is not None}
        self._grant_set(tx, guards, wanted, begun, now)
        # Slots of one key are shared within a batch (one statement hands out distinct ones).
        # A delivery that then finds its operation busy gives its slot back; one of its batch
        # refused that slot meanwhile is deferred and takes it on its next fetch.
        free = {index: request for index, request in wanted.items() if begun[index] is None}
        slotless = sorted(grant_slots(tx, guards, free, now))
        _give_back(tx, [guards[index] for index in slotless], marked=False)  # locks just taken
        for index in slotless:
            begun[index] = Begun(busy=BusyReason.SLOT)
        claiming = {
            request.operation_key: index
            for index, request in wanted.items()
            if begun[index] is None and request.operation_key is not None
        }
        inserted: set[str] = set()
        if claiming:
            items = [
                {
                    "key": key,
                    "resource_key": wanted[index].resource_key,
                    "owner_lease": guards[index].lease_token,
                    "fence": fence_of(guards[index]),
                }
                for key, index in claiming.items()
            ]
            found = tx.all("insert_operations", {"items": items, "now": now})
            inserted = {row["key"] for row in found}
        for index, request in wanted.items():
            key, guard = request.operation_key, guards[index]
            if begun[index] is not None:
                continue
            if key is None:
                begun[index] = Begun(grant=guard.lock, slot=guard.slot)
            elif key in inserted:
                operation = rows.new_claim(key, request.resource_key, fence_of(guard), now)
                begun[index] = Begun(grant=guard.lock, operation=operation, slot=guard.slot)
            else:  # recorded already: claimed, or busy with a live delivery's claim
                begun[index] = self._claim_or_busy(tx, guard, request, now, marked=False)
        return None

    @staticmethod
    def _begin_and_record(
        tx: Tx,
        guards: list[Guard],
        requests: Sequence[BeginRequest | None],
        begun: list[Begun | None],
        now: float,
        host_delivery: str | None,
    ) -> None:
        """The batch's locks granted, its new operations inserted and claimed and its attempt
        rows written, in one statement (``begin_batch``); fills ``guards`` (attempt ids and
        grants) and ``begun``, except for operations already recorded (left ``None``)."""
        items = []
        for guard, request in zip(guards, requests, strict=True):
            locking = request is not None and request.resource_key is not None
            items.append(
                {
                    "job_id": guard.job_id,
                    "resource": request.resource_key if request else None,
                    "owner": request.lock_owner if request and locking else None,
                    "expires_at": now + request.lock_ttl_s if request and locking else None,
                    "key": request.operation_key if request else None,
                }
            )
        params = {"items": items, "now": now, "host": host_delivery}
        found = {row["job_id"]: row for row in tx.all("begin_batch", params)}
        for index, request in enumerate(requests):
            row = found[guards[index].job_id]
            grant, begun[index] = begun_in_row(row, request, now)
            guards[index] = replace(guards[index], attempt_id=row["attempt_id"], lock=grant)

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
        for resource, index in asking.items():
            if resource not in fences:
                begun[index] = Begun(busy=BusyReason.LOCK)
                continue
            guards[index] = replace(
                guards[index], lock=_lock_grant(wanted[index], fences[resource], now)
            )

    # -- locks --------------------------------------------------------------------------------

    @staticmethod
    def _grant(
        tx: Tx,
        resource: str,
        owner: str,
        ttl_s: float,
        attempt_id: int | None,
        now: float,
    ) -> LockGrant | None:
        """Grant one lock: the set statements with a set of one."""
        expires_at = now + ttl_s
        items = [{"resource": resource, "owner": owner, "expires_at": expires_at}]
        row = tx.one("grant_locks", {"items": items, "now": now})
        if row is None:
            return None
        if attempt_id is not None:
            mark = {"attempt_id": attempt_id, "lock_owner": owner, "fence": row["fence"]}
            tx.run("attempt_locks", {"items": [mark]})
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
        return (grant.resource, grant.owner) in self.renew_locks([(grant, ttl_s)])

    def renew_locks(self, locks: Sequence[tuple[LockGrant, float]]) -> set[tuple[str, str]]:
        """Extend each lock its owner still holds by its TTL (one statement); the (resource,
        owner) pairs extended."""
        items = [
            {"resource": grant.resource, "owner": grant.owner, "ttl_s": ttl_s}
            for grant, ttl_s in locks
        ]
        rows = self.driver.write_statement("renew_locks", {"items": items})
        return {(row["resource"], row["owner"]) for row in rows}

    def release_lock(self, grant: LockGrant) -> bool:
        """Free the lock if ``grant.owner`` still owns it."""

        def op(tx: Tx) -> bool:
            items = [{"resource": grant.resource, "owner": grant.owner}]
            return tx.run("release_locks", {"items": items}) == 1

        return self.driver.write(op)

    def lock_fence(self, resource: str) -> int:
        """The last fence issued for ``resource`` (0 if never locked)."""
        found = self.driver.read(lambda tx: tx.all("lock_row", {"resource": resource}))
        return int(found[0]["fence"]) if found else 0

    def slot_grants(self, key: str) -> list[LockGrant]:
        """Every slot of ``key`` ever held, by number (released ones: owner ``""``)."""
        found = self.driver.read(lambda tx: tx.all("slot_rows", {"key": key}))
        return [
            LockGrant(
                row["key"], row["owner"] or "", row["fence"], row["expires_at"] or 0.0, row["slot"]
            )
            for row in found
        ]

    # -- operations and steps -----------------------------------------------------------------

    @staticmethod
    def _claim(
        tx: Tx, guard: Guard, key: str, resource_key: str | None, now: float
    ) -> Operation | None:
        """Get-or-create the record and claim it; ``None`` if a live delivery holds it."""
        fence = fence_of(guard)
        item = {
            "key": key,
            "resource_key": resource_key,
            "owner_lease": guard.lease_token,
            "fence": fence,
        }
        # Most operations are new: insert first (its record is the one written, known without
        # reading it); a key already recorded is read and locked instead.
        if tx.one("insert_operations", {"items": [item], "now": now}) is not None:
            return rows.new_claim(key, resource_key, fence, now)
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

    def begin_one(
        self, tx: Tx, guard: Guard, request: BeginRequest, now: float, *, leased: bool = False
    ) -> Begun:
        """``leased``: the lease was taken in this same transaction, so it needs no proof, and
        its attempt row is written after the begin, with the grant (none to mark here)."""
        if not leased:
            verify(tx, guard, None)
        current = guard
        held = guard.lock is not None and guard.lock.resource == request.resource_key
        if request.resource_key is not None and not held:
            grant = self._grant(
                tx,
                request.resource_key,
                request.lock_owner,
                request.lock_ttl_s,
                None if leased else guard.attempt_id,
                now,
            )
            if grant is None:
                return Begun(busy=BusyReason.LOCK)
            current = replace(guard, lock=grant)
        if request.concurrency_key is not None and current.slot is None:
            slotted = [current]
            if grant_slots(tx, slotted, {0: request}, now):
                _give_back(tx, [current], marked=not leased)
                return Begun(busy=BusyReason.SLOT)
            current = slotted[0]
        if request.operation_key is None:
            return Begun(grant=current.lock, slot=current.slot)
        return self._claim_or_busy(tx, current, request, now, marked=not leased)

    def _claim_or_busy(
        self, tx: Tx, guard: Guard, request: BeginRequest, now: float, *, marked: bool
    ) -> Begun:
        """Claim the operation for a delivery that holds what it locked; busy if a live
        delivery holds the claim, in which case its lock and slot are given straight back (and,
        if its attempt row was ``marked`` with the grant, unmarked)."""
        assert request.operation_key is not None
        operation = self._claim(tx, guard, request.operation_key, request.resource_key, now)
        if operation is None:
            _give_back(tx, [guard], marked=marked)
            return Begun(busy=BusyReason.OPERATION)
        return Begun(grant=guard.lock, operation=operation, slot=guard.slot)

    def begin(self, guard: Guard, request: BeginRequest) -> Begun:
        """Lock the resource and claim the operation together (one transaction)."""
        return self.driver.write(lambda tx: self.begin_one(tx, guard, request, tx.now()))

    def _insert_step(
        self, tx: Tx, guard: Guard, key: str, name: str, result_json: str, now: float
    ) -> None:
        params = {**step_record(guard, key, name, result_json), "now": now}
        if tx.run("insert_step", params) == 0:
            # A proof failed after the check before the step's work: a lock or slot granted
            # anew (this holder's TTL ran out) while the step ran. Name it; the caller's
            # transaction, the step's own writes with it, rolls back.
            verify(tx, guard, key)
            raise messages.stale_lease(guard.job_id, guard.lease_token, "record a step")

    def put_step(self, guard: Guard, key: str, name: str, result_json: str) -> None:
        """Record a completed step, written only while every proof holds: on PostgreSQL one
        round trip (see :meth:`Driver.write_together`). A step recorded already keeps its
        first record (the claim lets one delivery at a time record, and that one records each
        name once)."""
        record = ("insert_step_or_fail", step_record(guard, key, name, result_json))
        try:
            self.driver.write_together(record, [])
        except StatementRefused:
            if self._recorded_or_stale(guard, key, name) is None:
                raise  # not the guard (a proof that fails stays failed): the store's own

    def db_step(
        self,
        guard: Guard,
        key: str,
        name: str,
        fn: Callable[..., T],
        args: Sequence[Any],
        on: StepTransactions | None = None,
    ) -> tuple[bool, Any]:
        """Run ``fn(conn, *args)`` and record the step, both in one transaction."""
        if on is not None:
            return self._db_step_on(on, guard, key, name, fn, args)

        def op(tx: Tx) -> tuple[bool, Any]:
            stored = verify(tx, guard, key, step=name)["step_result"]
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
            # The record proves again as the transaction commits (on PostgreSQL sent with the
            # COMMIT): a lock or slot granted anew while the step ran refuses it.
            tx.run_with_commit("insert_step_or_fail", step_record(guard, key, name, result_json))
            return True, value

        try:
            return self.driver.write(op)
        except StatementRefused:
            stored = self._recorded_or_stale(guard, key, name)
            if stored is None:  # not the guard (a proof that fails stays failed): the store's own
                raise
            return False, json.loads(stored)

    def _recorded_or_stale(self, guard: Guard, key: str, name: str) -> str | None:
        """After a step's record was refused: raise why, if the guard went stale (a lost lease,
        a newer fence and a taken claim never come back); else the step's stored result, if
        another delivery recorded it (``None``: it did not)."""
        state = self.driver.read(lambda tx: verify(tx, guard, key, step=name))
        stored: str | None = state["step_result"]
        return stored

    def db_writes(
        self, guard: Guard, key: str, name: str, statements: Sequence[tuple[Any, Any]]
    ) -> bool:
        """Record the step (result ``null``) and run the statements, in one transaction sent
        at once (see :meth:`Driver.write_together`). The record comes first, written only while
        every proof holds, so that a stale delivery's statements never run, nor those of a
        step recorded already: another delivery's record of the step, not yet committed, makes
        this one wait for it and then fail as a duplicate. Whether they ran: False when the
        step was recorded already."""
        params = step_record(guard, key, name, "null")
        try:
            self.driver.write_together(("insert_step_or_fail", params), statements)
        except StatementRefused as refused:
            if self._recorded_or_stale(guard, key, name) is not None:
                return False
            cause = refused.__cause__
            if isinstance(cause, StepSQLError):  # said already where the statement failed
                raise cause from cause.__cause__
            raise StepSQLError(f"SQL of the step failed: {cause}") from refused
        return True

    def _db_step_on(
        self,
        on: StepTransactions,
        guard: Guard,
        key: str,
        name: str,
        fn: Callable[..., T],
        args: Sequence[Any],
    ) -> tuple[bool, Any]:
        """:meth:`db_step` in a transaction of a framework's connection (``ctx.db_step(on=)``).

        The guard is checked again after ``fn``: on PostgreSQL, a lock taken over while ``fn``
        ran is seen by then, and the ORM's writes roll back with the refusal.
        """
        try:
            with on.transaction() as (connection, call):
                try:
                    return self._step_on(
                        self.driver.adopt(connection), guard, key, name, fn, args, call
                    )
                except self.driver.client_errors as exc:  # our statements on their connection
                    raise StoreUnavailableError(f"the db_step transaction failed: {exc}") from exc
        except UserCodeError as exc:
            raise exc.original from exc.original.__cause__

    def _step_on(
        self,
        tx: Tx,
        guard: Guard,
        key: str,
        name: str,
        fn: Callable[..., T],
        args: Sequence[Any],
        call: StepCall,
    ) -> tuple[bool, Any]:
        stored = verify(tx, guard, key, step=name)["step_result"]
        if stored is not None:
            return False, json.loads(stored)
        with self.driver.step_connection(tx, savepoints=True):  # the ORM's own savepoints
            try:
                value = call(fn, args)
            except Exception as exc:
                raise UserCodeError(exc) from exc  # raised as it is, after the rollback
        result_json = json.dumps(value)
        verify(tx, guard, key)
        self._insert_step(tx, guard, key, name, result_json, tx.now())
        return True, value

    def get_operation(self, key: str) -> Operation | None:
        """The operation record with its steps, or ``None``."""

        def op(tx: Tx) -> Operation | None:
            row = tx.one("operation_row", {"key": key})
            if row is None:
                return None
            return rows.operation(row, tx.all("steps_of_operation", {"key": key}))

        return self.driver.read(op)

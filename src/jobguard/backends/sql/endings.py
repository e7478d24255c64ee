"""Settling: how deliveries end, written as a set.

Every ending (a success, a retry, a deferral, a burial, a release, a refusal) is one item of
one batch: the jobs are moved where every proof holds, then their locks and slots released,
operations completed or unclaimed, and attempts closed (or, for a refusal, marked). On
PostgreSQL all of that is one statement for the batch (``settle_set``); SQLite, which cannot
write inside ``WITH``, runs one statement per table touched. Decisions arrive made; this module
only writes them and says which items it could not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from jobguard.backends.base import REFUSED_OUTCOMES, SUCCESS_OUTCOMES, Ending
from jobguard.backends.sql.driver import Driver, StatementCutOff, StatementRefused, Tx
from jobguard.backends.sql.proofs import fence_of, release_locks, slot_proof, verify
from jobguard.core import messages
from jobguard.exceptions import GuardLost, JobGuardError, StoreUnavailableError
from jobguard.models import OperationStatus, Outcome


class _RedoCarefully(Exception):
    """A batch item failed after it wrote: roll the batch back and run it with savepoints."""


# What each kind of ending does to its job: the status it moves to, whether the attempt is
# handed back (uncharge) and counted as a deferral.
_JOB_MOVES: dict[Outcome, tuple[str, int, int]] = {
    Outcome.COMPLETED: ("completed", 0, 0),
    Outcome.ALREADY_PROCESSED: ("completed", 0, 0),
    Outcome.RETRY: ("queued", 0, 0),
    Outcome.TIMED_OUT: ("queued", 0, 0),  # or buried, when the ending carries a dead code
    Outcome.DEFERRED: ("queued", 1, 1),
    Outcome.FENCE_REFUSED: ("queued", 1, 1),  # handed back if the lease is still current
    Outcome.DEAD: ("dead", 0, 0),
    Outcome.RELEASED: ("queued", 1, 0),
}


def _claim_of(ending: Ending) -> str | None:
    """The operation a success completes (only a completed outcome completes one)."""
    return ending.operation_key if ending.outcome == Outcome.COMPLETED else None


def _last_error(ending: Ending) -> str | None:
    error = ending.error
    return f"{error.type}: {error.message}" if error else None


def _job_item(ending: Ending) -> dict[str, Any]:
    guard, error, outcome = ending.guard, ending.error, ending.outcome
    status, uncharge, deferral = _JOB_MOVES[outcome]
    if outcome == Outcome.TIMED_OUT and ending.code is not None:
        status = "dead"
    proves = outcome in SUCCESS_OUTCOMES  # moving the job back needs only the lease
    failed = outcome in (Outcome.RETRY, Outcome.DEAD, Outcome.TIMED_OUT)
    return {
        "job_id": guard.job_id,
        "lease_token": guard.lease_token,
        "resource": guard.lock.resource if proves and guard.lock else None,
        "fence": fence_of(guard) if proves else None,
        **slot_proof(guard if proves else replace(guard, slot=None)),
        "key": _claim_of(ending),
        "status": status,
        "delay_s": None if outcome == Outcome.RELEASED or status != "queued" else ending.delay_s,
        "uncharge": uncharge,
        "deferral": deferral,
        "set_error": failed or proves,  # a success clears the last error
        "last_error": _last_error(ending) if failed else None,
        "set_signature": failed,
        "error_signature": error.signature if error else None,
        "same_error_count": error.same_count if error else 0,
        "code": ending.code.value if ending.code else None,
        "reason": ending.reason or None,
    }


def _operation_item(ending: Ending) -> dict[str, Any] | None:
    """How a moved ending drops its operation's claim (a success completes it instead)."""
    if ending.operation_key is None:
        return None
    buried = ending.outcome == Outcome.TIMED_OUT and ending.code is not None
    if ending.outcome in (Outcome.RETRY, Outcome.TIMED_OUT) and not buried:
        status, last_error = OperationStatus.PROCESSING, _last_error(ending)
    elif ending.outcome == Outcome.DEAD or buried:
        status, last_error = OperationStatus.FAILED, ending.reason or _last_error(ending)
    elif ending.outcome == Outcome.RELEASED:
        status, last_error = OperationStatus.PROCESSING, None
    else:
        return None
    return {
        "key": ending.operation_key,
        "owner_lease": ending.guard.lease_token,
        "status": status.value,
        "last_error": last_error,
    }


def _attempt_item(ending: Ending) -> dict[str, Any]:
    guard, error, closing = ending.guard, ending.error, ending.closing
    return {
        "attempt_id": guard.attempt_id,
        "outcome": ending.outcome.value,
        "duration_s": closing.duration_s,
        "error_type": error.type if error else None,
        "error_message": error.message if error else None,
        "traceback": error.traceback if error else None,
        "lock_owner": guard.lock.owner if guard.lock else None,
        "fence": fence_of(guard),
        "steps_run": closing.steps_run,
        "steps_skipped": closing.steps_skipped,
    }


def _set_item(ending: Ending) -> dict[str, Any]:
    """One item of ``settle_set``: the job's move (:func:`_job_item`) and, should it move, what
    follows it: what it frees (``held_*``), how its operation ends (``op_*``: completed with
    its result, or its claim dropped as :func:`_operation_item` says) and, unless it is a
    refusal, its attempt row closed (``attempt_*``, as :func:`_attempt_item`)."""
    guard = ending.guard
    claim = _claim_of(ending)
    operation: dict[str, Any] | None
    if claim is not None:
        operation = {
            "key": claim,
            "status": OperationStatus.COMPLETED.value,
            "result": ending.result_json,
            "external_ref": ending.external_ref,
            "fence": fence_of(guard),
        }
    else:
        operation = _operation_item(ending)
    item = {
        **_job_item(ending),
        "held_resource": guard.lock.resource if guard.lock else None,
        "held_owner": guard.lock.owner if guard.lock else None,
        "held_slot_key": guard.slot.resource if guard.slot else None,
        "held_slot": guard.slot.slot if guard.slot else None,
        "held_slot_owner": guard.slot.owner if guard.slot else None,
        **{f"op_{name}": value for name, value in (operation or {}).items()},
        "close": ending.outcome not in REFUSED_OUTCOMES,
        **{f"attempt_{name}": value for name, value in _attempt_item(ending).items()},
    }
    # A key left out reads as NULL on both stores (jsonb_to_recordset, json_extract): most of
    # an item is empty, and the batch is encoded and parsed again for every settle.
    return {name: value for name, value in item.items() if value is not None}


def _mark_item(ending: Ending) -> dict[str, Any]:
    refused_by = "LeaseLostError" if ending.outcome == Outcome.LEASE_REFUSED else "StaleFenceError"
    return {
        "attempt_id": ending.guard.attempt_id,
        "outcome": ending.outcome.value,
        "duration_s": ending.closing.duration_s,
        "error_type": refused_by,
        "error_message": ending.reason,
        "steps_run": ending.closing.steps_run,
        "steps_skipped": ending.closing.steps_skipped,
    }


class EndingWrites:
    """Writes batches of :class:`~jobguard.backends.base.Ending` over one :class:`Driver`."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def settle(self, endings: Sequence[Ending]) -> list[JobGuardError | None]:
        """Write a batch of endings in one transaction, each all-or-nothing on its own.

        First as a set (a few statements for the whole batch, each item's refusals found before
        it writes); if that fails (a row the driver cannot store, or a claim taken in between),
        the transaction is rolled back and the batch runs again one item at a time, each in its
        own savepoint, through the same statements.
        """
        written = [ending for ending in endings if ending.writes]
        if not written:
            return [None] * len(endings)
        try:
            if self._in_one_statement(written):
                results = self._statement(written)
            else:
                results = self.driver.write(lambda tx: self._batch(tx, written, careful=False))
        except _RedoCarefully:
            results = self.driver.write(lambda tx: self._batch(tx, written, careful=True))
        found = iter(results)
        return [next(found) if ending.writes else None for ending in endings]

    def _in_one_statement(self, endings: Sequence[Ending]) -> bool:
        """Whether the batch is written by ``settle_set`` alone, outside a transaction: on
        PostgreSQL, when no ending is a refusal (those mark their attempt rows too) and no job
        comes twice (see :meth:`_set`)."""
        return (
            self.driver.dialect == "postgres"
            and not any(ending.outcome in REFUSED_OUTCOMES for ending in endings)
            and _one_per_job(endings)
        )

    def _statement(self, endings: Sequence[Ending]) -> list[JobGuardError | None]:
        """The batch as one ``settle_set`` of its own: one round trip, atomic, no BEGIN nor
        COMMIT. A claim taken in between fails the statement (``strict``), which then wrote
        nothing, and the batch is run carefully; so does a value the database refused. Cut off
        (its connection broke), it may or may not have landed: the batch is written again in a
        transaction, where an ending its first run wrote is known by its attempt row."""
        items = [_set_item(ending) for ending in endings]
        # The store clock if known without a round trip, else read by the statement itself.
        params = {"items": items, "strict": True}
        try:
            (row,) = self.driver.write_statement("settle_set", params)
        except StatementRefused as exc:
            raise _RedoCarefully() from exc
        except StatementCutOff:
            return self.driver.write(lambda tx: self._batch(tx, endings, careful=False, again=True))
        moved = set(row["moved"])
        if len(moved) == len(endings):
            return [None] * len(endings)
        return self.driver.read(lambda tx: self._refusals(tx, endings, moved))

    def _batch(
        self, tx: Tx, endings: Sequence[Ending], *, careful: bool, again: bool = False
    ) -> list[JobGuardError | None]:
        """``again``: the batch may have been written already (see :meth:`_statement`)."""
        now = tx.now()
        if not careful:
            try:
                return self._set(tx, endings, now, again)
            except _RedoCarefully:
                raise
            except Exception as exc:  # a row the driver cannot store, say: find which, alone
                raise _RedoCarefully() from exc
        refused: list[JobGuardError | None] = []
        for ending in endings:
            try:
                with tx.savepoint():
                    (refusal,) = self._set(tx, [ending], now, again)
                refused.append(refusal)
            except _RedoCarefully:  # its claim was taken between its proof and its write
                refused.append(messages.claim_lost(_claim_of(ending) or ""))
            except StoreUnavailableError as exc:
                refused.append(exc)
            except Exception as exc:
                # One job's unstorable row (text the driver cannot encode, say) must not fail
                # the others: its own ending is left to its lease.
                job = ending.guard.job_id
                failed = StoreUnavailableError(f"job {job}: its ending could not be stored: {exc}")
                failed.__cause__ = exc
                refused.append(failed)
        return refused

    def _set(
        self, tx: Tx, endings: Sequence[Ending], now: float, again: bool
    ) -> list[JobGuardError | None]:
        """Every ending of the batch: jobs moved where every proof holds, then their locks
        released, operations completed or unclaimed, attempts closed or marked."""
        moving = [ending for ending in endings if ending.outcome != Outcome.LEASE_REFUSED]
        if not _one_per_job(moving):
            # Two deliveries of one job (a stale lease and the current one): what settle_jobs
            # returns (job ids) cannot tell them apart, so the careful path takes them in turn.
            raise _RedoCarefully()
        if self.driver.dialect == "postgres":
            moved = self._set_in_one(tx, moving, now)
            refused = self._refusals(tx, endings, moved, again)
            self._mark(tx, endings, now)
            return refused
        items = [_job_item(ending) for ending in moving]
        moved = (
            {row["id"] for row in tx.all("settle_jobs", {"items": items, "now": now})}
            if items
            else set()
        )
        refused = self._refusals(tx, endings, moved, again)
        done = [ending for ending in moving if ending.guard.job_id in moved]
        # Lock rows before operation rows, as a fetch's begin takes them: two workers, one
        # settling and one beginning, never wait for each other in opposite orders.
        release_locks(tx, [ending.guard for ending in done])
        completing = [
            {
                "key": claim,
                "owner_lease": ending.guard.lease_token,
                "result": ending.result_json,
                "external_ref": ending.external_ref,
                "fence": fence_of(ending.guard),
            }
            for ending in done
            if (claim := _claim_of(ending)) is not None
        ]
        if completing and tx.run("complete_operations", {"items": completing, "now": now}) != len(
            completing
        ):
            raise _RedoCarefully()  # proven by settle_jobs a moment ago: a claim taken since
        dropping = [item for ending in done if (item := _operation_item(ending)) is not None]
        if dropping:
            tx.run("release_operations", {"items": dropping, "now": now})
        closing = [_attempt_item(e) for e in done if e.outcome not in REFUSED_OUTCOMES]
        if closing:
            tx.run("close_attempts", {"items": closing, "now": now})
        self._mark(tx, endings, now)
        return refused

    @staticmethod
    def _set_in_one(tx: Tx, moving: Sequence[Ending], now: float) -> set[int]:
        """What :meth:`_set` writes for ``moving``, in one statement (``settle_set``): returns
        the ids of the jobs it moved."""
        if not moving:
            return set()
        items = [_set_item(ending) for ending in moving]
        row = tx.one("settle_set", {"items": items, "now": now, "strict": False})
        assert row is not None  # a SELECT of sub-queries always returns its one row
        moved = set(row["moved"])
        completing = sum(1 for e in moving if e.guard.job_id in moved and _claim_of(e) is not None)
        if row["completed"] != completing:
            raise _RedoCarefully()  # proven in the same statement: a claim taken since
        return moved

    @staticmethod
    def _refusals(
        tx: Tx, endings: Sequence[Ending], moved: set[int], again: bool = False
    ) -> list[JobGuardError | None]:
        """Each ending's refusal: ``None`` where its job moved (or it was a refusal itself), or,
        ``again``, where its attempt row shows this very ending written by the first run."""
        return [
            None
            if ending.outcome in REFUSED_OUTCOMES
            or ending.guard.job_id in moved
            or (again and _written_before(tx, ending))
            else _refusal(tx, ending)
            for ending in endings
        ]

    @staticmethod
    def _mark(tx: Tx, endings: Sequence[Ending], now: float) -> None:
        """Refused deliveries' own attempt rows say so."""
        marking = [_mark_item(e) for e in endings if e.outcome in REFUSED_OUTCOMES]
        if marking:
            tx.run("mark_attempts", {"items": marking, "now": now})


def _one_per_job(endings: Sequence[Ending]) -> bool:
    """No job comes twice (a stale lease and the current one of one job)."""
    return len({ending.guard.job_id for ending in endings}) == len(endings)


def _written_before(tx: Tx, ending: Ending) -> bool:
    """Whether ``ending``'s attempt row was closed with its outcome: only this ending's own
    settle writes that (a lost lease is closed as ``lost``, a refusal marks its own kind)."""
    guard = ending.guard
    return any(
        row["id"] == guard.attempt_id
        and row["outcome"] == ending.outcome.value
        and row["ended_at"] is not None
        for row in tx.all("attempts_of_job", {"job_id": guard.job_id})
    )


def _refusal(tx: Tx, ending: Ending) -> GuardLost:
    """Why an ending moved no job: which of its proofs failed."""
    guard = ending.guard
    if ending.outcome not in SUCCESS_OUTCOMES:
        guard = replace(guard, lock=None, slot=None)  # moving a job back proves only its lease
    try:
        verify(tx, guard, _claim_of(ending))
    except GuardLost as exc:
        return exc
    # Every proof holds now: the lease moved on and back in between (it cannot, but say so).
    return messages.stale_lease(guard.job_id, guard.lease_token, "settle")

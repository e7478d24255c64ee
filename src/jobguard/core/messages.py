"""Every sentence the store's facts turn into, in one place.

Stores record facts (reason codes, counts, tokens); the words a person reads are made here, so a
SQL file or a Lua script never holds a sentence and every backend says the same thing.
"""

from __future__ import annotations

import re

from jobguard.exceptions import LeaseLostError, StaleFenceError
from jobguard.models import BusyReason, DeadCode, Delivery, LockGrant

STEP_CANNOT_END_ITS_TRANSACTION = (
    "a db_step function may not begin, commit or roll back: its rows commit together with the "
    "step record"
)


def _step_cannot_change(which: str, allowed: str) -> str:
    return (
        f"a step's SQL may not change what its connection keeps after the step ({which}): the "
        f"connection is the worker's, and the change would reach the jobs that use it next; "
        f"{allowed}"
    )


STEP_CANNOT_CHANGE_ITS_SESSION = _step_cannot_change(
    "SET without LOCAL, RESET, PREPARE, DEALLOCATE, LISTEN, UNLISTEN, DISCARD",
    "SET LOCAL ends with the step",
)
STEP_CANNOT_CHANGE_ITS_SQLITE_CONNECTION = _step_cannot_change(
    "a PRAGMA given a value, ATTACH, DETACH",
    "PRAGMA defer_foreign_keys ends with the step, and a PRAGMA read is allowed",
)


def schema_lost(failure: str, schema: str) -> str:
    """Why a store whose tables lost what jobguard's statements name cannot be used: ``failure``
    (the database's one-line error) and where jobguard's ``schema`` lives."""
    return (
        f"{failure}; {schema} was dropped or changed while in use (run `jobguard migrate`, or "
        "the jobguard version that migrated it)"
    )


def never_reported_back(attempts: int, max_attempts: int) -> str:
    """Why a job whose last allowed delivery died with its worker is in the dead letter queue."""
    return (
        f"attempts exhausted ({attempts}/{max_attempts}): the worker never reported back "
        "(crashed, killed or stalled past its lease)"
    )


_STOOD_STILL = re.compile(r"the worker process stood still for (\d+(?:\.\d+)?) s")


def stood_still(stalled_s: float) -> str:
    """Added to a lost lease's refusal when the worker's heartbeat overslept (a stall)."""
    return (
        f"; the worker process stood still for {stalled_s:.2f} s (its heartbeat did not run: "
        "the process was stopped, paused or swapped out), so its lease was not renewed"
    )


def stalled_s_of(message: str | None) -> float | None:
    """How long the worker stood still, read back from a refusal :func:`stood_still` marked."""
    found = _STOOD_STILL.search(message or "")
    return float(found.group(1)) if found else None


def dead_reason(code: str | None, text: str | None, attempts: int, max_attempts: int) -> str | None:
    """The reason shown for a dead job: the stored text, or the words for its code.

    A code this version does not know (a newer one wrote it) is named beside the text.
    """
    if code and code not in set(DeadCode):
        unknown = f"dead code {code!r}, unknown to this version of jobguard"
        return f"{text} ({unknown})" if text else unknown
    if text:
        return text
    if code == DeadCode.LOST:
        return never_reported_back(attempts, max_attempts)
    return code


def busy(
    reason: BusyReason,
    resource_key: str | None,
    operation_key: str | None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
) -> str:
    """Why a delivery must wait: the resource lock, every slot or the operation claim is held."""
    if reason is BusyReason.LOCK:
        return f"resource is busy: {resource_key}"
    if reason is BusyReason.SLOT:
        return f"concurrency limit reached: {concurrency_limit} running for {concurrency_key}"
    return f"operation {operation_key!r} is in progress"


def held_name(grant: LockGrant) -> str:
    """How a refusal names what a grant held: its resource, or its key and slot number."""
    if grant.slot is None:
        return grant.resource
    return f"{grant.resource} (concurrency slot {grant.slot})"


def stale_lease(job_id: int, lease_token: str, what: str = "write") -> LeaseLostError:
    """The refusal of a write whose lease token is no longer the job's."""
    return LeaseLostError(f"job {job_id}: lease {lease_token[:8]} is stale; {what} refused")


def claim_lost(operation_key: str) -> LeaseLostError:
    """The refusal of a write by a delivery that no longer holds the operation's claim."""
    return LeaseLostError(f"operation {operation_key!r} is no longer claimed by this delivery")


def stale_fence(resource: str, fence: int, newest: int) -> StaleFenceError:
    """The refusal of a write whose lock grant is older than the newest for its resource."""
    return StaleFenceError(
        f"resource {resource!r}: fence {fence} is stale (fence {newest} was granted since)"
    )


def shared_failure(error_type: str, error: str, peers: int) -> str:
    """Why a repeated error was not taken for poison: other jobs of the task fail alike."""
    others = "1 other job" if peers == 1 else f"{peers} other jobs"
    return f"{error_type}: {error} (an outage, not poison: {others} of the task failed alike)"


def lease_overdue(elapsed_s: float, period_s: float) -> str:
    """Why a delivery is taken for lost when its renewals stopped getting through."""
    return (
        f"lease not renewed for {elapsed_s:.1f}s, its whole length of {period_s:g}s (store "
        "unreachable or not answering): it may have expired and gone to another worker"
    )


def hard_limit_passed(job_id: int, running_s: float, limit_s: float | None) -> str:
    """Why a run was killed: it passed its hard time limit (process mode)."""
    limit = f"{limit_s:g}s (time_limit_s)" if limit_s is not None else "its hard time limit"
    return (
        f"job {job_id} ran {running_s:.1f}s, past its hard time limit of {limit}: its worker "
        "process was killed (SIGKILL) and replaced"
    )


def cancelled(job_id: int, actor: str) -> str:
    """Why a job an operator cancelled is in the dead letter queue (and its attempt ended)."""
    return f"job {job_id} was cancelled by {actor}"


def cancel_refused(job_id: int, status: str) -> str:
    """Why a cancel changed nothing: the job is already over."""
    return f"job {job_id} is {status}: only a queued, scheduled or running job can be cancelled"


def needs_hard_limits(delivery: Delivery) -> str:
    """Why a thread-mode worker leaves a job with a hard time limit for another worker."""
    return (
        f"job {delivery.job_id} has a hard time limit (time_limit_s={delivery.time_limit_s:g}), "
        "which only a process-mode worker (jobguard worker --processes N) enforces; a "
        "thread-mode worker does not run it"
    )

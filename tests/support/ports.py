"""Small helpers the backend conformance tests share: fetching a delivery, its guard, the
endings a worker settles (built as the pipeline builds them), and single-delivery forms of the
batch-first port methods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobguard.backends.base import (
    Backend,
    BeginRequest,
    Closing,
    DeliveryRules,
    Ending,
    ErrorInfo,
)
from jobguard.exceptions import JobGuardError
from jobguard.models import DeadCode, Delivery, Guard, JobSpec, Operation, Outcome


def fetch(
    backend: Backend,
    queues: Sequence[str],
    limit: int,
    worker: str,
    rules: Mapping[str, DeliveryRules] | None = None,
) -> list[Delivery]:
    """Lease up to ``limit`` ready jobs without beginning them (the port's ``fetch_prepared``
    with no ``begin``): the deliveries alone."""
    return [item.delivery for item in backend.fetch_prepared(queues, limit, worker, rules)]


def fetch_one(
    backend: Backend, queues: Sequence[str] = ("default",), worker: str = "w1"
) -> Delivery:
    """Fetch exactly one delivery; fail the test if there is not exactly one."""
    found = fetch(backend, queues, 1, worker)
    assert len(found) == 1, found
    return found[0]


def guard_of(delivery: Delivery) -> Guard:
    """The guard a worker holds for a fresh delivery (no lock)."""
    return Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)


def success(
    guard: Guard,
    closing: Closing,
    outcome: Outcome = Outcome.COMPLETED,
    operation_key: str | None = None,
    result_json: str | None = None,
    external_ref: str | None = None,
) -> Ending:
    """The ending of a delivery that succeeded (or found its operation already processed)."""
    return Ending(
        guard,
        closing,
        outcome,
        operation_key=operation_key,
        result_json=result_json,
        external_ref=external_ref,
    )


def retrying(
    guard: Guard,
    closing: Closing,
    *,
    delay_s: float,
    error: ErrorInfo,
    operation_key: str | None = None,
) -> Ending:
    """The ending of a delivery that failed and runs again after ``delay_s``."""
    return Ending(
        guard,
        closing,
        Outcome.RETRY,
        delay_s,
        reason="retry",
        error=error,
        operation_key=operation_key,
    )


def deferring(guard: Guard, closing: Closing, *, delay_s: float, reason: str) -> Ending:
    """The ending of a delivery whose resource was busy: handed back, uncharged."""
    busy = ErrorInfo(type="ResourceBusy", message=reason)
    return Ending(guard, closing, Outcome.DEFERRED, delay_s, reason=reason, error=busy)


def burying(
    guard: Guard,
    closing: Closing,
    *,
    code: DeadCode,
    reason: str,
    error: ErrorInfo | None,
    operation_key: str | None = None,
) -> Ending:
    """The ending of a delivery whose job goes to the dead letter queue."""
    return Ending(
        guard,
        closing,
        Outcome.DEAD,
        code=code,
        reason=reason,
        error=error,
        operation_key=operation_key,
    )


def refusing(guard: Guard, outcome: Outcome, closing: Closing, message: str) -> Ending:
    """The ending of a stale delivery whose write was refused (its attempt row is marked)."""
    error = ErrorInfo(
        "LeaseLostError" if outcome == Outcome.LEASE_REFUSED else "StaleFenceError", message
    )
    return Ending(guard, closing, outcome, reason=message, error=error)


def settle_one(backend: Backend, ending: Ending) -> None:
    """Settle one ending; raise its refusal, as a worker would see it."""
    (refusal,) = backend.settle([ending])
    if refusal is not None:
        raise refusal


def finish(
    backend: Backend,
    guard: Guard,
    closing: Closing,
    *,
    outcome: Outcome = Outcome.COMPLETED,
    operation_key: str | None = None,
    result_json: str | None = None,
    external_ref: str | None = None,
) -> None:
    """Settle one success; raise its refusal."""
    settle_one(backend, success(guard, closing, outcome, operation_key, result_json, external_ref))


def retry(
    backend: Backend,
    guard: Guard,
    closing: Closing,
    *,
    delay_s: float,
    error: ErrorInfo,
    operation_key: str | None = None,
) -> None:
    """Settle one retry; raise its refusal."""
    settle_one(
        backend,
        retrying(guard, closing, delay_s=delay_s, error=error, operation_key=operation_key),
    )


def defer(backend: Backend, guard: Guard, closing: Closing, *, delay_s: float, reason: str) -> None:
    """Settle one deferral; raise its refusal."""
    settle_one(backend, deferring(guard, closing, delay_s=delay_s, reason=reason))


def bury(
    backend: Backend,
    guard: Guard,
    closing: Closing,
    *,
    code: DeadCode,
    reason: str,
    error: ErrorInfo | None,
    operation_key: str | None = None,
) -> None:
    """Settle one burial; raise its refusal."""
    settle_one(
        backend,
        burying(guard, closing, code=code, reason=reason, error=error, operation_key=operation_key),
    )


def releasing(guard: Guard, operation_key: str | None = None) -> Ending:
    """The ending of a delivery handed back at shutdown, uncharged."""
    return Ending(guard, Closing(0.0), Outcome.RELEASED, operation_key=operation_key)


def release(
    backend: Backend, guards: Sequence[Guard], operation_keys: Sequence[str | None] = ()
) -> int:
    """Settle releases as a worker's shutdown does; how many were handed back (stale ones are
    skipped)."""
    keys = list(operation_keys) or [None] * len(guards)
    refused: list[JobGuardError | None] = backend.settle(
        [releasing(guard, key) for guard, key in zip(guards, keys, strict=True)]
    )
    return sum(refusal is None for refusal in refused)


def record_refusal(
    backend: Backend, guard: Guard, outcome: Outcome, closing: Closing, message: str
) -> None:
    """Settle one refusal (it is never refused itself)."""
    settle_one(backend, refusing(guard, outcome, closing, message))


def begin_operation(
    backend: Backend, guard: Guard, key: str, resource_key: str | None
) -> Operation | None:
    """Claim the operation record under the lock ``guard`` already holds (if any).

    ``None`` when another live delivery holds the claim (or the resource is not ``guard``'s).
    """
    request = BeginRequest(resource_key=resource_key, operation_key=key)
    begun = backend.begin(guard, request)
    # The port's promise: the operation (claimed, or already completed), or why it must wait;
    # never both, never neither.
    assert (begun.operation is None) == (begun.busy is not None), begun
    return begun.operation


def locked_delivery(backend: Backend, spec: JobSpec, name: str, lock_ttl_s: float) -> Guard:
    """Enqueue ``spec`` (on queue ``name``), fetch it and begin it with lock ``res:name`` and
    claim ``op:name``; the guard holding the grant."""
    backend.enqueue(spec)
    delivery = fetch_one(backend, [name])
    begun = backend.begin(
        guard_of(delivery),
        BeginRequest(
            resource_key=f"res:{name}",
            lock_owner=f"w1/{name}",
            lock_ttl_s=lock_ttl_s,
            operation_key=f"op:{name}",
        ),
    )
    assert begun.grant is not None
    return Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id, begun.grant)


def keyed_spec(queue: str, resource: str | None, key: str | None, lease_s: float = 60.0) -> JobSpec:
    """A job with the given resource and operation keys (either may be ``None``)."""
    return JobSpec(
        task="tests.keyed",
        queue=queue,
        payload="{}",
        max_attempts=3,
        visibility_timeout_s=lease_s,
        operation_key=key,
        resource_key=resource,
    )


def rules_for(*tasks: str, lock_ttl_s: float = 30.0) -> dict[str, DeliveryRules]:
    """Delivery rules under which a fetch begins the keyed jobs of ``tasks``."""
    return {task: DeliveryRules(None, 3, lock_ttl_s) for task in tasks}


def request_for(delivery: Delivery) -> BeginRequest | None:
    """What a fetch under :func:`rules_for` asks for: the job's keys, a 30 s lock (its owner
    token is the store's own)."""
    if delivery.resource_key is None and delivery.operation_key is None:
        return None
    return BeginRequest(
        resource_key=delivery.resource_key,
        lock_owner="",
        lock_ttl_s=30.0,
        operation_key=delivery.operation_key,
    )

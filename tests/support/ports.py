"""Small helpers the backend conformance tests share: fetching a delivery, its guard, and the
single-delivery forms of the batch-first port methods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobguard.backends.base import (
    Backend,
    BeginRequest,
    Closing,
    DeliveryRules,
    FinishRequest,
)
from jobguard.models import Delivery, Guard, JobSpec, Operation, Outcome


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
    """Ack one delivery through ``finish_many``; raise its refusal, as a worker would see it."""
    request = FinishRequest(guard, closing, outcome, operation_key, result_json, external_ref)
    (refusal,) = backend.finish_many([request])
    if refusal is not None:
        raise refusal


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


def request_for(delivery: Delivery) -> BeginRequest | None:
    """What the pipeline asks for at a fetch: the job's keys, an owner token of its own."""
    if delivery.resource_key is None and delivery.operation_key is None:
        return None
    return BeginRequest(
        resource_key=delivery.resource_key,
        lock_owner=f"owner-{delivery.job_id}",
        lock_ttl_s=30.0,
        operation_key=delivery.operation_key,
    )

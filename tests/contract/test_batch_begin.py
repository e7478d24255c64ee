"""The batch begin of a fetch equals beginning its deliveries one by one (G3, G4).

``fetch_prepared`` takes the locks and operation claims of a whole fetched batch with a few
set-based statements. Whatever the batch and whatever the store already holds (locks of live
and expired owners, operations completed, claimed by a live delivery or by a dead one), the
outcome must be the one of ``begin`` called for each delivery in the batch's lock order: the
same deliveries busy for the same reason, the same fences granted, the same operation records.
Two fresh stores of one backend get the same history; one begins in a batch, the other one by
one, and hypothesis looks for a history where they differ.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobguard.backends.base import Backend, BeginRequest, Begun, Closing
from jobguard.models import Guard, JobSpec, Operation
from jobguard.testing import ControlledClock
from tests.contract.conftest import BACKENDS
from tests.support.ports import fetch, finish, keyed_spec, request_for, rules_for

RESOURCES = st.sampled_from([None, "dock:1", "dock:2"])
KEYS = st.sampled_from([None, "op:a", "op:b", "op:c"])


@dataclass(frozen=True)
class Held:
    """Something the store already holds before the batch: a lock or an operation."""

    kind: str  # "lock", "completed" (operation), "claimed" (operation of a running job)
    name: str
    expired: bool


HELD = st.builds(
    Held,
    kind=st.sampled_from(["lock", "completed", "claimed"]),
    name=st.sampled_from(["dock:1", "dock:2", "op:a", "op:b", "op:c"]),
    expired=st.booleans(),
)
JOBS = st.lists(st.tuples(RESOURCES, KEYS), min_size=1, max_size=6)


def _lock_order(request: BeginRequest) -> tuple[str, str]:
    """The order the port documents for a batch: by resource, then unlocked ones by key."""
    if request.resource_key is not None:
        return request.resource_key, ""
    return "", request.operation_key or ""


def _hold(backend: Backend, clock: ControlledClock, held: list[Held]) -> None:
    """Give the store what ``held`` says, then let the expired ones run out."""
    for item in held:
        if item.kind == "lock" and (item.name.startswith("dock") or not item.expired):
            backend.acquire_lock(item.name, f"earlier-{item.name}", 5.0 if item.expired else 60.0)
        elif item.name.startswith("op:") and backend.get_operation(item.name) is None:
            backend.enqueue(
                JobSpec(
                    task="tests.earlier",
                    queue=f"earlier-{item.name}",
                    payload="{}",
                    max_attempts=3,
                    visibility_timeout_s=5.0 if item.expired else 60.0,
                )
            )
            (delivery,) = fetch(backend, [f"earlier-{item.name}"], 1, "earlier")
            guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)
            backend.begin(guard, BeginRequest(operation_key=item.name))
            if item.kind == "completed":
                finish(backend, guard, Closing(0.1), operation_key=item.name)
    clock.advance(6.0)  # every "expired" lock and claim holder has run out


def _summary(backend: Backend, begun: dict[int, Begun | None]) -> dict[str, Any]:
    """What a begin decides, without the tokens that differ between two stores."""

    def operation(op: Operation | None) -> tuple[Any, ...] | None:
        return None if op is None else (op.key, op.status, op.attempts, op.fence, op.steps)

    return {
        "begun": {
            job: None
            if b is None
            else (b.busy, b.grant.fence if b.grant else None, operation(b.operation))
            for job, b in begun.items()
        },
        "fences": {name: backend.lock_fence(name) for name in ("dock:1", "dock:2")},
        "operations": {
            key: operation(backend.get_operation(key)) for key in ("op:a", "op:b", "op:c")
        },
        "attempts": [
            (a.job_id, a.lock_owner is not None, a.fence)
            for a in backend.attempts(limit=1000)
            if a.queue == "batch"
        ],
    }


def _store(backend_name: str) -> tuple[Backend, ControlledClock, Path]:
    directory = Path(tempfile.mkdtemp(prefix="jobguard-batch-"))
    clock = ControlledClock()
    return BACKENDS[backend_name](directory, clock), clock, directory


@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(held=st.lists(HELD, max_size=4), jobs=JOBS)
def test_a_batch_begin_decides_as_beginning_one_by_one(
    backend_name: str, held: list[Held], jobs: list[tuple[str | None, str | None]]
) -> None:
    results = []
    for batched in (True, False):
        backend, clock, directory = _store(backend_name)
        try:
            _hold(backend, clock, held)
            for resource, key in jobs:
                backend.enqueue(keyed_spec("batch", resource, key, lease_s=10.0))
            if batched:
                prepared = backend.fetch_prepared(["batch"], 10, "w", rules_for("tests.keyed"))
                begun = {p.delivery.job_id: p.begun for p in prepared}
                for b in begun.values():
                    if b is not None and b.operation is not None:  # as stored, field by field
                        assert b.operation == backend.get_operation(b.operation.key)
            else:
                deliveries = fetch(backend, ["batch"], 10, "w")
                asked = [(d, r) for d in deliveries if (r := request_for(d)) is not None]
                begun = {d.job_id: None for d in deliveries}
                for delivery, request in sorted(asked, key=lambda pair: _lock_order(pair[1])):
                    guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)
                    one = begun[delivery.job_id] = backend.begin(guard, request)
                    if one.operation is not None:  # as stored, field by field
                        assert one.operation == backend.get_operation(one.operation.key)
            results.append(_summary(backend, begun))
        finally:
            backend.close()
            shutil.rmtree(directory, ignore_errors=True)
    assert results[0] == results[1]

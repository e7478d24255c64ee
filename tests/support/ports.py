"""Small helpers the backend conformance tests share: fetching a delivery and its guard."""

from __future__ import annotations

from collections.abc import Sequence

from jobguard.backends.base import Backend
from jobguard.models import Delivery, Guard


def fetch_one(
    backend: Backend, queues: Sequence[str] = ("default",), worker: str = "w1"
) -> Delivery:
    """Fetch exactly one delivery; fail the test if there is not exactly one."""
    found = backend.fetch(queues, 1, worker)
    assert len(found) == 1, found
    return found[0]


def guard_of(delivery: Delivery) -> Guard:
    """The guard a worker holds for a fresh delivery (no lock)."""
    return Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)

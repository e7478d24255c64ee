"""The heartbeat beats often enough for the shortest lease or lock in flight (G2.2, G3.3)."""

from __future__ import annotations

from dataclasses import replace

from jobguard.context import InFlight
from jobguard.heartbeat import IDLE_INTERVAL_S, MIN_INTERVAL_S, renewal_interval_s
from jobguard.models import Delivery, Guard

LEASE = "lease-1"


def _delivery(visibility_timeout_s: float, lock_ttl_s: float | None) -> Delivery:
    return Delivery(
        job_id=1,
        task="t",
        queue="q",
        payload="{}",
        attempt=1,
        max_attempts=5,
        deferrals=0,
        created_at=0.0,
        lease_token=LEASE,
        attempt_id=1,
        lease_expires_at=visibility_timeout_s,
        visibility_timeout_s=visibility_timeout_s,
        operation_key=None,
        resource_key="r" if lock_ttl_s else None,
        lock_ttl_s=lock_ttl_s,
        error_signature=None,
        same_error_count=0,
    )


def _inflight(delivery: Delivery) -> InFlight:
    return InFlight(delivery, Guard(delivery.job_id, delivery.lease_token, 1), None)


def test_interval_is_a_third_of_the_shortest_lease() -> None:
    """Two beats may fail before a lease expires."""
    items = [_inflight(_delivery(30, None)), _inflight(_delivery(9, None))]
    assert renewal_interval_s(items) == 3.0


def test_lock_ttl_counts_before_the_lock_is_granted() -> None:
    """A 1 s lock under a 4 s lease: the beat must follow the lock, granted or not yet."""
    item = _inflight(_delivery(4, 1.5))
    assert item.lock_ttl_s is None  # not granted yet
    assert renewal_interval_s([item]) == 0.5


def test_idle_and_tiny_timeouts_are_bounded() -> None:
    """No work: a slow idle tick; absurdly short leases: never a busy loop."""
    assert renewal_interval_s([]) == IDLE_INTERVAL_S
    item = _inflight(replace(_delivery(0.01, None)))
    assert renewal_interval_s([item]) == MIN_INTERVAL_S

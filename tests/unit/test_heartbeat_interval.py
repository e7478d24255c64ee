"""The heartbeat beats often enough for the shortest lease or lock in flight (G2.2, G3.3)."""

from __future__ import annotations

import time
from dataclasses import replace

from jobguard.context import InFlight
from jobguard.heartbeat import IDLE_INTERVAL_S, MIN_INTERVAL_S, first_due, renewal_interval_s
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


def test_a_delivery_no_beat_tried_is_due_an_interval_after_its_lease_began() -> None:
    """A fetch that took long (a slow network) or overlapped the last beat: the delivery's first
    renewal is due a third of its lease after the store started it, not at the beat after next;
    once a beat tried it, the regular schedule holds (a failing renewal cannot make it spin)."""
    item = _inflight(_delivery(3.0, None))
    item.renewed_at = 100.0  # the lease began then, on this worker's clock
    assert first_due([item], next_beat=102.5, interval_s=1.0) == 101.0
    assert first_due([item], next_beat=100.5, interval_s=1.0) == 100.5
    item.renewal_tried = True
    assert first_due([item], next_beat=102.5, interval_s=1.0) == 102.5
    assert first_due([], next_beat=102.5, interval_s=1.0) == 102.5


def test_a_refusal_met_before_the_heartbeat_wakes_still_sees_the_stall() -> None:
    """The process resumed after standing still and the handler's thread ran first: the
    heartbeat's wait, still overrunning by more than a beat, is the stall it has not marked."""
    item = _inflight(_delivery(3, None))
    assert item.stood_still_s() == 0.0  # no wait recorded
    item.beat_wake_at, item.beat_interval_s = time.monotonic() + 1.0, 1.0
    assert item.stood_still_s() == 0.0  # asleep, due later
    item.beat_wake_at = time.monotonic() - 0.5
    assert item.stood_still_s() == 0.0  # late by less than a beat: a busy machine, not a stall
    item.beat_wake_at = time.monotonic() - 2.0
    assert item.stood_still_s() >= 2.0
    item.beat_wake_at, item.stalled_s = None, 4.0  # awake: what it marked counts
    assert item.stood_still_s() == 4.0

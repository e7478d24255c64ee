"""Conformance tests of concurrency slots: at most N holders per key, each slot fenced (G3.6).

A job with a concurrency key and a limit N begins only with one of the key's slots 0..N-1, taken
in the begin's own transaction (a fetch's batch, or ``begin``), renewed with the lease, released
when its ending is settled, and free again after its TTL when its holder died. Every slot is a
lock of its own: a stale holder's writes are refused by the slot's fence. Runs against every
backend in ``conftest.BACKENDS``; expiry is driven by the controlled clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobguard.backends.base import (
    Backend,
    BeginRequest,
    Begun,
    Closing,
    DeliveryRules,
    ErrorInfo,
    Prepared,
    Renewal,
)
from jobguard.exceptions import StaleFenceError
from jobguard.models import BusyReason, DeadCode, Guard, JobSpec, JobStatus, LockGrant
from jobguard.testing import ControlledClock
from tests.support.ports import burying, deferring, fetch, guard_of, retrying, success

TASK = "tests.slotted"
TTL_S = 10.0
RULES = {TASK: DeliveryRules(visibility_timeout_s=None, max_attempts=5, lock_ttl_s=TTL_S)}
CLOSING = Closing(duration_s=0.1)


def slotted(key: str = "acct:1", limit: int = 3, **changes: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "task": TASK,
        "queue": "default",
        "payload": "{}",
        "max_attempts": 5,
        "visibility_timeout_s": 60.0,
        "concurrency_key": key,
        "concurrency_limit": limit,
        "lock_ttl_s": TTL_S,
    }
    fields.update(changes)
    return JobSpec(**fields)


def held(item: Prepared) -> Guard:
    """The guard a worker holds for a prepared delivery: its lease, lock and slot."""
    assert item.begun is not None
    return Guard(
        item.delivery.job_id,
        item.delivery.lease_token,
        item.delivery.attempt_id,
        lock=item.begun.grant,
        slot=item.begun.slot,
    )


def begun_of(item: Prepared) -> Begun:
    """What the fetch's begin gave a delivery of the slotted task (it always begins one)."""
    assert item.begun is not None, item
    return item.begun


def slot_of(item: Prepared) -> LockGrant:
    """The slot a prepared delivery was granted (the test expects one)."""
    slot = begun_of(item).slot
    assert slot is not None, item
    return slot


def fetch_begun(backend: Backend, limit: int, worker: str = "w1") -> list[Prepared]:
    return backend.fetch_prepared(["default"], limit, worker, RULES)


def holders(backend: Backend, key: str = "acct:1") -> dict[int, str]:
    return {grant.slot or 0: grant.owner for grant in backend.slot_grants(key) if grant.owner}


def test_a_fetched_batch_of_one_key_gets_at_most_its_limit_each_slot_with_its_own_fence(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.6: five deliveries of a key limited to 3 in one fetch: three slots 0..2 (fence 1
    each, expiring after the rule's TTL), two busy holding nothing."""
    for _ in range(5):
        backend.enqueue(slotted())
    batch = fetch_begun(backend, 5)
    assert len(batch) == 5
    granted = [item for item in batch if item.begun and item.begun.busy is None]
    busy = [item for item in batch if item.begun and item.begun.busy is BusyReason.SLOT]
    assert (len(granted), len(busy)) == (3, 2)
    slots = sorted((slot_of(item) for item in granted), key=lambda grant: grant.slot or 0)
    assert [(s.resource, s.slot, s.fence) for s in slots] == [
        ("acct:1", 0, 1),
        ("acct:1", 1, 1),
        ("acct:1", 2, 1),
    ]
    assert all(s.expires_at == clock() + TTL_S for s in slots)
    assert all(item.begun.slot is None for item in busy if item.begun)
    owners = {s.owner for s in slots}
    assert set(holders(backend).values()) == owners
    assert len(owners) == 3


def test_begins_one_by_one_fill_the_free_slots_then_are_busy(backend: Backend) -> None:
    """G3.6: ``begin`` outside a fetch takes the lowest free slot; past the limit it is busy
    and takes nothing."""
    for _ in range(3):
        backend.enqueue(slotted(limit=2))
    deliveries = fetch(backend, ["default"], 3, "w1")  # no rules: leased, not begun
    begun = [
        backend.begin(
            guard_of(d),
            BeginRequest(
                lock_owner=f"owner-{d.job_id}",
                lock_ttl_s=TTL_S,
                concurrency_key=d.concurrency_key,
                concurrency_limit=d.concurrency_limit,
            ),
        )
        for d in deliveries
    ]
    assert [b.slot.slot if b.slot else None for b in begun] == [0, 1, None]
    assert begun[2].busy is BusyReason.SLOT
    assert holders(backend) == {
        0: f"owner-{deliveries[0].job_id}",
        1: f"owner-{deliveries[1].job_id}",
    }


def test_keys_are_independent_and_a_limit_of_one_admits_one(backend: Backend) -> None:
    """G3.6: slots count per key; other keys' holders do not fill this key's slots."""
    backend.enqueue(slotted("acct:1", 1))
    backend.enqueue(slotted("acct:2", 1))
    backend.enqueue(slotted("acct:1", 1))
    batch = fetch_begun(backend, 3)
    busy = [item.begun.busy if item.begun else None for item in batch]
    assert busy == [None, None, BusyReason.SLOT]


def test_a_settled_ending_frees_its_slot_and_the_next_grant_has_a_larger_fence(
    backend: Backend,
) -> None:
    """G3.6: a success frees the slot in its settle; the slot's next holder gets the next
    fence. A deferral of a busy delivery hands its attempt back (uncharged)."""
    backend.enqueue(slotted(limit=1))
    backend.enqueue(slotted(limit=1))
    first, waiting = fetch_begun(backend, 2)
    assert begun_of(waiting).busy is BusyReason.SLOT
    (refusal,) = backend.settle([deferring(held(waiting), CLOSING, delay_s=0.0, reason="full")])
    assert refusal is None
    assert backend.get_job(waiting.delivery.job_id).attempts == 0
    assert backend.settle([success(held(first), CLOSING)]) == [None]
    assert holders(backend) == {}
    (again,) = fetch_begun(backend, 1)
    assert again.delivery.job_id == waiting.delivery.job_id
    assert (slot_of(again).slot, slot_of(again).fence) == (0, 2)


@pytest.mark.parametrize("ending", ["retry", "dead"])
def test_every_kind_of_ending_frees_the_slot(backend: Backend, ending: str) -> None:
    """G3.6: a retry and a burial free the slot too (only a lost delivery keeps it, until its
    TTL)."""
    backend.enqueue(slotted(limit=1))
    (item,) = fetch_begun(backend, 1)
    guard = held(item)
    error = ErrorInfo(type="ValueError", message="no")
    if ending == "retry":
        written = retrying(guard, CLOSING, delay_s=0.0, error=error)
    else:
        written = burying(guard, CLOSING, code=DeadCode.FATAL, reason="fatal", error=error)
    assert backend.settle([written]) == [None]
    assert holders(backend) == {}


def test_the_heartbeat_keeps_a_slot_and_a_dead_holders_slot_is_free_after_its_ttl(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.6: renewals keep a slot past its TTL while the holder lives; once they stop, the slot
    is granted again after the TTL, with a larger fence."""
    backend.enqueue(slotted(limit=1, visibility_timeout_s=100.0))
    backend.enqueue(slotted(limit=1, visibility_timeout_s=100.0))
    alive, waiting = fetch_begun(backend, 2)
    guard = held(alive)
    assert backend.settle([deferring(held(waiting), CLOSING, delay_s=0.0, reason="full")]) == [None]
    for _ in range(3):
        clock.advance(8.0)
        (result,) = backend.renew([Renewal(guard, 100.0, TTL_S)])
        assert (result.lease_ok, result.lock_ok) == (True, True)
    clock.advance(11.0)  # the holder stops renewing (its process was killed)
    for item in fetch_begun(backend, 2, "w2"):  # the one deferred at once (delay 0) is ready
        if item.delivery.job_id != alive.delivery.job_id:
            assert (slot_of(item).slot, slot_of(item).fence) == (0, 2)
            break
    else:
        raise AssertionError("the second job was not fetched")
    (result,) = backend.renew([Renewal(guard, 100.0, TTL_S)])
    assert (result.lease_ok, result.lock_ok) == (True, False)  # its lease lives, its slot not


def slot_taken_over(backend: Backend, clock: ControlledClock) -> tuple[Prepared, Prepared]:
    """A holder of the one slot of ``acct:1`` (operation ``op:a``) paused past the slot's TTL,
    its lease and claim still its own, and the delivery (``op:b``) granted the slot since."""
    backend.enqueue(slotted(limit=1, operation_key="op:a", visibility_timeout_s=100.0))
    (stale,) = fetch_begun(backend, 1)
    clock.advance(TTL_S + 1)
    backend.enqueue(slotted(limit=1, operation_key="op:b", visibility_timeout_s=100.0))
    (fresh,) = fetch_begun(backend, 1, "w2")
    assert slot_of(fresh).fence == 2
    return stale, fresh


def test_a_stale_slot_holders_step_and_success_are_refused_by_the_slots_fence(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.5, G3.6: a holder paused past its slot's TTL, whose slot went to another delivery,
    cannot record a step nor complete its job; the new holder can."""
    stale, fresh = slot_taken_over(backend, clock)
    with pytest.raises(StaleFenceError, match=r"acct:1 \(concurrency slot 0\)"):
        backend.put_step(held(stale), "op:a", "charge", "1")
    (refusal,) = backend.settle([success(held(stale), CLOSING, operation_key="op:a")])
    assert isinstance(refusal, StaleFenceError)
    assert backend.get_job(stale.delivery.job_id).status == JobStatus.RUNNING
    backend.put_step(held(fresh), "op:b", "charge", "1")
    assert backend.settle([success(held(fresh), CLOSING, operation_key="op:b")]) == [None]
    assert backend.get_job(fresh.delivery.job_id).status == JobStatus.COMPLETED


def test_a_job_with_a_lock_and_a_slot_holds_both_or_neither(backend: Backend) -> None:
    """G3.6: a busy slot gives back the lock taken in the same begin, a busy lock takes no
    slot, and a delivery holding both releases both when it ends."""
    backend.enqueue(slotted(limit=1, resource_key="order:1"))
    backend.enqueue(slotted(limit=1, resource_key="order:2"))  # slot busy: lock given back
    backend.enqueue(slotted("acct:2", 1, resource_key="order:1"))  # lock busy: no slot
    first, slot_busy, lock_busy = fetch_begun(backend, 3)
    assert begun_of(first).grant is not None
    assert slot_of(first).slot == 0
    assert begun_of(slot_busy).busy is BusyReason.SLOT
    assert begun_of(lock_busy).busy is BusyReason.LOCK
    assert backend.acquire_lock("order:2", "someone", TTL_S) is not None  # given back
    assert holders(backend, "acct:2") == {}
    (attempt,) = backend.attempts(job_id=slot_busy.delivery.job_id)
    assert attempt.lock_owner is None  # names no lock it gave straight back
    assert backend.settle([success(held(first), CLOSING)]) == [None]
    assert holders(backend) == {}
    assert backend.acquire_lock("order:1", "someone", TTL_S) is not None


def test_an_operation_in_progress_gives_back_the_slot(backend: Backend) -> None:
    """G3.6, G4: a delivery whose operation a live delivery claims is busy and keeps no slot."""
    backend.enqueue(slotted("acct:1", 2, operation_key="op:same"))
    backend.enqueue(slotted("acct:1", 2, operation_key="op:same"))
    first, second = fetch_begun(backend, 2)
    assert begun_of(second).busy is BusyReason.OPERATION
    assert list(holders(backend)) == [slot_of(first).slot]


def test_a_stored_limit_past_the_largest_is_read_as_the_largest(backend: Backend) -> None:
    """A row written by another tool with a limit past 1000 (or none below 1) begins like one
    of the largest limit (or is never granted a slot) instead of looking at billions of
    slots."""
    backend.enqueue(slotted(limit=2**31 - 1))
    backend.enqueue(slotted("acct:2", limit=0))
    huge, none = fetch_begun(backend, 2)
    assert slot_of(huge).slot == 0
    assert begun_of(none).busy is BusyReason.SLOT

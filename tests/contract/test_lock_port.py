"""Conformance tests of the lock port: owner tokens, expiry and fencing tokens (G3).

Runs against every backend in ``conftest.BACKENDS``; expiry is driven by the controlled clock.
"""

from __future__ import annotations

from dataclasses import replace

from jobguard.backends.base import Backend
from jobguard.models import LockGrant
from jobguard.testing import ControlledClock


def grant(backend: Backend, resource: str, owner: str, ttl_s: float = 10.0) -> LockGrant:
    """Acquire a lock the test expects to be free."""
    granted = backend.acquire_lock(resource, owner, ttl_s)
    assert granted is not None, f"{resource} should be free for {owner}"
    return granted


def test_acquire_on_a_free_resource_grants_owner_expiry_and_first_fence(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.1, G3.2, G3.5: the first grant carries the owner, ``now + ttl`` and fence 1."""
    assert backend.lock_fence("order:1") == 0
    granted = grant(backend, "order:1", "alice", 10.0)
    assert granted == LockGrant(
        resource="order:1", owner="alice", fence=1, expires_at=clock() + 10.0
    )
    assert backend.lock_fence("order:1") == 1


def test_acquire_while_another_owner_holds_the_lock_is_busy(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.1, G3.5: a live lock is not granted to anyone else (``None``, no new fence)."""
    grant(backend, "order:1", "alice", 10.0)
    clock.advance(9.5)
    assert backend.acquire_lock("order:1", "bob", 10.0) is None
    assert backend.acquire_lock("order:1", "alice", 10.0) is None  # not re-entrant either
    assert backend.lock_fence("order:1") == 1


def test_acquire_after_expiry_grants_the_next_owner_a_larger_fence(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.2, G3.5: an expired lock is free; the new grant's fence is strictly larger."""
    first = grant(backend, "order:1", "alice", 10.0)
    clock.advance(10.0)
    second = grant(backend, "order:1", "bob", 10.0)
    assert second.fence > first.fence
    assert second.expires_at == clock() + 10.0


def test_locks_on_different_resources_are_independent(backend: Backend) -> None:
    """G3.1: a lock is per resource key; fences count per resource."""
    a = grant(backend, "order:1", "alice")
    b = grant(backend, "order:2", "bob")
    assert (a.fence, b.fence) == (1, 1)
    assert backend.lock_fence("order:3") == 0


def test_renew_by_the_owner_extends_the_lock(backend: Backend, clock: ControlledClock) -> None:
    """G3.2, G3.3: renewal keeps a slow job's lock alive past its first TTL."""
    held = grant(backend, "order:1", "alice", 10.0)
    for _ in range(3):
        clock.advance(8.0)
        assert backend.renew_lock(held, 10.0) is True
    clock.advance(9.5)
    assert backend.acquire_lock("order:1", "bob", 10.0) is None
    assert backend.lock_fence("order:1") == held.fence


def test_renew_by_someone_who_is_not_the_owner_is_refused_and_extends_nothing(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.2: only the owner token extends a lock, even when it claims the right fence."""
    held = grant(backend, "order:1", "alice", 10.0)
    impostor = replace(held, owner="mallory")
    clock.advance(5.0)
    assert backend.renew_lock(impostor, 60.0) is False
    clock.advance(5.0)
    assert backend.acquire_lock("order:1", "bob", 10.0) is not None


def test_renew_after_a_newer_owner_took_the_lock_is_refused(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.5: a paused owner whose lock expired and was re-granted cannot extend it."""
    old = grant(backend, "order:1", "alice", 10.0)
    clock.advance(10.0)
    new = grant(backend, "order:1", "bob", 10.0)
    assert backend.renew_lock(old, 60.0) is False
    clock.advance(10.0)  # bob's lock ends on time: alice's renewal did not stretch it
    assert grant(backend, "order:1", "carol").fence == new.fence + 1


def test_release_by_the_owner_frees_the_lock_at_once(backend: Backend) -> None:
    """G3.2: the owner releases; the next grant needs no wait and gets the next fence."""
    held = grant(backend, "order:1", "alice", 60.0)
    assert backend.release_lock(held) is True
    assert grant(backend, "order:1", "bob").fence == held.fence + 1


def test_release_by_someone_who_is_not_the_owner_is_refused(backend: Backend) -> None:
    """G3.2: another owner token cannot free a lock; the holder keeps it."""
    held = grant(backend, "order:1", "alice", 60.0)
    assert backend.release_lock(replace(held, owner="mallory")) is False
    assert backend.acquire_lock("order:1", "bob", 10.0) is None
    assert backend.release_lock(held) is True
    assert backend.release_lock(held) is False  # a second release finds nothing of ours


def test_release_after_a_newer_owner_took_the_lock_leaves_the_new_owner_holding_it(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.2, G3.5: a late release by an expired owner cannot free a newer grant."""
    old = grant(backend, "order:1", "alice", 10.0)
    clock.advance(10.0)
    grant(backend, "order:1", "bob", 10.0)
    assert backend.release_lock(old) is False
    assert backend.acquire_lock("order:1", "carol", 10.0) is None


def test_fences_strictly_increase_and_survive_release_and_expiry(
    backend: Backend, clock: ControlledClock
) -> None:
    """G3.5: every grant's fence is larger than any issued before for the resource."""
    fences = []
    for round_no in range(6):
        held = grant(backend, "order:1", f"owner-{round_no}", 5.0)
        fences.append(held.fence)
        assert backend.lock_fence("order:1") == held.fence
        if round_no % 2:
            assert backend.release_lock(held)
        else:
            clock.advance(5.0)
    assert fences == sorted(set(fences))
    assert backend.lock_fence("order:1") == fences[-1]

"""Unit tests of the reference lock model ``jobguard.core.fencing`` (G3, G3.5).

The property tests compare every store with this model, so its own rules are pinned here.
"""

from __future__ import annotations

from jobguard.core.fencing import LockState, acquire, release, renew, write_allowed

NOW = 1000.0


def test_acquire_grants_a_free_lock_with_the_next_fence() -> None:
    """G3.1, G3.5: a grant carries the owner, the expiry and fence = last + 1."""
    state, granted = acquire(LockState(fence=4), "a", 10.0, NOW)
    assert granted
    assert state == LockState(owner="a", expires_at=NOW + 10.0, fence=5)


def test_acquire_is_refused_while_held_and_allowed_once_expired() -> None:
    """G3.2: busy until ``expires_at``; at ``expires_at`` the lock is free."""
    held, _ = acquire(LockState(), "a", 10.0, NOW)
    assert acquire(held, "b", 10.0, NOW + 9.99) == (held, False)
    assert acquire(held, "a", 10.0, NOW + 9.99) == (held, False)  # not re-entrant
    state, granted = acquire(held, "b", 10.0, NOW + 10.0)
    assert granted
    assert (state.owner, state.fence) == ("b", 2)


def test_only_the_owner_renews_or_releases_and_the_fence_is_kept() -> None:
    """G3.2, G3.5: owner-only; release keeps the counter so fences never repeat."""
    held, _ = acquire(LockState(), "a", 10.0, NOW)
    assert renew(held, "b", 10.0, NOW) == (held, False)
    assert release(held, "b") == (held, False)
    renewed, ok = renew(held, "a", 30.0, NOW + 5.0)
    assert ok
    assert renewed.expires_at == NOW + 35.0
    freed, ok = release(renewed, "a")
    assert ok
    assert freed == LockState(owner=None, expires_at=0.0, fence=1)
    assert acquire(freed, "c", 1.0, NOW)[0].fence == 2


def test_a_write_is_allowed_only_with_the_newest_fence() -> None:
    """G3.5: an older fence is refused once a newer one was issued."""
    state = LockState(owner="b", expires_at=NOW, fence=3)
    assert write_allowed(state, 3)
    assert not write_allowed(state, 2)

"""The resource lock as a pure state machine: ownership, expiry and fencing tokens (G3).

Each store implements these rules atomically (one SQL transaction, one Lua script); this module is
the reference the property tests compare every store against.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LockState:
    """One resource's lock row: current owner (if any), its expiry, and the last fence issued."""

    owner: str | None = None
    expires_at: float = 0.0
    fence: int = 0

    def held_at(self, now: float) -> bool:
        """True while an owner holds an unexpired lease on the lock."""
        return self.owner is not None and self.expires_at > now


def acquire(state: LockState, owner: str, ttl_s: float, now: float) -> tuple[LockState, bool]:
    """Take the lock if it is free or expired; every grant gets a strictly larger fence."""
    if state.held_at(now):
        return state, False
    return LockState(owner=owner, expires_at=now + ttl_s, fence=state.fence + 1), True


def renew(state: LockState, owner: str, ttl_s: float, now: float) -> tuple[LockState, bool]:
    """Extend the lock; only its owner may, and only while no newer grant exists."""
    if state.owner != owner:
        return state, False
    return LockState(owner=owner, expires_at=now + ttl_s, fence=state.fence), True


def release(state: LockState, owner: str) -> tuple[LockState, bool]:
    """Free the lock; only its owner may. The fence counter is kept so it never goes back."""
    if state.owner != owner:
        return state, False
    return LockState(owner=None, expires_at=0.0, fence=state.fence), True


def write_allowed(state: LockState, fence: int) -> bool:
    """A write carrying ``fence`` is accepted only if no newer fence was issued since."""
    return fence >= state.fence

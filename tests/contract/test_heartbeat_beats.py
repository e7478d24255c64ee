"""What one heartbeat beat does to the store, on each backend (G2.2, #18)."""

from __future__ import annotations

import time

from jobguard.backends.base import Backend
from jobguard.context import InFlight
from jobguard.heartbeat import Heartbeat
from jobguard.hooks import Hooks
from jobguard.testing import ControlledClock
from tests.contract.test_queue_port import make_spec
from tests.support.ports import fetch, fetch_one, guard_of


def test_a_lease_judged_lost_on_the_worker_clock_is_still_renewed(
    backend: Backend, clock: ControlledClock
) -> None:
    """No renewal got through for a whole lease (a network that stopped answering): the worker
    judges the delivery lost, and its handler sees ``ctx.lease_lost``, but while the store
    still holds the lease as its own the beat keeps extending it, so no other worker is handed
    the job while the first one may still be running it."""
    backend.enqueue(make_spec(visibility_timeout_s=10.0))
    delivery = fetch_one(backend, worker="w1")
    item = InFlight(delivery, guard_of(delivery), None)
    item.renewed_at = time.monotonic() - 11.0  # on this worker's clock, a lease length ago
    heartbeat = Heartbeat(backend, lambda: [item], Hooks())
    clock.advance(8.0)
    heartbeat.beat()
    assert item.lost
    assert item.judged_lost
    clock.advance(8.0)  # 16 s after the fetch: past the first lease, not past the renewed one
    assert fetch(backend, ["default"], 10, "w2") == []

"""What one heartbeat beat does to the store, on each backend (G2.2, #18)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


@contextmanager
def _asleep_then_arrives(backend: Backend, lease_s: float) -> Iterator[tuple[InFlight, float]]:
    """A running heartbeat asleep over one delivery with a 60 s lease (a beat due in 20 s);
    then a delivery with a ``lease_s`` lease arrives and the heartbeat is poked with it.
    Yields the new delivery and when the heartbeat was to wake before the poke."""
    inflight = [_held(backend, 60.0)]
    heartbeat = Heartbeat(backend, lambda: list(inflight), Hooks())
    heartbeat.start()
    try:
        _wait_until(lambda: inflight[0].beat_wake_at is not None, "the heartbeat to sleep")
        wake_at = inflight[0].beat_wake_at
        assert wake_at is not None
        arrived = _held(backend, lease_s)
        inflight.append(arrived)
        heartbeat.poke([arrived])
        yield arrived, wake_at
    finally:
        heartbeat.stop()
        heartbeat.join(10.0)


def _held(backend: Backend, visibility_timeout_s: float) -> InFlight:
    backend.enqueue(make_spec(visibility_timeout_s=visibility_timeout_s))
    delivery = fetch_one(backend)
    return InFlight(delivery, guard_of(delivery), None)


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not condition():
        assert time.monotonic() < deadline, f"waited 10 s for {what}"
        time.sleep(0.005)


def test_a_fetch_whose_leases_the_coming_beat_covers_leaves_the_heartbeat_asleep(
    backend: Backend,
) -> None:
    """A busy worker fetches many times a second: a batch whose first renewal is due no
    sooner than the beat the heartbeat already sleeps towards does not wake it (a thread
    switch a fetch); the batch is watched by that sleep."""
    with _asleep_then_arrives(backend, 60.0) as (arrived, wake_at):
        # Woken, it would look again and sleep anew: to a later time, set on both deliveries.
        assert arrived.beat_wake_at == wake_at
        assert not arrived.renewal_tried


def test_a_fetch_with_a_shorter_lease_wakes_the_heartbeat_to_renew_it_in_time(
    backend: Backend,
) -> None:
    """A delivery with a 0.6 s lease arrives while the heartbeat sleeps 20 s towards the beat
    of a 60 s lease: the poke wakes it, and the new lease is renewed long before the old sleep
    would have ended."""
    with _asleep_then_arrives(backend, 0.6) as (arrived, _):
        _wait_until(lambda: arrived.renewal_tried, "the short lease's renewal")
        assert not arrived.lost

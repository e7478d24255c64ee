"""The PostgreSQL store clock: the server's time, read once a second and carried between."""

from __future__ import annotations

from jobguard.backends.postgres.clock import RESYNC_EVERY_S, ServerClock


class Host:
    """A monotonic clock the test moves, and a server clock 1000 s ahead of it."""

    def __init__(self) -> None:
        self.mono = 50.0
        self.readings = 0
        self.round_trip_s = 0.0

    def monotonic(self) -> float:
        return self.mono

    def read_server(self) -> float:
        self.readings += 1
        server = self.mono + 1000.0 + self.round_trip_s / 2  # read in the round trip's middle
        self.mono += self.round_trip_s
        return server


def test_the_server_is_read_once_then_its_time_is_carried_on_the_monotonic_clock() -> None:
    host = Host()
    clock = ServerClock(host.monotonic)
    assert clock.carried() is None
    assert clock.now(host.read_server) == 1050.0
    host.mono += 0.5
    assert clock.now(host.read_server) == 1050.5
    assert clock.carried() == 1050.5
    assert host.readings == 1


def test_the_reading_is_renewed_once_it_is_a_second_old() -> None:
    host = Host()
    clock = ServerClock(host.monotonic)
    clock.now(host.read_server)
    host.mono += RESYNC_EVERY_S
    assert clock.carried() is None
    clock.now(host.read_server)
    assert host.readings == 2


def test_the_offset_assumes_the_server_read_its_clock_mid_round_trip() -> None:
    host = Host()
    host.round_trip_s = 0.004
    clock = ServerClock(host.monotonic)
    # Sent at 50.000, the server read 1050.002, received at 50.004: now is 1050.004.
    assert abs(clock.now(host.read_server) - 1050.004) < 1e-9


def test_a_wall_clock_step_on_the_host_does_not_move_the_store_clock() -> None:
    """Only the monotonic clock is read between readings: time.time() is never consulted."""
    import time

    host = Host()
    clock = ServerClock(host.monotonic)
    first = clock.now(host.read_server)
    real_time = time.time
    time.time = lambda: real_time() + 3600.0  # type: ignore[assignment]
    try:
        assert clock.now(host.read_server) == first
    finally:
        time.time = real_time  # type: ignore[assignment]

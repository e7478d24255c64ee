"""The PostgreSQL store clock: the server's time, read once a second and carried between."""

from __future__ import annotations

import os
import threading
import time
import warnings

from jobguard.backends.postgres.clock import (
    MAX_CARRIED_ROUND_TRIP_S,
    RESYNC_EVERY_S,
    ServerClock,
)


class Host:
    """A host clock the test moves, and a server clock 1000 s ahead of it."""

    def __init__(self) -> None:
        self.clock = 50.0
        self.readings = 0
        self.round_trip_s = 0.0

    def now(self) -> float:
        return self.clock

    def read_server(self) -> float:
        self.readings += 1
        server = self.clock + 1000.0 + self.round_trip_s / 2  # read in the round trip's middle
        self.clock += self.round_trip_s
        return server


def test_the_server_is_read_once_then_its_time_is_carried_on_the_host_clock() -> None:
    host = Host()
    clock = ServerClock(host.now)
    assert clock.carried() is None
    assert clock.now(host.read_server) == 1050.0
    host.clock += 0.5
    assert clock.now(host.read_server) == 1050.5
    assert clock.carried() == 1050.5
    assert host.readings == 1


def test_the_reading_is_renewed_once_it_is_a_second_old() -> None:
    host = Host()
    clock = ServerClock(host.now)
    clock.now(host.read_server)
    host.clock += RESYNC_EVERY_S
    assert clock.carried() is None
    clock.now(host.read_server)
    assert host.readings == 2


def test_the_offset_assumes_the_server_read_its_clock_mid_round_trip() -> None:
    host = Host()
    host.round_trip_s = 0.004
    clock = ServerClock(host.now)
    # Sent at 50.000, the server read 1050.002, received at 50.004: now is 1050.004.
    assert abs(clock.now(host.read_server) - 1050.004) < 1e-9


def test_a_slow_reading_is_used_once_and_not_carried() -> None:
    """Its error is half its round trip: too much to carry for a second."""
    host = Host()
    host.round_trip_s = MAX_CARRIED_ROUND_TRIP_S * 3
    clock = ServerClock(host.now)
    clock.now(host.read_server)
    assert clock.carried() is None
    host.round_trip_s = 0.0
    clock.now(host.read_server)
    assert clock.carried() is not None
    assert host.readings == 2


def test_a_host_clock_that_jumps_ahead_or_back_makes_the_server_be_read_again() -> None:
    """A suspended host's boot-time clock jumps ahead by the suspension: the old reading is
    not carried across it (nor across a clock that went back)."""
    host = Host()
    clock = ServerClock(host.now)
    clock.now(host.read_server)
    host.clock += 3600.0
    assert clock.carried() is None
    clock.now(host.read_server)
    host.clock -= 10.0
    assert clock.carried() is None


def test_a_wall_clock_step_on_the_host_does_not_move_the_store_clock() -> None:
    """Only the host's boot-time clock is read between readings, never time.time()."""
    host = Host()
    clock = ServerClock(host.now)
    first = clock.now(host.read_server)
    real_time = time.time
    time.time = lambda: real_time() + 3600.0  # type: ignore[assignment]
    try:
        assert clock.now(host.read_server) == first
    finally:
        time.time = real_time  # type: ignore[assignment]


def test_a_child_forked_while_another_thread_reads_the_server_reads_it_too() -> None:
    """Nothing of a reading in progress is held across fork(): the child's next reading
    (due at once) goes through instead of waiting for a thread that does not exist there."""
    clock = ServerClock()
    inside, release = threading.Event(), threading.Event()

    def slow_reading() -> float:
        inside.set()
        release.wait(10)
        return time.time()

    reader = threading.Thread(target=clock.now, args=(slow_reading,), daemon=True)
    reader.start()
    assert inside.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its own reading returns
        try:
            clock.now(time.time)
        finally:
            os._exit(0 if clock.carried() is not None else 1)
    release.set()
    reader.join(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's clock reading hung")

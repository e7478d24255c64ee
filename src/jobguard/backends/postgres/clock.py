"""The store clock on PostgreSQL: the server's ``clock_timestamp()``, carried between readings.

Every worker host must decide leases and locks on one clock, the server's. Asking the server
for it in every transaction costs a round trip each time, so the server's time is read now and
then and carried forward on this host's time since boot, which no wall-clock step (NTP, an
operator's ``date -s``) moves and which keeps counting while the host is suspended. Between
readings the carried time can drift from the server's only by that clock's rate error (parts
per million) plus half the round trip of the last reading: far below the seconds that leases
and lock TTLs are measured in. A reading whose round trip was slow is used once, not carried.
"""

from __future__ import annotations

from collections.abc import Callable

from jobguard.core.boottime import since_boot_s

# How long one reading is carried before the server is asked again.
RESYNC_EVERY_S = 1.0
# A reading is carried only if its round trip took at most this long (its error is half that).
MAX_CARRIED_ROUND_TRIP_S = 0.1


class ServerClock:
    """The server's time as ``host clock + offset``, the offset read again every second.

    Safe to share between threads and across ``fork()``: it holds no lock (threads that find
    the reading due at the same moment each read the server once), and the host clock is one
    for every process of the host.

    Args:
        host_clock: This host's clock that never steps (injectable in tests).
    """

    def __init__(self, host_clock: Callable[[], float] = since_boot_s) -> None:
        self._host_clock = host_clock
        # (offset from the host clock to the server's, host-clock time of the reading)
        self._reading: tuple[float, float] | None = None

    def carried(self) -> float | None:
        """The server's time from the last reading, or ``None`` if it is due to be read."""
        reading = self._reading
        now = self._host_clock()
        if reading is None or not 0.0 <= now - reading[1] < RESYNC_EVERY_S:
            return None
        return now + reading[0]

    def now(self, read_server: Callable[[], float]) -> float:
        """The server's time now; ``read_server`` (one round trip) is called only when due.

        The caller passes a reading on the connection it already holds, so that a thread
        inside a transaction never waits for a second pooled connection.
        """
        carried = self.carried()
        if carried is not None:
            return carried
        sent = self._host_clock()
        server = read_server()
        received = self._host_clock()
        # The server read its clock somewhere in the round trip: assume its middle.
        offset = server - (sent + received) / 2
        if received - sent <= MAX_CARRIED_ROUND_TRIP_S:
            self._reading = (offset, received)
        return received + offset

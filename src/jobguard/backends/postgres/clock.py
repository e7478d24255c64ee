"""The store clock on PostgreSQL: the server's ``clock_timestamp()``, carried between readings.

Every worker host must decide leases and locks on one clock, the server's. Asking the server
for it in every transaction costs a round trip each time, so the server's time is read now and
then and carried forward on this host's monotonic clock, which no wall-clock step (NTP, an
operator's ``date -s``) moves. Between readings the carried time can drift from the server's
only by the monotonic clock's rate error (parts per million) plus half the round trip of the
last reading: far below the seconds that leases and lock TTLs are measured in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# How long one reading is carried before the server is asked again.
RESYNC_EVERY_S = 1.0


class ServerClock:
    """The server's time as ``monotonic() + offset``, the offset read again every second.

    Args:
        monotonic: This host's monotonic clock (injectable in tests).
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        # (offset from the monotonic clock to the server's, monotonic time of the reading)
        self._reading: tuple[float, float] | None = None
        self._lock = threading.Lock()

    def carried(self) -> float | None:
        """The server's time from the last reading, or ``None`` if it is due to be read."""
        reading = self._reading
        now = self._monotonic()
        if reading is None or now - reading[1] >= RESYNC_EVERY_S:
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
        with self._lock:  # one reading for every thread that found the last one stale
            carried = self.carried()
            if carried is not None:
                return carried
            sent = self._monotonic()
            server = read_server()
            received = self._monotonic()
            # The server read its clock somewhere in the round trip: assume its middle.
            offset = server - (sent + received) / 2
            self._reading = (offset, received)
            return received + offset

"""The connections of jobguard's own pool, and what each keeps between its statements."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobguard.backends.postgres.onetrip import OneTrip


class PooledConnection(psycopg.Connection[Any]):
    """A connection of jobguard's pool (its ``connection_class``).

    One thread uses it at a time (checked out of the pool, or kept: see
    :mod:`jobguard.backends.postgres.kept`), so it keeps for that thread's next statements:

    - its cursor for jobguard's named statements (dict rows, sent in their native form:
      :mod:`jobguard.backends.postgres.statements`). A new cursor looks up again how to send
      each type of value (about 5 us of CPU for a statement of ten values on a 2-core VM:
      ``python -m bench.statement_cpu``); a kept one has them;
    - which named statements ran on it already (:meth:`first_run`). One written on its own (the
      fetch, the settle, the renewals) is prepared at its first run: psycopg would send the text
      unprepared five times first, the server parsing and planning it each time (about 1 ms for
      the fetch), again on every new connection. Outside a pipeline psycopg waits for the
      server to prepare before it executes (a round trip more); inside one it does not, but a
      pipeline costs about 35 us of CPU. So the first run goes in a pipeline, later ones
      (prepared) without;
    - its :class:`~jobguard.backends.postgres.onetrip.OneTrip`, which knows the statements it
      prepared here for a ``db_writes`` step.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ran: set[str] = set()
        self._named: psycopg.RawCursor[dict[str, Any]] | None = None
        self._one_trip: OneTrip | None = None

    def named_cursor(self) -> psycopg.RawCursor[dict[str, Any]]:
        """The cursor of jobguard's named statements."""
        if self._named is None:
            self._named = psycopg.RawCursor(self, row_factory=dict_row)
        return self._named

    def one_trip(self) -> OneTrip:
        """The sender of a transaction's statements in one round trip, for this connection."""
        if self._one_trip is None:
            self._one_trip = OneTrip(self)
        return self._one_trip

    def _deallocate(self, name: bytes | None) -> Any:
        # psycopg deallocates every prepared statement of the connection (its own and
        # OneTrip's) when one of its transactions rolls back, or a statement dropped or altered
        # something, if it had prepared any itself: OneTrip then prepares its own again.
        if name is None and self._one_trip is not None:
            self._one_trip.forget_prepared()
        return super()._deallocate(name)

    def first_run(self, name: str) -> bool:
        """Whether this is ``name``'s first run here (noted as run from now on)."""
        if name in self._ran:
            return False
        self._ran.add(name)
        return True

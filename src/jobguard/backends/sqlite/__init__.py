"""The embedded SQLite backend (default): the shared SQL store over the SQLite driver."""

from __future__ import annotations

from collections.abc import Callable

from jobguard.backends.sql.store import SQLStore
from jobguard.backends.sqlite.driver import SQLiteDriver

__all__ = ["SQLiteBackend"]


class SQLiteBackend(SQLStore):
    """Every port on one SQLite file. Safe to share between threads and forked processes.

    Args:
        path: The database file (created and migrated if needed).
        synchronous: ``FULL`` (default: a commit survives power loss) or ``NORMAL``.
        busy_timeout_s: How long a write waits for another process's transaction.
        clock: The store clock; default the host clock. Tests inject a controlled one.
    """

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            SQLiteDriver(path, synchronous=synchronous, busy_timeout_s=busy_timeout_s, clock=clock)
        )
        self.path = path

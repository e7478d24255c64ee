"""The PostgreSQL backend: the shared SQL store over the PostgreSQL driver (``postgres`` extra)."""

from __future__ import annotations

from collections.abc import Callable

from jobguard.backends.postgres.driver import PostgresDriver
from jobguard.backends.sql.store import SQLStore

__all__ = ["PostgresBackend"]


class PostgresBackend(SQLStore):
    """Every port on one PostgreSQL database, for workers on any number of hosts.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (``?schema=name`` optional).
        schema: The schema holding jobguard's tables (default ``jobguard``; overrides the URL's).
        pool_size: Most connections this process opens (default 10, or a worker's handler
            threads plus 4 when that is more).
        clock: The store clock; default the database's ``clock_timestamp()``. Tests inject one.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(PostgresDriver(url, schema=schema, pool_size=pool_size, clock=clock))

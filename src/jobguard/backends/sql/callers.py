"""A caller's own connection, whatever wraps it: SQLAlchemy, an asyncio driver, a pool.

Transactional enqueue (``enqueue(connection=...)``) writes the job with the driver's named
statements on the DB-API connection under whatever the caller holds. This module finds that
connection without importing any framework: a SQLAlchemy ``Connection`` or ``Session`` gives the
connection of its transaction; an asyncio connection (psycopg ``AsyncConnection``, aiosqlite,
SQLAlchemy's ``AsyncConnection``/``AsyncSession``) is driven from a worker thread through the
caller's event loop by a :class:`LoopBridge`, so the loop is never blocked by the store.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from jobguard.exceptions import ConfigurationError

T = TypeVar("T")


def is_async(connection: Any) -> bool:
    """Whether ``connection`` is an asyncio connection or session (its ``commit`` is awaited)."""
    return inspect.iscoroutinefunction(getattr(type(connection), "commit", None))


def _from_sqlalchemy(module: str) -> bool:
    return module == "sqlalchemy" or module.startswith("sqlalchemy.")


def unwrap(connection: Any) -> Any:
    """The DB-API connection a driver adopts for ``connection``, in the caller's transaction.

    A SQLAlchemy ``Session`` gives the connection of its transaction (begun if it was not, as
    any statement of the session would); a SQLAlchemy ``Connection`` outside a transaction
    begins one (the job commits with ``conn.commit()``); Django's connection gives its driver
    connection (outside ``transaction.atomic()`` it is in autocommit mode, and refused). Anything
    else is returned as it is.

    Raises:
        ConfigurationError: ``connection`` is an asyncio connection passed to a synchronous
            enqueue.
    """
    if isinstance(connection, LoopBridge):
        return connection
    if is_async(connection):
        raise ConfigurationError(
            f"connection= is an asyncio connection ({type(connection).__name__}): enqueue on it "
            "with `await task.enqueue_async(..., connection=conn)`"
        )
    module = type(connection).__module__
    if _from_sqlalchemy(module):
        return _sqlalchemy_driver_connection(connection)
    if module.startswith("django.") and hasattr(connection, "ensure_connection"):
        # Django's connection (django.db.connection): its driver connection, in its atomic()
        connection.ensure_connection()
        return connection.connection
    return connection


def _sqlalchemy_driver_connection(connection: Any) -> Any:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(connection, Session):
        connection = connection.connection()  # the session's transaction (autobegun)
    if not isinstance(connection, Connection):
        raise ConfigurationError(
            "connection= from SQLAlchemy must be a Connection or a Session, "
            f"not {type(connection).__name__}"
        )
    if not connection.in_transaction():
        connection.begin()
    return connection.connection.driver_connection


async def for_thread(connection: Any) -> Any:
    """What the store thread of an ``enqueue_async`` writes on, made on the caller's loop.

    An asyncio connection becomes a :class:`LoopBridge` (a SQLAlchemy ``AsyncSession`` or
    ``AsyncConnection`` gives the driver connection of its transaction, begun if it was not);
    ``None`` and synchronous connections are returned as they are.
    """
    if connection is None or not is_async(connection):
        return connection
    if _from_sqlalchemy(type(connection).__module__):
        connection = await _sqlalchemy_async_driver_connection(connection)
    return LoopBridge(connection, asyncio.get_running_loop())


async def _sqlalchemy_async_driver_connection(connection: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    if not isinstance(connection, AsyncConnection):
        raise ConfigurationError(
            "connection= from SQLAlchemy asyncio must be an AsyncConnection or an "
            f"AsyncSession, not {type(connection).__name__}"
        )
    if not connection.in_transaction():
        await connection.begin()
    raw = await connection.get_raw_connection()
    return raw.driver_connection


class LoopBridge:
    """A synchronous DB-API face of an asyncio connection, used from a thread off its loop.

    Each statement is run on the connection's own event loop (which the caller is awaiting
    the enqueue on, so it is free) and its rows are read there; rows come back as dicts.

    Attributes:
        target: The asyncio driver connection (psycopg ``AsyncConnection``, aiosqlite).
    """

    row_factory = None  # a caller's connection: the driver reads rows by name from dicts

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self._loop = loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the connection's loop and wait for it (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def cursor(self, **_options: Any) -> BridgeCursor:
        """A cursor whose ``execute`` runs on the loop (options of the sync drivers ignored)."""
        return BridgeCursor(self)

    def execute(self, query: str, params: Any = None) -> BridgeCursor:
        """Run one statement; the cursor holds its rows."""
        cursor = self.cursor()
        cursor.execute(query, params)
        return cursor

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A savepoint, rolled back alone if the block raises."""
        self.execute("SAVEPOINT jobguard_item")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK TO SAVEPOINT jobguard_item")
            raise
        finally:
            self.execute("RELEASE SAVEPOINT jobguard_item")


class BridgeCursor:
    """The rows and row count of one statement run through a :class:`LoopBridge`."""

    def __init__(self, bridge: LoopBridge) -> None:
        self._bridge = bridge
        self._rows: list[dict[str, Any]] = []
        self.rowcount = -1
        self.row_factory: Any = None  # set by a driver for its own connections; dicts here

    def execute(self, query: str, params: Mapping[str, Any] | Sequence[Any] | None = None) -> Any:
        """Run ``query`` on the loop and keep its rows."""
        self._rows, self.rowcount = self._bridge.run(_run(self._bridge.target, query, params))
        return self

    def fetchone(self) -> dict[str, Any] | None:
        """The first row, or ``None``."""
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[dict[str, Any]]:
        """Every row."""
        return list(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


async def _run(target: Any, query: str, params: Any) -> tuple[list[dict[str, Any]], int]:
    # psycopg's AsyncConnection and aiosqlite's Connection both offer `await execute()` giving
    # a cursor with a DB-API description, `await fetchall()` and `rowcount`.
    cursor = await target.execute(query, params)
    try:
        if cursor.description is None:
            return [], int(cursor.rowcount)
        names = [column[0] for column in cursor.description]
        rows = [
            dict(row) if isinstance(row, Mapping) else dict(zip(names, row, strict=True))
            for row in await cursor.fetchall()
        ]
        return rows, int(cursor.rowcount)
    finally:
        closing = cursor.close()
        if inspect.isawaitable(closing):
            await closing

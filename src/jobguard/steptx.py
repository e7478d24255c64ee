"""A ``db_step`` transaction on a framework's own connection (SQLAlchemy, Django).

By default ``ctx.db_step`` runs the step in a transaction on the store's connection and hands
the step function a plain ``execute`` connection. An ORM writes through its own connection, so
``ctx.db_step(name, fn, *args, on=...)`` runs the step's whole transaction there instead: the
guard is checked, ``fn`` writes through the ORM, the guard is checked again and the step record
is written, all on that connection, and all commit or none. Implementations live in
:mod:`jobguard.contrib`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

StepCall = Callable[[Callable[..., Any], Sequence[Any]], Any]
"""Calls the step function with what the framework hands it first, then ``args``."""


class StepTransactions(Protocol):
    """Opens ``db_step`` transactions on a framework's connection to the store's database."""

    def transaction(self) -> AbstractContextManager[tuple[Any, StepCall]]:
        """Begin a transaction and yield ``(dbapi_connection, call)``.

        ``dbapi_connection`` is the driver connection of the transaction (psycopg or
        ``sqlite3``, to the store's own database), on which the step record is written;
        ``call(fn, args)`` runs ``fn(handle, *args)`` with the framework's handle (a session)
        and sends its pending writes. The transaction commits when the block ends and rolls
        back if it raises. On SQLite the transaction must take the write lock at once
        (``BEGIN IMMEDIATE``), since the step both reads the guard and writes.
        """
        ...

"""The driver seam: the only things a SQL database brings to the shared store.

:class:`~jobguard.backends.sql.store.SQLStore` holds every rule of the guard's writes once; a
driver only runs named statements and owns what truly differs between databases: connections
and transactions (group commit on SQLite, a pool on PostgreSQL), the store clock, how a list
parameter is passed, the connection handed to ``db_step`` code, and how idle workers are woken.
Every named statement exists in each driver's ``queries.sql`` under the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from jobguard.exceptions import StoreUnavailableError

T = TypeVar("T")
Params = Mapping[str, Any]


class Row(Protocol):
    """A result row, read by column name (``sqlite3.Row`` and psycopg's ``dict_row`` both are)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Tx(Protocol):
    """One open transaction: named statements in, rows out. Lists are passed as lists."""

    @property
    def connection(self) -> Any:
        """The driver's own connection this transaction runs on."""

    def one(self, name: str, params: Params) -> Row | None:
        """Run a named statement; its first row, or ``None``."""

    def all(self, name: str, params: Params) -> list[Row]:
        """Run a named statement; every row."""

    def run(self, name: str, params: Params) -> int:
        """Run a named statement; how many rows it changed."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested unit: rolled back alone if the block raises (the error goes on)."""

    def run_with_commit(self, name: str, params: Params) -> None:
        """Run a named statement that proves as the last of a transaction of
        :meth:`Driver.write` (nothing is run on it after this); on PostgreSQL it is sent with
        the COMMIT, in one round trip. It proves as
        :meth:`Driver.write_together`'s ``first`` does (``params`` get ``now``); when it does
        not, or fails, nothing of the transaction commits and the write raises
        :class:`StatementRefused`, caused by the database's error if there was one."""

    def now(self) -> float:
        """The store clock, in seconds since the epoch, as this transaction sees it."""

    def statement_now(self) -> float | None:
        """The store clock's time to give a statement as ``%(now)s``, or ``None`` where the
        statement reads the store's clock itself (PostgreSQL's server clock, unless a test
        injected one): a job's readiness, written by one process and judged by another, is
        then on one clock, not on two processes' carried readings of it."""


class Driver(Protocol):
    """Connections, transactions, the clock and wake-ups of one SQL database."""

    url: str
    dialect: str
    client_errors: tuple[type[Exception], ...]
    """The database client's own errors, met on a caller's connection (``adopt``) and wrapped
    by the store as :class:`~jobguard.exceptions.StoreUnavailableError`."""

    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one transaction and return once it is durably committed.

        If ``fn`` raises, nothing of it commits and the error reaches the caller; driver errors
        are wrapped as :class:`~jobguard.exceptions.StoreUnavailableError`.
        """

    def write_statement(self, name: str, params: Params) -> list[Row]:
        """Run one named write, atomic on its own, and return its rows once it committed.

        ``params`` get ``now`` unless they carry it: the store clock if the driver knows it
        without asking the database, else ``None`` and the statement reads the database's
        clock itself. On PostgreSQL it runs outside an explicit transaction: one round trip, no
        BEGIN nor COMMIT (what keeps a renewal quick on a slow network), run again if the server
        aborted it (a deadlock). Raises :class:`StatementRefused` when the database refused the
        statement itself (a value, or the statement's own check): then nothing of it was
        written; :class:`StatementCutOff` when its connection broke, after which it may or may
        not have been; any other failure as a :class:`StoreUnavailableError`.
        """

    def write_together(
        self, first: tuple[str, Params], statements: Sequence[tuple[Any, Any]]
    ) -> None:
        """Run, in one transaction, the named statement ``first`` and then the caller's
        ``statements`` (SQL text and parameters, refused before anything runs if one would end
        the transaction); on PostgreSQL all of it, its commit included, is sent in one round
        trip.

        ``first`` proves: it returns a row whose ``proven`` is true, or fails (on PostgreSQL,
        where nothing can be read between the statements, it fails the statement, and the
        server runs none of those after it). Whatever does not prove or fails stops the write,
        and nothing of it commits: raised as :class:`StatementRefused`, caused by the
        database's error. :class:`StatementCutOff` when the connection broke (it may have
        committed); any other failure as a :class:`~jobguard.exceptions.StoreUnavailableError`.
        """

    def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` on a read-only view of committed data."""

    def adopt(self, connection: Any) -> Tx:
        """A transaction view over the caller's own open connection (transactional enqueue).

        Nothing is committed or rolled back here: the job exists if and only if the caller's
        transaction commits.
        """

    def step_connection(self, tx: Tx, *, savepoints: bool = False) -> AbstractContextManager[Any]:
        """The connection ``db_step`` code writes through, inside ``tx``; refuses to end it.

        With ``savepoints``, the code may open and release savepoints of its own (an ORM's
        nested ``atomic()`` or ``begin_nested()``), but still not end the transaction.
        """

    def now(self) -> float:
        """The store clock outside a transaction."""

    def check_usable(self) -> None:
        """Raise :class:`~jobguard.exceptions.StoreBrokenError` if what this driver opened can
        no longer be used as it is (a SQLite file deleted or replaced); cheap enough for every
        pass of a loop."""

    def jobs_added(self, queues: Sequence[str]) -> None:
        """Wake idle workers of these queues after a committed enqueue (no-op if it cannot)."""

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Block until an enqueue may have made work for ``queues`` (True: a wake-up came), or
        ``timeout_s`` passed (False)."""

    def interrupt_wait(self) -> None:
        """End this process's :meth:`wait_for_jobs` now, or its next one (never raises)."""

    def expect_handlers(self, handlers: int) -> None:
        """A worker of this process runs up to ``handlers`` handler threads, each of which may
        hold a connection: keep room for them (PostgreSQL sizes its pool)."""

    def keep_connection(self) -> AbstractContextManager[None]:
        """While inside, this thread's calls reuse one connection instead of taking one of a
        shared pool each time (a worker's long-lived threads enter it)."""

    def close(self) -> None:
        """Close this process's connections."""


class StatementRefused(StoreUnavailableError):
    """The database refused one statement of :meth:`Driver.write_statement` (a value it would
    not store, or the statement's own check), not the connection or the server failing:
    nothing of it was written."""


class StatementCutOff(StoreUnavailableError):
    """The connection of a :meth:`Driver.write_statement` broke with the statement sent, or
    about to be: it may or may not have been written."""


class UserCodeError(Exception):
    """Carries an exception raised by user code inside a write, so it is re-raised unwrapped.

    Drivers unwrap it where they would otherwise wrap a failed transaction as
    :class:`~jobguard.exceptions.StoreUnavailableError`.
    """

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


class NamedStatements:
    """``one``/``all``/``run`` of :class:`Tx` over a driver's ``_execute`` (a DB-API cursor)."""

    def _execute(self, name: str, params: Params) -> Any:
        raise NotImplementedError

    def one(self, name: str, params: Params) -> Row | None:
        """First row of a named statement, or ``None``."""
        row: Row | None = self._execute(name, params).fetchone()
        return row

    def all(self, name: str, params: Params) -> list[Row]:
        """Every row of a named statement."""
        return list(self._execute(name, params).fetchall())

    def run(self, name: str, params: Params) -> int:
        """Rows changed by a named statement."""
        return int(self._execute(name, params).rowcount)

"""The SQLite driver: one database file, group commit, the host clock, socket wake-ups.

Everything the store does lives in :class:`~jobguard.backends.sql.store.SQLStore`; this module
only opens connections, runs the named statements of ``queries.sql`` and owns what is SQLite's
own: lists passed as JSON (``json_each``), writes serialised by the file lock, the authorizer
(:mod:`.keeper`) that keeps a step's code from ending the step's transaction.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import Any, TypeVar

from jobguard.backends._sql import load_queries
from jobguard.backends.sql.callers import LoopBridge, unwrap
from jobguard.backends.sql.driver import NamedStatements, Row, StatementRefused, Tx
from jobguard.backends.sqlite.clock import host_clock
from jobguard.backends.sqlite.connection import (
    ProcessLocal,
    SQLiteOptions,
    conn_path,
    failed,
    file_uri,
    is_outage,
    migrate,
    open_connection,
)
from jobguard.backends.sqlite.keeper import StepKeeper, own_savepoint
from jobguard.backends.sqlite.wake import Waker
from jobguard.exceptions import (
    ConfigurationError,
    StepSQLError,
    StoreBrokenError,
    StoreUnavailableError,
)

T = TypeVar("T")

Q = load_queries("jobguard.backends.sqlite")
IDENTITY_CHECK_EVERY_S = 2.0


# The parameters that carry lists (``items``: of records); they reach SQLite as JSON text, read
# back with json_each. Text is kept as it is (not \u-escaped), so text SQLite cannot store is
# refused here as in any other parameter.
_LIST_PARAMS = frozenset({"ids", "tokens", "queues", "items"})
# SQLiteTx.savepoint's statements, in texts no step's statement has (see keeper.OWN).
_ITEM = own_savepoint("item")


class SQLiteTx(NamedStatements):
    """Named statements on one SQLite connection inside a transaction."""

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float]) -> None:
        self._conn = conn
        self._clock = clock

    @property
    def connection(self) -> sqlite3.Connection:
        """The ``sqlite3`` connection of this transaction."""
        return self._conn

    def _execute(self, name: str, params: Mapping[str, Any]) -> sqlite3.Cursor:
        if not _LIST_PARAMS.isdisjoint(params):
            params = {
                k: json.dumps(v, ensure_ascii=False) if k in _LIST_PARAMS else v
                for k, v in params.items()
            }
        if self._conn.row_factory is sqlite3.Row:  # the store's own connections: the hot path
            return self._conn.execute(Q[name], params)
        cursor = self._conn.cursor()
        cursor.row_factory = sqlite3.Row  # a caller's own connection (adopt)
        return cursor.execute(Q[name], params)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit rolled back alone if the block raises."""
        self._conn.execute(_ITEM.begin)
        try:
            yield
        except BaseException:
            self._conn.execute(_ITEM.roll_back)
            raise
        finally:
            self._conn.execute(_ITEM.release)

    def run_with_commit(self, name: str, params: Mapping[str, Any]) -> None:
        """A proving named statement, the transaction's last (SQLite has no round trip to
        save: it runs now); one that does not prove stops the write (see the driver seam)."""
        _proven(self.one(name, {"now": self.now(), **params}), name)

    def now(self) -> float:
        """The store clock (the host clock, or the one a test injected)."""
        return self._clock()

    def statement_now(self) -> float:
        """The store clock: SQLite's statements take it (they read no clock of their own)."""
        return self._clock()


def step_error(
    exc: sqlite3.Error, keeper: StepKeeper | None = None
) -> StepSQLError | StoreUnavailableError:
    """The jobguard error for a failed statement of a db_step: an outage of the store (its file
    or host failing), the step's SQL failing (a constraint, a syntax error), or a statement
    that would have ended the step's transaction or outlived it (refused by ``keeper``)."""
    if keeper is not None and keeper.refused is not None:
        refused, keeper.refused = keeper.refused, None
        return StepSQLError(refused)
    if is_outage(exc):
        return StoreUnavailableError(f"the step's SQLite database failed: {exc}")
    return StepSQLError(f"SQL of the step failed: {exc}")


def _proven(row: Row | None, name: str) -> None:
    """Stop a write whose proving statement did not prove."""
    if row is None or not row["proven"]:
        raise StatementRefused(f"{name} did not hold")


class StepConnection:
    """What ``ctx.db_step`` hands to user code: ``execute`` inside the step's transaction.

    ``commit``, ``rollback`` and ``executescript`` are deliberately absent: the step record and the
    business writes must commit together, so the transaction is not the caller's. Errors of the
    statements are raised as :class:`~jobguard.exceptions.StepSQLError`.
    """

    def __init__(self, conn: sqlite3.Connection, keeper: StepKeeper | None = None) -> None:
        self._conn = conn
        self._keeper = keeper

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        """Run one statement in the step's transaction."""
        try:
            return self._conn.execute(sql, parameters)
        except sqlite3.Error as exc:
            raise step_error(exc, self._keeper) from exc

    def executemany(self, sql: str, seq_of_parameters: Any) -> sqlite3.Cursor:
        """Run one statement for each parameter set, in the step's transaction."""
        try:
            return self._conn.executemany(sql, seq_of_parameters)
        except sqlite3.Error as exc:
            raise step_error(exc, self._keeper) from exc


class SQLiteDriver:
    """Connections to one database file, shared by the threads and forked processes of a host.

    Args:
        path: The database file (created, and migrated to the newest schema, if needed).
        synchronous: ``FULL`` (a commit survives power loss) or ``NORMAL``.
        busy_timeout_s: How long a write waits for another process's transaction.
        clock: The store clock; default the host clock (see :mod:`.clock`). Tests inject one.
    """

    dialect = "sqlite"
    client_errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._options = SQLiteOptions(path, synchronous, busy_timeout_s)
        conn = open_connection(self._options)
        try:
            migrate(conn)
            self._clock: Callable[[], float] = clock or host_clock(conn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"cannot open SQLite database {path!r}: {exc}") from exc
        finally:
            conn.close()
        self._inode = _inode(path)
        self._identity = _identity(path)
        self._identity_checked = time.monotonic()
        self._local = ProcessLocal(replace(self._options, create=False))
        self._waker = Waker(path)

    def write(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run ``fn`` in a durable transaction (grouped with other threads' writes)."""
        try:
            return self._local.committer().run(lambda conn: fn(SQLiteTx(conn, self._clock)))
        except StoreUnavailableError as exc:
            self._check_file(deep=True)
            raise exc from exc.__cause__

    def write_statement(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        """One named write in its own (grouped) transaction, on the store clock."""
        return self.write(lambda tx: tx.all(name, {"now": tx.now(), **params}))

    def write_together(
        self, first: tuple[str, Mapping[str, Any]], statements: Sequence[tuple[Any, Any]]
    ) -> None:
        """The named statement ``first`` and then the caller's ``statements`` in one (grouped)
        transaction: a process of this host has no round trips to save, so they run one after
        the other. ``first`` proves by returning a row whose ``proven`` is true; if it does
        not, or a statement fails, the write stops (:class:`StatementRefused`, caused by the
        failure) and nothing of it commits."""

        def op(tx: SQLiteTx) -> None:
            _proven(tx.one(first[0], {"now": tx.now(), **first[1]}), first[0])
            with self.step_connection(tx) as conn:
                for query, params in statements:
                    try:
                        conn.execute(query, () if params is None else params)
                    except StepSQLError as exc:
                        raise StatementRefused(f"SQLite refused a statement: {exc}") from exc

        self.write(op)

    def read(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run ``fn`` on this thread's read connection."""
        try:
            return fn(SQLiteTx(self._local.reader(), self._clock))
        except (sqlite3.Error, StoreUnavailableError) as exc:
            self._check_file(deep=True)
            raise failed("read", exc) from exc

    def check_usable(self) -> None:
        """Raise :class:`StoreBrokenError` if the file was deleted or replaced since it was opened.

        Cheap enough for every pass of a loop: one ``stat``, and the deep read of the file's
        identity at most every :data:`IDENTITY_CHECK_EVERY_S`.
        """
        self._check_file(deep=time.monotonic() - self._identity_checked >= IDENTITY_CHECK_EVERY_S)

    def _check_file(self, *, deep: bool = False) -> None:
        """Raise :class:`StoreBrokenError` if the file is no longer the one this store opened.

        The inode tells at once; a file made anew at the same path may get the same inode
        number, so ``deep`` also reads the file's identity (when its schema was installed)
        through a fresh connection.
        """
        replaced = _inode(self.path) != self._inode
        if not replaced and deep:
            self._identity_checked = time.monotonic()
            replaced = _identity(self.path) != self._identity
        if not replaced and not os.access(self.path, os.W_OK):
            # A read-only file (or file system) answers reads but refuses every write.
            raise StoreBrokenError(
                f"the SQLite file {self.path!r} is read-only: a worker or scheduler cannot "
                "use it; make it writable, then start the process again"
            )
        if replaced:
            raise StoreBrokenError(
                f"the SQLite file {self.path!r} was deleted or replaced while in use; "
                "restart the process on the current file"
            )

    def adopt(self, connection: Any) -> SQLiteTx:
        """The caller's own open connection to this file, inside its transaction.

        A ``sqlite3`` connection, a SQLAlchemy ``Connection`` or ``Session`` on one, or (through
        :class:`~jobguard.backends.sql.callers.LoopBridge`) an aiosqlite connection.
        """
        connection = unwrap(connection)
        if isinstance(connection, LoopBridge):
            return self._adopt_bridged(connection)
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                "connection= must be a sqlite3.Connection to the store's file (or a SQLAlchemy "
                f"Connection or Session on one), not {type(connection).__name__}"
            )
        try:
            _ = connection.total_changes  # raises on a closed connection, before any SQL
        except sqlite3.ProgrammingError:
            raise ConfigurationError(
                "connection= is closed: pass an open sqlite3 connection to the store's file"
            ) from None
        try:
            theirs = conn_path(connection)
        except sqlite3.Error as exc:
            raise ConfigurationError(f"connection= cannot be used: {exc}") from exc
        self._check_adopted(theirs, connection.isolation_level, connection.in_transaction)
        return SQLiteTx(connection, self._clock)

    def _adopt_bridged(self, bridge: LoopBridge) -> SQLiteTx:
        target = bridge.target
        if not all(hasattr(target, name) for name in ("in_transaction", "isolation_level")):
            raise ConfigurationError(
                "connection= must be an aiosqlite connection to the store's file (or a "
                f"SQLAlchemy AsyncConnection or AsyncSession on one), not {type(target).__name__}"
            )
        names = bridge.execute("PRAGMA database_list").fetchall()
        theirs = next((str(row["file"]) for row in names if row["name"] == "main"), "")
        self._check_adopted(theirs, target.isolation_level, target.in_transaction)
        return SQLiteTx(bridge, self._clock)  # type: ignore[arg-type]  # a DB-API face

    def _check_adopted(self, theirs: str, isolation_level: str | None, in_tx: bool) -> None:
        if not theirs or os.path.realpath(theirs) != os.path.realpath(self.path):
            raise ConfigurationError(
                f"connection= is open on {theirs or 'an in-memory database'!r}, not on the "
                f"store's file {self.path!r}"
            )
        if isolation_level is None and not in_tx:
            raise ConfigurationError(
                "connection= is in autocommit mode outside a transaction: run BEGIN first, "
                "so the job commits or rolls back with your writes"
            )

    @contextmanager
    def step_connection(self, tx: Tx, *, savepoints: bool = False) -> Iterator[StepConnection]:
        """The connection ``db_step`` code gets; it cannot end the step's transaction nor
        change what the connection keeps after it."""
        conn: sqlite3.Connection = tx.connection
        # fn must not end the step's transaction (COMMIT, ROLLBACK, RELEASE): its rows would
        # then commit without the step record; nor set what the next job on the connection
        # would meet (a PRAGMA, a database attached).
        kept = self._local.committer().keeper_of(conn)
        if kept is not None:  # the worker's write connection: its own keeper, turned on
            with kept.watch(savepoints):
                yield StepConnection(conn, kept)
            return
        keeper = StepKeeper(savepoints)  # a caller's connection, for this step alone
        conn.set_authorizer(keeper)
        try:
            yield StepConnection(conn, keeper)
        finally:
            conn.set_authorizer(None)

    def now(self) -> float:
        """The store clock."""
        return self._clock()

    def jobs_added(self, queues: Sequence[str]) -> None:
        """Wake idle workers on this host (any queue: the wake-up is cheap, the check is too)."""
        self._waker.notify()

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Sleep until an enqueue on this host wakes us (True), or ``timeout_s``.

        Also notices a store file that was deleted or replaced under a running worker, which
        would otherwise go on reading the old file and never see a new job.
        """
        self.check_usable()
        return self._waker.wait(timeout_s)

    def interrupt_wait(self) -> None:
        """End this process's :meth:`wait_for_jobs` now (a worker stopping)."""
        self._waker.interrupt()

    def expect_handlers(self, handlers: int) -> None:
        """Nothing to size: each thread reads on a connection of its own, and the writes of
        every thread go through one writer."""

    def keep_connection(self) -> AbstractContextManager[None]:
        """Nothing to keep: each thread already reads on a connection of its own."""
        return nullcontext()

    def close(self) -> None:
        """Close this process's connections and its wake-up socket."""
        self._waker.close()
        self._local.close()


def _identity(path: str) -> str | None:
    """When this file's schema versions were installed: different for every file jobguard made."""
    try:
        conn = sqlite3.connect(f"{file_uri(path)}?mode=ro", uri=True, timeout=5.0)
        try:
            row = conn.execute("SELECT group_concat(applied_at) FROM jobguard_schema").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0])


def _inode(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino

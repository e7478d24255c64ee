"""The PostgreSQL driver: a connection pool, the server's clock, LISTEN/NOTIFY wake-ups.

Everything the store does lives in :class:`~jobguard.backends.sql.store.SQLStore`; this module
opens connections, runs the named statements of ``queries.sql`` (schema-qualified, so they also
run on a caller's own connection) and owns what is PostgreSQL's own: row locks with
``FOR UPDATE SKIP LOCKED`` in the statements, lists as arrays, advisory locks for dedup keys,
transactions retried when the server aborts them for a deadlock or a serialization failure.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any, TypeVar

from jobguard.backends._sql import load_queries
from jobguard.backends.postgres.clock import ServerClock
from jobguard.backends.postgres.kept import KeptConnections
from jobguard.backends.postgres.onetrip import (
    Call,
    OneTrip,
    PreparedStatementsLost,
    Replied,
    UnsendableValue,
    caller_call,
)
from jobguard.backends.postgres.pooled import PooledConnection
from jobguard.backends.postgres.statements import Statement, native_statements
from jobguard.backends.postgres.url import parse_postgres_url
from jobguard.backends.sql.callers import LoopBridge, unwrap
from jobguard.backends.sql.driver import (
    NamedStatements,
    Row,
    StatementCutOff,
    StatementRefused,
    Tx,
    UserCodeError,
)
from jobguard.backends.sql.interrupt import WaitInterrupt
from jobguard.core import messages
from jobguard.exceptions import (
    ConfigurationError,
    StepSQLError,
    StoreBrokenError,
    StoreUnavailableError,
)

try:
    import psycopg
    from psycopg import errors, sql
    from psycopg.adapt import PyFormat
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.pq import TransactionStatus
    from psycopg.rows import dict_row, tuple_row
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "PostgreSQL needs the postgres extra: pip install 'jobguard[postgres]'"
    ) from exc

T = TypeVar("T")
log = logging.getLogger("jobguard.store")
_DEFAULT_POOL_SIZE = 10
# A worker's own threads that use the store beside its handlers: the fetch, the settle, the
# renewals and the schedules.
_WORKER_LOOPS = 4
# A named statement of queries.sql and its parameters.
NamedCall = tuple[str, Mapping[str, Any]]

_RAW = load_queries("jobguard.backends.postgres")
# The store clock in a statement: the time it is given (%(now)s: a test's injected clock), or
# the server's own when that is NULL (Tx.statement_now).
_STORE_NOW = sql.SQL("coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)")
# The server aborted the transaction on its own, or it met statements prepared on its
# connection gone: nothing of it committed, so it is run again.
_RETRYABLE = (errors.DeadlockDetected, errors.SerializationFailure, PreparedStatementsLost)
_RETRIES = 5
# Every connection jobguard opens notices a dead peer or a network that stopped answering in
# seconds, not at the kernel's defaults (hours for an idle socket, ~15 minutes for unanswered
# data): TCP keepalives probe an idle connection, tcp_user_timeout bounds unacknowledged data,
# and the server ends one of jobguard's statements that waits too long for a lock or runs on.
# A setting the URL gives wins over these.
CONNECTION_DEFAULTS: dict[str, str] = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",  # milliseconds
}
SERVER_TIMEOUTS = "-c statement_timeout=60s -c lock_timeout=30s"
_RECONNECT_WINDOW_S = 5.0
# The first words of the statements that end (or split) the transaction a db_step runs in.
_ENDS_TRANSACTION = frozenset(
    {"begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release"}
)
_WORD = re.compile(r"[A-Za-z_]+")
# Statements whose effect outlives the transaction on its connection (see changes_session; a
# SET is one unless LOCAL, TRANSACTION or CONSTRAINTS, which end with the transaction).
_CHANGES_SESSION = frozenset({"reset", "prepare", "deallocate", "listen", "unlisten", "discard"})
# Statements that run alike in a pipeline's implicit transaction (everything sent before its
# Sync, committed by it) and in a BEGIN ... COMMIT block. Others may not: a CALL or a DO block
# that commits would commit what came before it there, and LOCK needs a block.
_ALIKE_WITHOUT_BLOCK = frozenset(
    {"insert", "update", "delete", "merge", "select", "with", "values"}
)


def _pause_before_retry(attempt: int, exc: Exception) -> None:
    """Wait a little, longer each time, before running again a write the server aborted
    (``attempt`` from 0); after the last of :data:`_RETRIES`, give up."""
    if attempt + 1 == _RETRIES:
        raise StoreUnavailableError(f"PostgreSQL write kept failing: {exc}") from exc
    time.sleep(random.uniform(0.001, 0.01 * 2**attempt))


def render_queries(schema: str, raw: Mapping[str, str] = _RAW) -> dict[str, str]:
    """The named statements (``raw``: this package's ``queries.sql``, parsed) with jobguard's
    schema and notification channel filled in.

    The names are quoted by psycopg (never formatted into SQL by hand); the schema name was
    also checked to be a plain identifier where it was given.
    """
    values = {
        "schema": sql.Identifier(schema),
        "channel": sql.Literal(channel_of(schema)),
        "store_now": _STORE_NOW,
    }
    return {name: sql.SQL(text).format(**values).as_string(None) for name, text in raw.items()}


def with_connection_defaults(conninfo: str) -> str:
    """``conninfo`` with :data:`CONNECTION_DEFAULTS` and :data:`SERVER_TIMEOUTS` where it sets
    none of its own (its ``options`` come after ours, so a ``-c`` of the URL's wins)."""
    given = conninfo_to_dict(conninfo)
    params: dict[str, Any] = {**CONNECTION_DEFAULTS, **given}
    params["options"] = f"{SERVER_TIMEOUTS} {given.get('options') or ''}".strip()
    return make_conninfo("", **params)


def channel_of(schema: str) -> str:
    """The LISTEN/NOTIFY channel of one jobguard schema."""
    return f"{schema}_jobs"


# Parameters that are lists of records: each travels as one jsonb (jsonb_to_recordset).
RECORD_LISTS = ("items", "rules")


def bound(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` as psycopg sends them: each list of records (:data:`RECORD_LISTS`) as jsonb."""
    if not any(name in params for name in RECORD_LISTS):
        return params
    return {name: Jsonb(value) if name in RECORD_LISTS else value for name, value in params.items()}


def named_call(statement: Statement, values: Sequence[Any]) -> Call:
    """One of jobguard's statements as a :class:`Call`, prepared at once (see
    PooledConnection)."""
    return Call(statement.native, values, (PyFormat.AUTO,) * len(values), prepare=True)


_BEGIN = Call(b"BEGIN")
_COMMIT = Call(b"COMMIT")


class PostgresTx(NamedStatements):
    """Named statements on one connection inside a transaction.

    With ``prepare_at_once`` (a connection of jobguard's pool in autocommit, each statement
    committed on its own) the statements are prepared at their first run; see
    :class:`~jobguard.backends.postgres.pooled.PooledConnection`.

    A transaction of :meth:`PostgresDriver.write` (``owned``) is begun and ended here, each
    end in one round trip with a statement: BEGIN goes with the first statement, COMMIT with
    those of :meth:`run_with_commit` (see :mod:`~jobguard.backends.postgres.onetrip`), so that
    a step's transaction costs two round trips beside the step's own statements, not four.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | LoopBridge,
        statements: Mapping[str, Statement],
        clock: Callable[[], float] | None,
        server_clock: ServerClock,
        *,
        prepare_at_once: bool = False,
        owned: bool = False,
    ) -> None:
        self._conn = conn
        self._statements = statements
        self._clock = clock
        self._server_clock = server_clock
        self._prepare_at_once = prepare_at_once
        self._owned = owned
        self._unbegun = owned  # BEGIN not sent yet
        self._with_commit: list[Call] = []
        self._sender: OneTrip | None = None

    @property
    def connection(self) -> psycopg.Connection[Any] | LoopBridge:
        """The psycopg connection of this transaction (bridged, for an asyncio caller's)."""
        if self._unbegun:  # what is run on it runs inside the transaction
            self._send([])
        return self._conn

    def _send(self, calls: list[Call]) -> list[Replied]:
        """``calls`` in one round trip, BEGIN first if it was not sent yet; their results."""
        conn = self._conn
        assert isinstance(conn, psycopg.Connection)
        begin = [_BEGIN] if self._unbegun else []
        self._unbegun = False
        if self._sender is None:  # one a connection: it knows what it prepared there
            self._sender = conn.one_trip() if isinstance(conn, PooledConnection) else OneTrip(conn)
        try:
            results = self._sender.run([*begin, *calls])
        except UnsendableValue as exc:  # as psycopg's cursor says it
            raise psycopg.ProgrammingError(str(exc)) from exc
        return [Replied(conn, result) for result in results[len(begin) :]]

    def run_with_commit(self, name: str, params: Mapping[str, Any]) -> None:
        """A named statement sent with this transaction's COMMIT, in one round trip (see the
        driver seam)."""
        assert self._owned, "only a transaction of PostgresDriver.write commits here"
        values = self._statements[name].values(bound({"now": self.statement_now(), **params}))
        self._with_commit.append(named_call(self._statements[name], values))

    def commit(self) -> None:
        """Send :meth:`run_with_commit`'s statements and COMMIT, in one round trip (nothing if
        nothing was run). A failing statement of them fails the write with
        :class:`StatementRefused`, and nothing commits."""
        if self._unbegun and not self._with_commit:
            return
        try:
            self._send([*self._with_commit, _COMMIT])
        except psycopg.Error as exc:
            if not (self._with_commit and refused_by_server(exc)):
                raise
            raise StatementRefused(f"PostgreSQL refused a statement: {exc}") from exc

    def roll_back(self) -> None:
        """End the transaction without committing (nothing if nothing was sent)."""
        conn = self._conn
        assert isinstance(conn, psycopg.Connection)
        if not self._unbegun and not conn.closed:
            with suppress(psycopg.Error):  # a broken connection is closed by its pool
                conn.rollback()

    def _execute(self, name: str, params: Mapping[str, Any]) -> psycopg.Cursor[Any] | Replied:
        statement, conn = self._statements[name], self._conn
        if not isinstance(conn, psycopg.Connection):  # an asyncio caller's, bridged
            bridged: psycopg.Cursor[Any] = conn.cursor().execute(statement.text, bound(params))
            return bridged
        values = statement.values(bound(params))
        if self._unbegun:
            return self._send([named_call(statement, values)])[0]
        if not isinstance(conn, PooledConnection):  # a caller's own, or one of a retry
            return psycopg.RawCursor(conn, row_factory=dict_row).execute(statement.native, values)
        cursor = conn.named_cursor()
        if not self._prepare_at_once:
            return cursor.execute(statement.native, values)
        if conn.first_run(name):
            with conn.pipeline():  # its rows are read after the pipeline's Sync
                return cursor.execute(statement.native, values, prepare=True)
        return cursor.execute(statement.native, values, prepare=True)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit (a savepoint) rolled back alone if the block raises."""
        with self.connection.transaction():
            yield

    def now(self) -> float:
        """The store clock: the server's ``clock_timestamp()`` (or the one a test injected)."""
        if self._clock is not None:
            return self._clock()
        return self._server_clock.now(self.read_server_clock)

    def statement_now(self) -> float | None:
        """The ``now`` a statement is given: see :func:`_injected_now`."""
        return _injected_now(self._clock)

    def read_server_clock(self) -> float:
        """Ask the server for its clock on this transaction's connection (one round trip)."""
        row = self.one("store_clock", {})
        assert row is not None
        return float(row["now"])


# SQLSTATE classes of a failing server or connection, not of the statement: connection
# exceptions (08), operator intervention (57P: admin or crash shutdown, cannot connect now),
# insufficient resources (53), and timeouts and aborts the server decided (a statement or lock
# timeout, a deadlock, a serialization failure).
_OUTAGE_SQLSTATE_PREFIXES = ("08", "57P", "53")
_OUTAGE_SQLSTATES = frozenset({"57014", "55P03", "40001", "40P01"})
# What jobguard's own statements meet when its schema lost what they name: dropped or changed
# (by hand, or migrated by another jobguard version) while in use. No retry brings it back.
_SCHEMA_GONE_SQLSTATES = frozenset(
    {
        "3F000",  # invalid_schema_name
        "42P01",  # undefined_table
        "42703",  # undefined_column
        "42704",  # undefined_object (a type)
        "42883",  # undefined_function
    }
)


def is_outage(exc: psycopg.Error) -> bool:
    """Whether a psycopg error is the server or the connection failing, not the SQL.

    An error with no SQLSTATE is the client's: a connection closed or lost, a pool timeout.
    """
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith(_OUTAGE_SQLSTATE_PREFIXES) or state in _OUTAGE_SQLSTATES


def refused_by_server(exc: psycopg.Error) -> bool:
    """Whether the server refused the statement itself (a value, a constraint, its own check),
    the server and the connection working."""
    return exc.sqlstate is not None and not is_outage(exc)


def connection_broke(exc: psycopg.Error) -> bool:
    """Whether the connection itself failed (reset, closed, terminated), not the statement or
    the pool (a pool timeout is not retried on a new connection: the server is saturated)."""
    if isinstance(exc, PoolTimeout) or not isinstance(exc, psycopg.OperationalError):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))


def step_error(exc: psycopg.Error) -> StepSQLError | StoreUnavailableError:
    """The jobguard error for a failed statement of a db_step: an outage of the store, or the
    step's SQL failing (a constraint, a syntax error)."""
    if is_outage(exc):
        return StoreUnavailableError(f"the step's connection to PostgreSQL failed: {exc}")
    return StepSQLError(f"SQL of the step failed: {exc}")


def cannot_write(access: Row, schema: str) -> str | None:
    """Why a session whose ``write_access`` row is ``access`` cannot write, or ``None``."""
    if access["standby"]:
        return "the server is a standby (in recovery); point the URL at the primary"
    if access["read_only"]:
        return (
            "its sessions are read-only (default_transaction_read_only is on for this "
            "database or role)"
        )
    if access["unwritable"]:
        tables = ", ".join(access["unwritable"])
        return (
            f"role {access['role']!r} may not insert into or update these tables of schema "
            f"{schema!r}: {tables}"
        )
    return None


def leading_words(query: str, count: int = 2) -> list[str]:
    """The first ``count`` words of a statement, lower-cased, after what the server skips
    before it: white space, empty statements (``;``), ``--`` and nested ``/* */`` comments."""
    words: list[str] = []
    i, n = 0, len(query)
    while i < n and len(words) < count:
        if query[i].isspace() or query[i] == ";":
            i += 1
        elif query.startswith("--", i):
            end = query.find("\n", i)
            i = n if end < 0 else end + 1
        elif query.startswith("/*", i):
            depth = 0
            while i < n:
                if query.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif query.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                    if depth == 0:
                        break
                else:
                    i += 1
        else:
            word = _WORD.match(query, i)
            if word is None:
                break
            words.append(word.group(0).lower())
            i = word.end()
    return words


def _injected_now(clock: Callable[[], float] | None) -> float | None:
    """An injected store clock's time; ``None``: the statement reads the server's clock
    itself (a carried reading is off by up to half its round trip, in either direction, and by
    a different amount in each process)."""
    return None if clock is None else clock()


# A step's statements are the same few texts job after job; longer texts (generated ones, say)
# are read each time rather than kept.
_CACHED_STATEMENT_LENGTH = 4096


@functools.lru_cache(maxsize=512)
def _cached_leading_words(query: str) -> tuple[str, ...]:
    return tuple(leading_words(query))


def ends_transaction(words: list[str]) -> bool:
    """Whether a statement beginning with ``words`` (:func:`leading_words`) would end the
    transaction it runs in (or split it)."""
    return bool(words) and (words[0] in _ENDS_TRANSACTION or words == ["prepare", "transaction"])


def changes_session(words: list[str]) -> bool:
    """Whether a statement beginning with ``words`` (:func:`leading_words`) changes what its
    connection keeps after the transaction: a setting set without ``LOCAL``, a statement
    prepared or dropped, a channel listened to or left."""
    if words[:1] == ["set"]:
        return words[1:2] not in (["local"], ["transaction"], ["constraints"])
    return bool(words) and words[0] in _CHANGES_SESSION


def runs_alike_without_block(words: list[str]) -> bool:
    """Whether a statement beginning with ``words`` runs the same in a pipeline's implicit
    transaction as in a BEGIN ... COMMIT block (see :data:`_ALIKE_WITHOUT_BLOCK`)."""
    return bool(words) and words[0] in _ALIKE_WITHOUT_BLOCK


def check_step_statement(conn: psycopg.Connection[Any], query: Any) -> list[str]:
    """Refuse, before it is sent, a step's statement that is not SQL text, that would end (or
    split) the step's transaction, or whose effect would outlive it on the connection
    (:func:`changes_session`); its first words (:func:`leading_words`), read once."""
    if not isinstance(query, str | bytes | sql.Composable):
        raise StepSQLError(f"a db_step statement must be SQL text, not {type(query).__name__}")
    text = query.as_string(conn) if isinstance(query, sql.Composable) else query
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) <= _CACHED_STATEMENT_LENGTH:
        words = list(_cached_leading_words(text))
    else:
        words = leading_words(text)
    if ends_transaction(words):
        raise StepSQLError(messages.STEP_CANNOT_END_ITS_TRANSACTION)
    if changes_session(words):
        raise StepSQLError(messages.STEP_CANNOT_CHANGE_ITS_SESSION)
    return words


class StepConnection:
    """What ``ctx.db_step`` hands to user code: ``execute`` inside the step's transaction.

    Placeholders are psycopg's (``%s`` or ``%(name)s``); rows come back as tuples. The step's
    transaction cannot be ended from here, whatever the text: each call runs one statement (in
    pipeline mode the server refuses a text of several), one that would end the transaction is
    refused before it is sent, and a transaction found ended after a statement fails the step.
    Errors are raised as :class:`~jobguard.exceptions.StepSQLError`, or as
    :class:`~jobguard.exceptions.StoreUnavailableError` when the connection or server failed.
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._ended = False

    def _check(self, query: Any) -> None:
        if self._ended:
            raise StepSQLError("the step's transaction ended; no statement can run in it")
        check_step_statement(self._conn, query)

    def _after(self) -> None:
        if self._conn.info.transaction_status != TransactionStatus.INTRANS:
            self._ended = True
            raise StepSQLError(
                "the step's transaction ended inside the db_step function; nothing of it is "
                "kept with the step record"
            )

    def execute(self, query: str, parameters: Any = None) -> psycopg.Cursor[Any]:
        """Run one statement in the step's transaction."""
        self._check(query)
        cursor = self._conn.cursor(row_factory=tuple_row)
        try:
            if parameters:  # sent with the extended protocol: the server runs one statement
                cursor.execute(query, parameters)
            else:  # psycopg would use the simple protocol, which runs several: force one
                with self._conn.pipeline():
                    cursor.execute(query, parameters)
        except psycopg.Error as exc:
            raise step_error(exc) from exc
        self._after()
        return cursor

    def executemany(self, query: str, params_seq: Any) -> psycopg.Cursor[Any]:
        """Run one statement for each parameter set, in the step's transaction."""
        self._check(query)
        cursor = self._conn.cursor(row_factory=tuple_row)
        try:
            with self._conn.pipeline():
                cursor.executemany(query, params_seq)
        except psycopg.Error as exc:
            raise step_error(exc) from exc
        self._after()
        return cursor


class PostgresDriver:
    """A pool of connections to one PostgreSQL database and jobguard's schema in it.

    Args:
        url: ``postgresql://…`` (``?schema=name`` optional).
        schema: jobguard's schema (default ``jobguard``; wins over the URL's).
        pool_size: Most connections this process opens; by default 10, or more when a worker
            of this process runs more handler threads (:meth:`expect_handlers`).
        clock: The store clock; default the server's. Tests inject one.

    Raises:
        StoreUnavailableError: The database cannot be reached (wrong host, user, password or
            database name); nothing was changed.
        SchemaVersionError: The schema is not at the version this jobguard knows; the message
            says to run ``jobguard migrate``.
    """

    dialect = "postgres"
    client_errors: tuple[type[Exception], ...] = (psycopg.Error,)

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if pool_size is not None and (
            isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1
        ):
            raise ConfigurationError(f"pool_size must be an integer >= 1, not {pool_size!r}")
        parsed = parse_postgres_url(url, schema)
        self.url = parsed.display
        self._redact = parsed.redact
        self.schema = parsed.schema
        self._conninfo = with_connection_defaults(parsed.conninfo)
        self._statements = native_statements(render_queries(self.schema))
        self._clock = clock
        self._server_clock = ServerClock()
        from jobguard.backends.postgres.schema import check_schema

        with self.connect() as conn:
            check_schema(conn, self.schema)
        self._pool_size = _DEFAULT_POOL_SIZE if pool_size is None else pool_size
        self._pool_size_given = pool_size is not None
        self._pool: ConnectionPool[PooledConnection] | None = None
        self._pid = -1
        self._guard = threading.Lock()
        self._kept = KeptConnections(self._pool_of_this_process, lambda: self._pool_size)
        self._listener: psycopg.Connection[Any] | None = None
        self._listener_pid = -1
        self._interrupt = WaitInterrupt()
        self._usable_checked = False
        # Callers' connections already seen to hold this schema (checked once each).
        self._adopted: weakref.WeakSet[Any] = weakref.WeakSet()

    def connect(self, **options: Any) -> psycopg.Connection[Any]:
        """A new autocommit connection of this store's database (closed by the caller)."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True, **options)
        except psycopg.Error as exc:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {self.url}: {self._redact(str(exc).strip())}"
            ) from exc

    def expect_handlers(self, handlers: int) -> None:
        """Room in the pool for a worker of ``handlers`` threads, each of which may hold a
        connection (in a step) beside the worker's own loops; a pool_size given that is
        smaller is kept, and said in a warning."""
        wanted = handlers + _WORKER_LOOPS
        with self._guard:
            if wanted <= self._pool_size:
                return
            if self._pool_size_given:
                log.warning(
                    "pool_size=%d is below the %d connections a worker of %d handler threads "
                    "may use at once: handlers will wait for connections",
                    self._pool_size,
                    wanted,
                    handlers,
                )
                return
            self._pool_size = wanted
            if self._pool is not None and self._pid == os.getpid():
                self._pool.resize(min_size=1, max_size=wanted)

    def keep_connection(self) -> AbstractContextManager[None]:
        """While inside, this thread's calls reuse one pooled connection (see
        :mod:`jobguard.backends.postgres.kept`)."""
        return self._kept.keep()

    def _pool_of_this_process(self) -> ConnectionPool[PooledConnection]:
        pid = os.getpid()
        if self._pool is None or self._pid != pid:
            with self._guard:
                if self._pool is None or self._pid != pid:
                    # A pool (and its connections) must not cross fork(): open a new one.
                    self._pool = ConnectionPool(
                        self._conninfo,
                        min_size=1,
                        max_size=self._pool_size,
                        kwargs={
                            "autocommit": True,
                            # Shown in pg_stat_activity: which worker process holds what.
                            "application_name": f"jobguard:{pid}",
                        },
                        timeout=30.0,
                        # The pool retries a failed connect with doubling delays until this
                        # runs out, then starts over from 1 s on the next demand: a short
                        # limit keeps a restarted server from being noticed minutes late.
                        reconnect_timeout=_RECONNECT_WINDOW_S,
                        open=True,
                        name=f"jobguard-{self.schema}",
                        connection_class=PooledConnection,
                    )
                    self._pid = pid
        return self._pool

    def _tx(
        self,
        conn: psycopg.Connection[Any] | LoopBridge,
        *,
        prepare_at_once: bool = False,
        owned: bool = False,
    ) -> PostgresTx:
        return PostgresTx(
            conn,
            self._statements,
            self._clock,
            self._server_clock,
            prepare_at_once=prepare_at_once,
            owned=owned,
        )

    def write(self, fn: Callable[[PostgresTx], T]) -> T:
        """Run ``fn`` in one transaction; retried if the server aborted it (deadlock), and once
        on a new connection if its connection broke before the commit was sent (a reset): then
        nothing of it committed, so it is run again instead of left to a lease."""
        fresh = False
        for attempt in range(_RETRIES):
            committing = False
            try:
                with self._writing(fresh=fresh) as conn:
                    tx = self._tx(conn, owned=True)
                    try:
                        result = fn(tx)
                        committing = True  # from here an error may come after the commit landed
                        tx.commit()
                    except BaseException:
                        tx.roll_back()
                        raise
                return result
            except UserCodeError as exc:
                raise exc.original from exc.original.__cause__
            except _RETRYABLE as exc:
                _pause_before_retry(attempt, exc)
            except psycopg.Error as exc:  # the pool's own errors (a timeout) included
                if not fresh and not committing and connection_broke(exc):
                    fresh = True
                    continue
                raise self._failed("write", exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def write_statement(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        """One named write on a pooled autocommit connection; see the driver seam."""

        def send(conn: PooledConnection) -> list[Row]:
            tx = self._tx(conn, prepare_at_once=True)
            return tx.all(name, {"now": tx.statement_now(), **params})

        return self._write_on_its_own(name, send, ours=True)

    def _write_on_its_own(
        self, what: str, send: Callable[[PooledConnection], T], *, ours: bool
    ) -> T:
        """Run ``send`` on a pooled autocommit connection, again if the server aborted it (a
        deadlock: nothing of it was written); a failure raised as the driver seam says of
        :meth:`write_statement` (refused, cut off, or the store unavailable), or, when every
        statement is ``ours`` (none a caller's), as broken when jobguard's schema lost what
        they name."""
        for attempt in range(_RETRIES):
            try:
                with self._kept.connection() as conn:
                    return send(conn)
            except _RETRYABLE as exc:
                _pause_before_retry(attempt, exc)
            except psycopg.Error as exc:
                if ours and exc.sqlstate in _SCHEMA_GONE_SQLSTATES:
                    raise self._failed("write", exc) from exc
                if refused_by_server(exc):
                    raise StatementRefused(f"PostgreSQL refused {what}: {exc}") from exc
                if connection_broke(exc):
                    raise StatementCutOff(f"PostgreSQL write failed: {exc}") from exc
                raise StoreUnavailableError(f"PostgreSQL write failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def write_together(self, first: NamedCall, statements: Sequence[tuple[Any, Any]]) -> None:
        """One transaction sent in one round trip (libpq's pipeline mode: see
        :mod:`~jobguard.backends.postgres.onetrip`): the named statement ``first``, then the
        caller's ``statements`` (SQL text and parameters, each checked before anything is sent
        as a db_step's are). When every one of ``statements`` is plain DML
        (:func:`runs_alike_without_block`) they run in the pipeline's implicit transaction,
        committed at its end; otherwise between BEGIN and COMMIT.

        The server stops at the first statement that fails and skips the rest, the commit
        included: then nothing of it commits. Run again if the server aborted it (a deadlock).
        Raises :class:`StatementRefused`, caused by the server's error, when a statement failed;
        :class:`StatementCutOff` when the connection broke (it may have committed); any other
        failure as a :class:`StoreUnavailableError`; a statement whose placeholders and
        parameters do not match, or whose values cannot be sent, as a
        :class:`~jobguard.exceptions.StepSQLError` before anything is sent.
        """

        def send(conn: PooledConnection) -> None:
            starts = [check_step_statement(conn, query) for query, _ in statements]
            if any(words[:1] == ["copy"] for words in starts):
                raise StepSQLError(
                    "a db_writes statement cannot be COPY: its rows would need an exchange with "
                    "the server of their own; write them with INSERT"
                )
            block = not all(runs_alike_without_block(words) for words in starts)
            try:
                calls = [self._named_call(first), *(caller_call(conn, *s) for s in statements)]
                if block:
                    calls = [Call(b"BEGIN"), *calls, Call(b"COMMIT")]
                self._send_together(conn, calls)
            except UnsendableValue as exc:  # the caller's mistake, not the store failing
                raise StepSQLError(f"SQL of the step failed: {exc}") from exc.__cause__

        self._write_on_its_own("a statement", send, ours=False)

    def _named_call(self, named: NamedCall) -> Call:
        """jobguard's named statement as a :class:`Call`."""
        own = self._statements[named[0]]
        return named_call(own, own.values({"now": _injected_now(self._clock), **named[1]}))

    @staticmethod
    def _send_together(conn: PooledConnection, calls: list[Call]) -> None:
        """:meth:`write_together`'s round trip; a failed one is rolled back before the
        connection goes back to the pool.

        Without BEGIN the statements run in the pipeline's implicit transaction: the server
        commits everything sent before the pipeline's one Sync, or, at the first failure, skips
        the rest and rolls back what ran (two statements fewer to send than BEGIN and COMMIT).
        """
        try:
            conn.one_trip().run(calls)
        except (psycopg.Error, PreparedStatementsLost):
            if not conn.closed:
                with suppress(psycopg.Error):
                    conn.rollback()
            raise

    @contextmanager
    def _writing(self, *, fresh: bool) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection, or (``fresh``) a new one of its own, closed after the write."""
        if not fresh:
            with self._kept.connection() as kept:
                yield kept
            return
        try:
            conn = psycopg.connect(
                self._conninfo, autocommit=True, application_name=f"jobguard:{os.getpid()}"
            )
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"PostgreSQL write failed: {exc}") from exc
        with conn:
            yield conn

    def read(self, fn: Callable[[PostgresTx], T]) -> T:
        """Run ``fn`` on a pooled connection (each statement sees committed data)."""
        try:
            with self._kept.connection() as conn:
                return fn(self._tx(conn))
        except psycopg.Error as exc:
            raise self._failed("read", exc) from exc

    def _failed(self, what: str, exc: psycopg.Error) -> StoreUnavailableError:
        """The error for a failed read or write of jobguard's own statements: the store
        broken when its schema lost what they name (a worker stops on it, saying why), else
        unavailable (retried)."""
        if exc.sqlstate in _SCHEMA_GONE_SQLSTATES:
            # The primary message alone: one line, without the statement it quotes.
            return StoreBrokenError(
                messages.schema_lost(
                    f"PostgreSQL {what} failed: {exc.diag.message_primary or exc}",
                    f"jobguard's schema {self.schema!r}",
                )
            )
        return StoreUnavailableError(f"PostgreSQL {what} failed: {exc}")

    def adopt(self, connection: Any) -> PostgresTx:
        """The caller's own connection to this database, inside its transaction.

        A psycopg ``Connection`` (a pooled one too), a SQLAlchemy ``Connection`` or ``Session``
        on psycopg, or (through :class:`~jobguard.backends.sql.callers.LoopBridge`) a psycopg
        ``AsyncConnection``.
        """
        connection = unwrap(connection)
        own = connection.target if isinstance(connection, LoopBridge) else connection
        if not isinstance(own, psycopg.Connection | psycopg.AsyncConnection):
            raise ConfigurationError(
                "connection= must be a psycopg connection to the store's database (or a "
                f"SQLAlchemy Connection or Session on one), not {type(own).__name__}"
            )
        if own.closed:
            raise ConfigurationError(
                "connection= is closed: pass an open psycopg connection to the store's database"
            )
        status = own.info.transaction_status
        if own.autocommit and status == TransactionStatus.IDLE:
            raise ConfigurationError(
                "connection= is in autocommit mode outside a transaction: use "
                "`with conn.transaction():` so the job commits or rolls back with your writes"
            )
        if status == TransactionStatus.INERROR:
            raise ConfigurationError("connection= is in a failed transaction; roll it back first")
        if own not in self._adopted:
            self._check_adopted_schema(connection, own.info.dbname)
            self._adopted.add(own)
        return self._tx(connection)

    def _check_adopted_schema(
        self, connection: psycopg.Connection[Any] | LoopBridge, database: str
    ) -> None:
        """Refuse a caller's connection to a database without this store's tables, with the
        reason, instead of psycopg's own error from the enqueue's first statement."""
        try:
            row = (
                connection.cursor(row_factory=dict_row)  # a bridged one gives dicts anyway
                .execute("SELECT to_regclass(format('%%I.jobs', %s::text)) AS jobs", [self.schema])
                .fetchone()
            )
        except psycopg.Error as exc:
            raise ConfigurationError(f"connection= cannot be used: {exc}") from exc
        if row is None or row["jobs"] is None:
            raise ConfigurationError(
                f"connection= is on database {database!r}, which has no jobguard "
                f"schema {self.schema!r}: pass a connection to the store's database (or run "
                "`jobguard migrate` if it is that one)"
            )

    @contextmanager
    def step_connection(self, tx: Tx, *, savepoints: bool = False) -> Iterator[StepConnection]:
        """The connection ``db_step`` code gets; it cannot end the step's transaction.

        Checked after the code ran (savepoints of its own are always allowed here).
        """
        conn: psycopg.Connection[Any] = tx.connection
        yield StepConnection(conn)
        if conn.info.transaction_status != TransactionStatus.INTRANS:
            raise StepSQLError(
                "the db_step function ended the step's transaction; its rows and the step "
                "record must commit together"
            )

    def now(self) -> float:
        """The store clock (a connection is taken only when the server must be asked)."""
        carried = self._server_clock.carried() if self._clock is None else None
        return carried if carried is not None else self.read(lambda tx: tx.now())

    def check_usable(self) -> None:
        """Raise :class:`StoreBrokenError` if this session cannot write jobguard's tables (a
        read-only database, role or server, or missing privileges), the first time it is
        called: a worker or scheduler says so in one line instead of failing every fetch. Later
        calls check nothing: the server's errors surface when it is used, and a standby
        promoted meanwhile (a failover) is an outage that passes."""
        if self._usable_checked:
            return
        access = self.read(lambda tx: tx.one("write_access", {"schema": self.schema}))
        self._usable_checked = True
        if access is None:  # pragma: no cover - the statement returns one row
            return
        cause = cannot_write(access, self.schema)
        if cause is not None:
            raise StoreBrokenError(
                f"PostgreSQL at {self.url} is read-only for jobguard: {cause}; a worker or "
                "scheduler cannot use it"
            )

    def jobs_added(self, queues: Sequence[str]) -> None:
        """Nothing to do: the enqueue's own NOTIFY wakes workers when it commits."""

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Sleep until a NOTIFY for one of ``queues`` arrives (True), or ``timeout_s``."""
        listener = self._listening()
        if listener is None:
            self._interrupt.wait([], timeout_s)
            return False
        wanted = set(queues)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                # What has arrived already, psycopg's backlog included (a notification that came
                # in with a command's reply is never seen by select()).
                for notify in listener.notifies(timeout=0.0):
                    if notify.payload in wanted:
                        return True
                left = deadline - time.monotonic()
                # Sleep in select() until the server sends something: psycopg's own timed wait
                # for notifications wakes thousands of times a second while idle.
                if left <= 0 or not self._interrupt.wait([listener.fileno()], left):
                    return False
        except (psycopg.Error, OSError, ValueError):
            self._drop_listener()  # listened again on the next wait; meanwhile we poll
        return False

    def interrupt_wait(self) -> None:
        """End this process's :meth:`wait_for_jobs` now (a worker stopping)."""
        self._interrupt.interrupt()

    def _listening(self) -> psycopg.Connection[Any] | None:
        listener = self._listener
        if listener is not None and self._listener_pid == os.getpid() and not listener.closed:
            return listener
        try:
            conn = self.connect(application_name=f"jobguard:{os.getpid()}")
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_of(self.schema))))
        except (StoreUnavailableError, psycopg.Error):
            return None
        self._listener, self._listener_pid = conn, os.getpid()
        return conn

    def _drop_listener(self) -> None:
        if self._listener is not None and self._listener_pid == os.getpid():
            with suppress(psycopg.Error):
                self._listener.close()
        self._listener = None

    def close(self) -> None:
        """Close this process's pool and listening connection."""
        self._drop_listener()
        self._interrupt.close()
        if self._pool is not None and self._pid == os.getpid():
            self._pool.close()
        self._pool = None

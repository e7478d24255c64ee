"""SQLite connections for the embedded backend: pragmas, migrations and group commit.

Several worker processes share one database file (WAL mode). Within a process, concurrent writes
from worker threads are grouped: the first thread to arrive becomes the leader, runs every pending
write in one ``BEGIN IMMEDIATE`` transaction (each in its own savepoint, so one refused write does
not undo the others) and commits once. Every caller returns only after its write is durable, so
the guarantees are those of one transaction per write, at a fraction of the fsyncs.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from jobguard.backends.sql.driver import UserCodeError
from jobguard.backends.sql.schema import migrations_of, pending
from jobguard.backends.sqlite.keeper import OWN, StepKeeper, own_savepoint
from jobguard.core import messages
from jobguard.exceptions import ConfigurationError, StoreBrokenError, StoreUnavailableError

T = TypeVar("T")

_PACKAGE = "jobguard.backends.sqlite"


@dataclass(frozen=True, slots=True)
class SQLiteOptions:
    """How connections to the database file are opened.

    Attributes:
        path: The database file (created if missing).
        synchronous: ``FULL`` (default: a commit survives power loss) or ``NORMAL``.
        busy_timeout_s: How long a write waits for another process's transaction before failing
            with :class:`~jobguard.exceptions.StoreUnavailableError`.
        create: Create the file if it is missing. Off once the store is open: a file deleted
            under a running worker must fail its next connection, not become a new empty one.
    """

    path: str
    synchronous: str = "FULL"
    busy_timeout_s: float = 30.0
    create: bool = True

    def __post_init__(self) -> None:
        if self.synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigurationError(
                f"synchronous must be FULL, NORMAL or EXTRA, not {self.synchronous!r}"
            )
        if self.busy_timeout_s < 0:
            raise ConfigurationError("busy_timeout_s must be >= 0")


def open_connection(
    options: SQLiteOptions, *, busy_timeout_s: float | None = None
) -> sqlite3.Connection:
    """Open a connection in autocommit mode (transactions are explicit) with our pragmas."""
    try:
        target = options.path if options.create else f"{file_uri(options.path)}?mode=rw"
        conn = sqlite3.connect(
            target,
            timeout=options.busy_timeout_s if busy_timeout_s is None else busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            uri=not options.create,
        )
        conn.row_factory = sqlite3.Row
        _enable_wal(conn, options.busy_timeout_s)
        # Checked against a literal list in SQLiteOptions, so never user text here.
        conn.execute(f"{OWN}PRAGMA synchronous={options.synchronous}")
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot open SQLite database {options.path!r}: {exc}") from exc
    return conn


def file_uri(path: str) -> str:
    """A ``file:`` URI naming ``path`` exactly (``?`` and ``#`` in names are escaped)."""
    return "file:" + urllib.parse.quote(os.path.abspath(path))


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another process holds the file.

    SQLite answers this pragma with "database is locked" at once, without calling the busy
    handler, while another process creates the schema or checkpoints on close; several workers
    opening a new file together hit that window.
    """
    deadline = time.monotonic() + timeout_s
    pause_s = 0.001
    while True:
        try:
            conn.execute(OWN + "PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(pause_s * (0.5 + random.random()))
        pause_s = min(pause_s * 2, 0.05)


def split_statements(script: str) -> list[str]:
    """Split a SQL script into complete statements (comments and blank lines dropped)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if not buffer and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement at end of script: {buffer[:80]!r}")
    return statements


_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS jobguard_schema ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return found is not None


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the file (0 for a file jobguard never touched)."""
    if not _has_table(conn, "jobguard_schema"):
        return _legacy_version(conn)
    row = conn.execute("SELECT max(version) FROM jobguard_schema").fetchone()
    return int(row[0] or 0)


def _legacy_version(conn: sqlite3.Connection) -> int:
    """Files of jobguard 0.1 kept their version in ``PRAGMA user_version`` beside a jobs table."""
    if not _has_table(conn, "jobs"):
        return 0
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def conn_path(conn: sqlite3.Connection) -> str:
    """The file behind a connection's main database."""
    for _seq, name, path in conn.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(path)
    return ""


def planned_migrations(path: str) -> tuple[int, list[str]]:
    """What migrating the file at ``path`` would apply: (its version, the SQL), changing
    nothing: a missing file is not created, and an existing one is read without a lock and
    without switching its journal mode (what ``migrate --dry-run`` shows)."""
    if not os.path.exists(path):
        todo = pending(0, migrations_of(_PACKAGE), f"the SQLite database {path!r}")
        return 0, [sql for _version, _name, sql in todo]
    try:
        conn = sqlite3.connect(f"{file_uri(path)}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot open SQLite database {path!r}: {exc}") from exc
    try:
        current = schema_version(conn)
        todo = pending(current, migrations_of(_PACKAGE), f"the SQLite database {path!r}")
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot read SQLite database {path!r}: {exc}") from exc
    finally:
        conn.close()
    return current, [sql for _version, _name, sql in todo]


def migrate(conn: sqlite3.Connection, *, dry_run: bool = False) -> tuple[int, list[str]]:
    """Apply the migrations this database lacks, in one transaction.

    Returns the version reached and the SQL of what was (or, with ``dry_run``, would be)
    applied. ``PRAGMA user_version`` belongs to the file's owner: a file that jobguard 0.1
    versioned there is moved to jobguard's own table and the pragma is given back (set to 0).
    """
    migrations = migrations_of(_PACKAGE)
    try:
        # Opening a current file takes no write lock: a producer may open the store while its
        # own transaction on the file is open (transactional enqueue).
        current = schema_version(conn)
        if not pending(current, migrations, f"the SQLite database {conn_path(conn)!r}"):
            return current, []
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            todo = pending(current, migrations, f"the SQLite database {conn_path(conn)!r}")
            applied = [sql for _version, _name, sql in todo]
            if dry_run:
                conn.execute("ROLLBACK")
                return current, applied
            now = time.time()
            if current > 0 and not _has_table(conn, "jobguard_schema"):
                conn.execute(_VERSION_TABLE)
                conn.executemany(
                    "INSERT INTO jobguard_schema (version, name, applied_at) VALUES (?, ?, ?)",
                    [(v, n, now) for v, n, _sql in migrations if v <= current],
                )
                conn.execute("PRAGMA user_version=0")
            conn.execute(_VERSION_TABLE)
            for version, name, sql in todo:
                for statement in split_statements(sql):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO jobguard_schema (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, now),
                )
                current = version
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot migrate the SQLite database: {exc}") from exc
    return current, applied


class _Request:
    __slots__ = ("done", "error", "fn", "result", "wake")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.fn = fn
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        # Held until the request is done or its thread is handed the lead: one wake-up per
        # request, instead of waking every waiting thread after each commit.
        self.wake = threading.Lock()
        self.wake.acquire()


# The write connection's own statements, in texts no step's statement has (see keeper.OWN).
_BEGIN = OWN + "BEGIN IMMEDIATE"
_REQUEST = own_savepoint("request")
_COMMIT = OWN + "COMMIT"
_ROLLBACK = OWN + "ROLLBACK"


class GroupCommitter:
    """Runs write functions in shared transactions; see the module docstring."""

    def __init__(self, options: SQLiteOptions) -> None:
        self._options = options
        self._pending: list[_Request] = []
        self._mutex = threading.Lock()
        self._leading = False
        self._conn: sqlite3.Connection | None = None
        # The write connection's authorizer, for its life: it watches only a step's statements.
        self._keeper = StepKeeper(watching=False)

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` inside a write transaction and return once it is committed."""
        request = _Request(fn)
        with self._mutex:
            self._pending.append(request)
            lead = not self._leading
            self._leading = True
        if not lead:
            request.wake.acquire()  # done by another leader, or handed the lead
        if not request.done:
            self._lead()
        if request.error is not None:
            error = request.error
            if isinstance(error, UserCodeError):
                raise error.original
            raise error
        result: T = request.result
        return result

    def _lead(self) -> None:
        with self._mutex:
            batch, self._pending = self._pending, []
        try:
            self._commit(batch)
        finally:
            for request in batch:
                request.done = True
                request.wake.release()
            with self._mutex:
                if self._pending:
                    self._pending[0].wake.release()  # it wakes up not done: it leads next
                else:
                    self._leading = False

    def close(self) -> None:
        """Close the write connection (waits for a commit in progress)."""
        while True:
            with self._mutex:
                if not self._leading:
                    if self._conn is not None:
                        self._conn.close()
                        self._conn = None
                    return
            time.sleep(0.001)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # No busy handler on the write connection: SQLite's own sleeps in steps of up to
            # 100 ms, far longer than a write transaction here; _begin retries at finer grain.
            conn = open_connection(self._options, busy_timeout_s=0.0)
            conn.set_authorizer(self._keeper)
            self._conn = conn
        return self._conn

    def keeper_of(self, conn: sqlite3.Connection) -> StepKeeper | None:
        """The keeper installed on ``conn`` if it is this committer's write connection."""
        return self._keeper if conn is self._conn else None

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, retried with short jittered sleeps until the busy timeout."""
        deadline = time.monotonic() + self._options.busy_timeout_s
        pause_s = 0.0001
        while True:
            try:
                conn.execute(_BEGIN)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreUnavailableError(
                        f"database stayed locked for {self._options.busy_timeout_s:g}s"
                    ) from exc
            time.sleep(pause_s * (0.5 + random.random()))
            pause_s = min(pause_s * 2, 0.004)

    def _commit(self, batch: list[_Request]) -> None:
        try:
            conn = self._connection()
            self._begin(conn)
        except (sqlite3.Error, StoreUnavailableError) as exc:
            self._fail_all(batch, exc)
            return
        try:
            for request in batch:
                conn.execute(_REQUEST.begin)
                try:
                    request.result = request.fn(conn)
                except BaseException as exc:  # the caller gets it; the others still commit
                    conn.execute(_REQUEST.roll_back)
                    request.error = (
                        exc if not isinstance(exc, sqlite3.Error) else failed("write", exc)
                    )
                conn.execute(_REQUEST.release)
            conn.execute(_COMMIT)
        except sqlite3.Error as exc:
            # Savepoint or commit failed (disk full, I/O error): nothing of the batch is durable.
            # Every caller must hear so, and the connection must not stay inside a transaction.
            with contextlib.suppress(sqlite3.Error):
                conn.execute(_ROLLBACK)
            self._fail_all(batch, exc)

    @staticmethod
    def _fail_all(batch: list[_Request], exc: BaseException) -> None:
        error = exc if isinstance(exc, StoreUnavailableError) else failed("write", exc)
        for request in batch:
            request.result = None
            request.error = error


# Primary result codes of the database file or its host failing, not of the SQL: busy or locked
# past the timeout, out of memory, interrupted, I/O error, corrupt, disk full, cannot open,
# lock protocol error, read-only.
_OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_READONLY,
    }
)


def is_outage(exc: sqlite3.Error) -> bool:
    """Whether a sqlite3 error is the store's file or host failing, not the SQL.

    A closed connection (``ProgrammingError`` without a code) is the store's too.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "closed" in str(exc)
    return code & 0xFF in _OUTAGE_CODES


# What jobguard's own statements meet when the file lost tables or columns they name (dropped,
# or migrated by another jobguard version) while in use. No retry brings them back.
_SCHEMA_LOST = ("no such table", "no such column", "no such function")


def failed(what: str, exc: BaseException) -> StoreUnavailableError:
    """The error for a failed read or write of jobguard's own statements: the store broken when
    it cannot be written or lost jobguard's tables (a worker stops on it, saying why), else
    unavailable (retried)."""
    text = str(exc)
    if what == "write" and ("readonly" in text or "read-only" in text):
        wrapped: StoreUnavailableError = StoreBrokenError(
            f"the SQLite database cannot be written: {exc}"
        )
    elif isinstance(exc, sqlite3.OperationalError) and text.startswith(_SCHEMA_LOST):
        wrapped = StoreBrokenError(
            messages.schema_lost(f"SQLite {what} failed: {exc}", "jobguard's tables in the file")
        )
    else:
        wrapped = StoreUnavailableError(f"SQLite {what} failed: {exc}")
    wrapped.__cause__ = exc
    return wrapped


class ProcessLocal:
    """Per-process, per-thread connections and one group committer per process.

    A connection must not cross ``fork()``; when the process id changes, fresh ones are opened.
    """

    def __init__(self, options: SQLiteOptions) -> None:
        self._options = options
        self._pid = -1
        self._committer: GroupCommitter | None = None
        self._readers = threading.local()
        self._guard = threading.Lock()

    def committer(self) -> GroupCommitter:
        """The group committer of this process."""
        pid = os.getpid()
        if self._pid != pid or self._committer is None:
            with self._guard:
                if self._pid != pid or self._committer is None:
                    self._committer = GroupCommitter(self._options)
                    self._readers = threading.local()
                    self._pid = pid
        return self._committer

    def reader(self) -> sqlite3.Connection:
        """A read connection for the calling thread."""
        self.committer()  # resets per-thread state after a fork
        conn: sqlite3.Connection | None = getattr(self._readers, "conn", None)
        if conn is None:
            conn = open_connection(self._options)
            self._readers.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's reader and the process's write connection."""
        if self._pid == os.getpid():
            conn = getattr(self._readers, "conn", None)
            if conn is not None:
                conn.close()
                self._readers.conn = None
            if self._committer is not None:
                self._committer.close()

"""A transaction's statements sent together and read back in one round trip, in libpq's
pipeline mode, below psycopg's cursors.

psycopg's pipeline (``Connection.pipeline``) runs each statement through its cursor's
generators and waits on the socket after every statement it queues and twice more at its end:
on one thread of the 2-core VM a step-shaped transaction of five statements cost the client
343-405 us of CPU that way, against 134-153 us sent from here with one flush and one wait for
the replies (``python -m bench.pipeline_threads --ways all,onetrip``). A ``db_writes`` step
knows every statement before it sends one, so it needs none of what the cursors add: the
values are dumped first by psycopg's own adapters (nothing is sent when one cannot be), then
the statements are queued, synced once and every reply read, and the server's first error is
raised as psycopg raises it. What the server does is unchanged: the same statements in the
same pipeline, each on its own (the extended protocol runs one statement a text), up to one
Sync. The driver's write transactions use it for their two ends as well: ``BEGIN`` with the
first statement (its rows read back as :class:`Replied`), ``COMMIT`` with the last.

A statement is prepared on its connection at once (jobguard's own), or as psycopg prepares it
(a caller's: after the connection's ``prepare_threshold`` uses, never when that is ``None``),
and at most :data:`MOST_PREPARED` on a connection; later ones go unprepared, so that
statements built anew for every job cannot fill the server's memory.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result

from jobguard.backends.postgres.placeholders import convert

# Prepared statements a connection keeps for this module (psycopg keeps as many of its own).
MOST_PREPARED = 100
# Texts whose uses a connection counts towards their prepare, at the most (then it starts again).
_MOST_COUNTED = 1000

_UNKNOWN_STATEMENT_NAME = "26000"  # invalid_sql_statement_name
_OK = frozenset({pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY})
_READ = select.POLLIN | select.POLLERR | select.POLLHUP
_WRITE = _READ | select.POLLOUT


class PreparedStatementsLost(Exception):
    """The server no longer had a statement this connection prepared (a ``DEALLOCATE`` that
    psycopg did not see, having prepared none of its own): the run failed at it, so the
    transaction it was part of cannot commit. Every statement is forgotten as prepared, so
    that the transaction, run again, prepares them anew."""


class UnsendableValue(Exception):
    """A statement that cannot be sent as given (its placeholders and parameters do not match,
    or a value has no PostgreSQL form); raised before anything is sent."""


@dataclass(frozen=True)
class Call:
    """One statement to send: its text with ``$n`` placeholders, its values (``None``: it has
    none), the format each value is dumped in, and when it is prepared: at once (``True``),
    never (``False``), or as psycopg prepares a statement (``None``)."""

    native: bytes
    values: Sequence[Any] | None = None
    formats: Sequence[PyFormat] = ()
    prepare: bool | None = False


def caller_call(conn: psycopg.Connection[Any], query: Any, params: Any) -> Call:
    """A caller's statement (psycopg's placeholders: text, bytes or ``psycopg.sql``) as a
    :class:`Call`, prepared as psycopg prepares it; with ``params`` ``None`` its text is sent
    as it is, ``%`` and all, as psycopg sends it."""
    try:
        encoding = conn.info.encoding
        if isinstance(query, sql.Composable):
            text = query.as_bytes(conn)
        else:
            text = query.encode(encoding) if isinstance(query, str) else query
        if params is None:
            return Call(text, prepare=None)
        converted = convert(text, encoding)
        return Call(converted.native, converted.values(params), converted.formats, prepare=None)
    except (psycopg.Error, TypeError, ValueError) as exc:
        raise UnsendableValue(str(exc)) from exc


class Replied:
    """A statement's result read by :class:`OneTrip`, read as a psycopg cursor of dict rows is
    (``fetchone``, ``fetchall``, ``rowcount``)."""

    def __init__(self, conn: psycopg.Connection[Any], result: pq.abc.PGresult | None) -> None:
        self._rows: list[dict[str, Any]] = []
        self.rowcount = -1
        if result is None:
            return
        self.rowcount = result.command_tuples if result.command_tuples is not None else -1
        if result.nfields:
            encoding = conn.info.encoding
            names = [(result.fname(i) or b"").decode(encoding) for i in range(result.nfields)]
            loader = Transformer(conn)
            loader.set_pgresult(result)
            self._rows = loader.load_rows(
                0, result.ntuples, lambda row: dict(zip(names, row, strict=True))
            )

    def fetchone(self) -> dict[str, Any] | None:
        """The first row, or ``None``."""
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[dict[str, Any]]:
        """Every row."""
        return self._rows


@dataclass(frozen=True)
class _Dumped:
    call: Call
    params: Sequence[Any] | None
    types: tuple[int, ...]
    formats: Sequence[pq.Format] | None


class OneTrip:
    """Sends :class:`Call` lists on one connection (kept by it: it knows what it prepared)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._transformer = Transformer(conn)
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._names_given = 0  # a name is never given twice: one dropped alone may live on
        self._uses: dict[tuple[bytes, tuple[int, ...]], int] = {}
        self._poller: select.poll | None = None
        self._events = 0

    def run(self, calls: Sequence[Call]) -> list[pq.abc.PGresult | None]:
        """Send ``calls`` and read every reply, in one round trip; each call's result.

        Raises the server's first error as psycopg does (its class by SQLSTATE); the server ran
        nothing after it, up to the Sync; :class:`PreparedStatementsLost` when that error was a
        statement prepared before this run found gone. A failure of the connection raises
        psycopg's ``OperationalError``, and anything unforeseen midway closes the connection
        before it is raised: a connection is never left halfway through a pipeline.
        """
        try:  # a value that cannot be sent: none is
            dumped = [self._dump(call) for call in calls]
        except (psycopg.Error, TypeError, ValueError) as exc:
            raise UnsendableValue(str(exc)) from exc
        conn = self._conn
        with conn.lock:
            pgconn = conn.pgconn
            try:
                pgconn.enter_pipeline_mode()
                replies, by_old_name = self._send(pgconn, dumped)
                pgconn.pipeline_sync()
                self._flush(pgconn)
                error, results = self._read(pgconn, replies)
                pgconn.exit_pipeline_mode()
            except BaseException:
                pgconn.finish()  # psycopg then reads the connection as closed
                raise
        if error is not None:
            if by_old_name and error.sqlstate == _UNKNOWN_STATEMENT_NAME:
                self.forget_prepared()
                raise PreparedStatementsLost(str(error)) from error
            raise error
        return results

    def forget_prepared(self) -> None:
        """Every statement this connection had prepared is gone (``DEALLOCATE ALL``)."""
        self._prepared.clear()

    def _dump(self, call: Call) -> _Dumped:
        if call.values is None:
            return _Dumped(call, None, (), None)
        params = self._transformer.dump_sequence(call.values, call.formats)
        types = tuple(self._transformer.types or ())
        return _Dumped(call, params, types, self._transformer.formats)

    def _send(
        self, pgconn: pq.abc.PGconn, dumped: list[_Dumped]
    ) -> tuple[list[_Prepare | None], bool]:
        """Queue every statement; what each reply will answer (a prepare, or ``None``), and
        whether a statement went by a name prepared before this run."""
        replies: list[_Prepare | None] = []
        preparing: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        by_old_name = False
        for each in dumped:
            key = (each.call.native, each.types)
            name = self._prepared.get(key)
            by_old_name = by_old_name or name is not None
            name = name or preparing.get(key)
            made = len(self._prepared) + len(preparing)
            if name is None and made < MOST_PREPARED and self._prepare_now(key, each.call):
                name = b"_jg_%d" % self._names_given
                self._names_given += 1
                pgconn.send_prepare(name, each.call.native, each.types or None)
                preparing[key] = name
                replies.append(_Prepare(key, name))
            if name is not None:
                pgconn.send_query_prepared(name, each.params, each.formats)
            else:
                pgconn.send_query_params(
                    each.call.native, each.params, each.types or None, each.formats
                )
            replies.append(None)
        return replies, by_old_name

    def _prepare_now(self, key: tuple[bytes, tuple[int, ...]], call: Call) -> bool:
        """Whether a statement not prepared yet is prepared at this use."""
        if call.prepare is not None:
            return call.prepare
        threshold = self._conn.prepare_threshold
        if threshold is None:
            return False
        if len(self._uses) >= _MOST_COUNTED:
            self._uses.clear()
        uses = self._uses[key] = self._uses.get(key, 0) + 1
        return uses > threshold  # psycopg's count: the uses before this one

    def _read(
        self, pgconn: pq.abc.PGconn, replies: list[_Prepare | None]
    ) -> tuple[psycopg.Error | None, list[pq.abc.PGresult | None]]:
        """Every reply up to the Sync's: the first error, if any, and each statement's result
        (``None`` where it failed or was skipped). A prepare is noted once its reply says it
        was made (one skipped after an error was not)."""
        error: psycopg.Error | None = None
        results: list[pq.abc.PGresult | None] = []
        encoding = self._conn.info.encoding
        waiting = iter(replies)
        answering = next(waiting, None)
        while True:
            while pgconn.is_busy():
                self._wait(pgconn, _READ)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:  # the end of one statement's replies
                answering = next(waiting, None)
                continue
            status = result.status
            if status == pq.ExecStatus.PIPELINE_SYNC:
                return error, results
            if answering is None:  # a statement's reply, not a prepare's
                results.append(result if status in _OK else None)
            if status == pq.ExecStatus.FATAL_ERROR:
                error = error or error_from_result(result, encoding)
            elif status in _OK:
                if answering is not None:
                    self._prepared[answering.key] = answering.name
            elif status != pq.ExecStatus.PIPELINE_ABORTED:
                # COPY, which needs a conversation of its own: the connection cannot go on.
                raise psycopg.NotSupportedError(
                    f"a statement sent with db_writes cannot be {pq.ExecStatus(status).name}"
                )

    def _flush(self, pgconn: pq.abc.PGconn) -> None:
        """Send all that is queued, reading what the server sends meanwhile (so that neither
        side waits for the other with a full buffer)."""
        while pgconn.flush():
            if self._wait(pgconn, _WRITE) & select.POLLIN:
                pgconn.consume_input()

    def _wait(self, pgconn: pq.abc.PGconn, events: int) -> int:
        """Block (the GIL let go) until the connection's socket is ready for ``events``."""
        if self._poller is None:  # one a connection: its socket stays the same
            self._poller = select.poll()
            self._poller.register(pgconn.socket, events)
        elif events != self._events:
            self._poller.modify(pgconn.socket, events)
        self._events = events
        while True:
            ready = self._poller.poll()
            if ready:
                return ready[0][1]


@dataclass(frozen=True)
class _Prepare:
    key: tuple[bytes, tuple[int, ...]]
    name: bytes

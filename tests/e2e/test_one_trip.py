"""A transaction's statements sent in one round trip below psycopg's cursors, on the real server.

:class:`~jobguard.backends.postgres.onetrip.OneTrip` sends a ``db_writes`` step: these tests
hold it to what psycopg's pipeline did in its place (the server's first error raised as
psycopg raises it, nothing run after it, the connection usable afterwards) and to what it adds
(a bounded number of prepared statements, a connection closed rather than left halfway).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.adapt import PyFormat

from jobguard.backends.postgres.onetrip import (
    MOST_PREPARED,
    Call,
    OneTrip,
    Replied,
    UnsendableValue,
    caller_call,
)
from jobguard.backends.postgres.pooled import PooledConnection
from tests.support import pg


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection, as jobguard's pool gives, whose ``notes`` table is its own
    (in a schema of its own)."""
    schema = f"s_{secrets.token_hex(6)}"
    with psycopg.connect(pg.session_database(), autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        connection.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        connection.execute("CREATE TABLE notes (id integer PRIMARY KEY, note text)")
        yield connection


def insert(conn: psycopg.Connection[Any], row_id: int, note: str = "n") -> Call:
    return caller_call(conn, "INSERT INTO notes VALUES (%s, %s)", (row_id, note))


def notes(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, note FROM notes ORDER BY id").fetchall()


def prepared(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '\\_jg\\_%'")
    return int(found.fetchone()[0])  # type: ignore[index]


def test_placeholders_of_every_kind_and_a_literal_percent_reach_the_server_as_written(
    conn: psycopg.Connection[Any],
) -> None:
    OneTrip(conn).run(
        [
            caller_call(
                conn,
                "INSERT INTO notes VALUES (%(id)s, %(note)s || '%%' || %(id)s::text)",
                {"id": 1, "note": "a"},
            ),
            caller_call(
                conn,
                sql.SQL("INSERT INTO {} VALUES (%s, %t)").format(sql.Identifier("notes")),
                (2, "b"),
            ),
            caller_call(conn, b"INSERT INTO notes VALUES (%b, %s)", (3, "c")),
            caller_call(conn, "INSERT INTO notes VALUES (4, '100%')", None),
        ]
    )
    assert notes(conn) == [(1, "a%1"), (2, "b"), (3, "c"), (4, "100%")]


def test_the_first_error_is_psycopgs_by_its_sqlstate_and_nothing_after_it_runs(
    conn: psycopg.Connection[Any],
) -> None:
    trip = OneTrip(conn)
    trip.run([insert(conn, 1)])
    # The implicit transaction: the row before the failing one rolls back, the one after
    # never runs.
    with pytest.raises(errors.UniqueViolation, match="duplicate key") as refused:
        trip.run([insert(conn, 2), insert(conn, 1), insert(conn, 3)])
    assert refused.value.sqlstate == "23505"
    assert refused.value.diag.constraint_name == "notes_pkey"
    assert notes(conn) == [(1, "n")]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    trip.run([insert(conn, 2), insert(conn, 3)])
    assert notes(conn) == [(1, "n"), (2, "n"), (3, "n")]


def test_a_statement_whose_prepare_was_skipped_after_an_error_is_prepared_at_its_next_use(
    conn: psycopg.Connection[Any],
) -> None:
    """A prepare queued behind a failing statement is skipped by the server: not noted as
    made, so the next use prepares it rather than executing a name the server never had."""
    conn.prepare_threshold = 0  # as psycopg reads it: prepared at the first use
    trip = OneTrip(conn)
    broken = caller_call(conn, "SELECT 1 / %s", (0,))
    later = caller_call(conn, "UPDATE notes SET note = %s WHERE id = %s", ("x", 1))
    with pytest.raises(errors.DivisionByZero):
        trip.run([broken, later])
    trip.run([insert(conn, 1), later])
    assert notes(conn) == [(1, "x")]
    assert prepared(conn) == 3  # the division, the insert and the update
    # A prepare the server answered outlives the failure of its transaction: the division's
    # name is used again, and fails as the division, not as a statement the server lacks.
    with pytest.raises(errors.DivisionByZero):
        trip.run([broken])
    assert prepared(conn) == 3


def test_a_connection_prepares_at_most_its_share_and_sends_the_rest_unprepared(
    conn: psycopg.Connection[Any],
) -> None:
    """Statements built anew for every job cannot fill the server's memory."""
    conn.prepare_threshold = 0
    trip = OneTrip(conn)
    for row_id in range(MOST_PREPARED + 20):
        # A text of its own each time, as a statement with its values written into it would be.
        trip.run([caller_call(conn, f"INSERT INTO notes VALUES ({row_id}, %s)", ("n",))])
    assert prepared(conn) == MOST_PREPARED
    assert len(notes(conn)) == MOST_PREPARED + 20


def test_a_callers_statement_is_prepared_when_psycopg_would_and_jobguards_own_at_once(
    conn: psycopg.Connection[Any],
) -> None:
    trip = OneTrip(conn)
    own = Call(b"INSERT INTO notes VALUES ($1, 'own')", [0], [PyFormat.AUTO], prepare=True)
    trip.run([own])
    assert prepared(conn) == 1
    for row_id in range(1, 6):  # psycopg's prepare_threshold is 5: the sixth use prepares
        trip.run([insert(conn, row_id)])
    assert prepared(conn) == 1
    trip.run([insert(conn, 6)])
    assert prepared(conn) == 2
    conn.prepare_threshold = None  # never, as psycopg reads it
    for row_id in range(7, 15):
        trip.run([caller_call(conn, "UPDATE notes SET note = %s WHERE id = %s", ("x", row_id))])
    assert prepared(conn) == 2
    assert len(notes(conn)) == 7


def test_each_statement_gives_its_result_read_as_a_cursor_of_dict_rows(
    conn: psycopg.Connection[Any],
) -> None:
    """What a transaction's first statement, sent with its BEGIN, is read as."""
    select = caller_call(conn, "SELECT id, note, %s::jsonb AS doc FROM notes ORDER BY id", ("[1]",))
    empty = caller_call(conn, "SELECT 1 AS one WHERE false", None)
    began, inserted, read, none = (
        Replied(conn, result)
        for result in OneTrip(conn).run(
            [Call(b"BEGIN"), insert(conn, 1), select, empty, Call(b"COMMIT")]
        )[:4]
    )
    assert (began.fetchall(), inserted.rowcount) == ([], 1)
    assert read.fetchall() == [{"id": 1, "note": "n", "doc": [1]}]
    assert read.fetchone() == {"id": 1, "note": "n", "doc": [1]}
    assert (none.fetchone(), none.rowcount) == (None, 0)
    with pytest.raises(errors.UniqueViolation):
        OneTrip(conn).run([insert(conn, 2), insert(conn, 1)])
    assert notes(conn) == [(1, "n")]


def test_a_pooled_connection_prepares_its_statements_again_after_psycopg_deallocates_all(
    conn: psycopg.Connection[Any],
) -> None:
    """psycopg sends DEALLOCATE ALL when a transaction of a connection on which it prepared
    statements rolls back: OneTrip's prepared statements on it are gone too."""
    with PooledConnection.connect(pg.session_database(), autocommit=True) as pooled:
        path = conn.execute("SHOW search_path").fetchone()[0]  # type: ignore[index]
        pooled.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(path)))
        own = Call(b"INSERT INTO notes VALUES ($1, 'own')", [1], [PyFormat.AUTO], prepare=True)
        pooled.one_trip().run([own])
        pooled.execute("SELECT 1", prepare=True)  # one of psycopg's own
        assert prepared(pooled) == 1
        with pytest.raises(errors.DivisionByZero), pooled.transaction():
            pooled.execute("SELECT 1 / 0")
        assert prepared(pooled) == 0
        pooled.one_trip().run([replace(own, values=[2])])
        assert prepared(pooled) == 1
    assert notes(conn) == [(1, "own"), (2, "own")]


def test_values_that_cannot_be_sent_send_nothing(conn: psycopg.Connection[Any]) -> None:
    trip = OneTrip(conn)
    with pytest.raises(UnsendableValue, match="NUL"):
        trip.run([insert(conn, 1), insert(conn, 2, "a\x00b")])
    with pytest.raises(UnsendableValue, match="cannot adapt type 'object'"):
        trip.run([insert(conn, 1), caller_call(conn, "SELECT %s", (object(),))])
    with pytest.raises(UnsendableValue, match="2 placeholders but 1 parameters"):
        caller_call(conn, "SELECT %s, %s", (1,))
    assert notes(conn) == []
    trip.run([insert(conn, 1)])
    assert notes(conn) == [(1, "n")]


def test_a_copy_closes_the_connection_rather_than_leave_it_halfway(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(psycopg.NotSupportedError, match="COPY"):
        OneTrip(conn).run([caller_call(conn, "COPY notes FROM STDIN", None)])
    assert conn.closed
    assert conn.broken


def test_a_connection_cut_midway_raises_psycopgs_operational_error_and_reads_closed(
    conn: psycopg.Connection[Any],
) -> None:
    OneTrip(conn).run([insert(conn, 1)])
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError) as cut:
        OneTrip(conn).run([insert(conn, 2)])
    assert cut.value.sqlstate in (None, "57P01")
    assert conn.closed

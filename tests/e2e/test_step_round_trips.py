"""A db_step's transaction on PostgreSQL waits for the server twice beside the step's own
statements: BEGIN goes with the guard's check, the step's record with COMMIT.

Counted as ``python -m bench.round_trips`` counts (every statement psycopg or jobguard's
one-trip sender runs, and every wait for the server), on a real worker's store; and what the
saving must not lose, seen failing: a record whose proof fails at the commit commits nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from bench.round_trips import counting, statement_names

from jobguard.backends.postgres import PostgresBackend
from jobguard.exceptions import LeaseLostError, StepSQLError
from jobguard.testing import ControlledClock
from tests.contract.test_operation_port import deliver
from tests.support import pg
from tests.support.ports import begin_operation, fetch

KEY = "fulfill-order:7"


@pytest.fixture
def clock() -> ControlledClock:
    return ControlledClock()


@pytest.fixture
def store(clock: ControlledClock) -> Iterator[PostgresBackend]:
    backend = PostgresBackend(pg.fresh_store_url(pg.session_database()), clock=clock)
    yield backend
    backend.close()


def selected(conn: Any, n: int) -> int:
    row = conn.execute("SELECT %s::integer", (n,)).fetchone()
    return int(row[0])


def test_a_db_step_waits_twice_for_the_server_beside_its_own_statements(
    store: PostgresBackend,
) -> None:
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    with counting(statement_names(store.driver.schema)) as (counts, waits):
        assert store.db_step(guard, KEY, "effect", selected, (7,)) == (True, 7)
    assert waits == {"(one trip)": 2, "SELECT": 1}
    assert counts == {"BEGIN": 1, "guard_state": 1, "SELECT": 1, "insert_step_or_fail": 1,
                      "COMMIT": 1}  # fmt: skip
    # Once more: the stored result, read with the check; nothing else is sent but the end.
    with counting(statement_names(store.driver.schema)) as (counts, waits):
        assert store.db_step(guard, KEY, "effect", selected, (8,)) == (False, 7)
    assert waits == {"(one trip)": 2}
    assert counts == {"BEGIN": 1, "guard_state": 1, "COMMIT": 1}


def test_a_record_refused_at_the_commit_commits_none_of_the_steps_writes(
    store: PostgresBackend, clock: ControlledClock
) -> None:
    guard = deliver(store, visibility_timeout_s=5.0)
    assert begin_operation(store, guard, KEY, None) is not None
    table = f"{store.driver.schema}.effects"
    with psycopg.connect(pg.session_database(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n integer)")

    def lose_the_lease_midway(conn: Any, n: int) -> int:
        conn.execute(f"INSERT INTO {table} VALUES (%s)", (n,))
        clock.advance(6.0)  # this delivery's lease runs out while its step runs ...
        assert fetch(store, ["default"], 10, "another-worker")  # ... and the job is taken
        return n

    with pytest.raises(LeaseLostError):
        store.db_step(guard, KEY, "effect", lose_the_lease_midway, (7,))
    with psycopg.connect(pg.session_database()) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    operation = store.get_operation(KEY)
    assert operation is not None
    assert operation.steps == {}


def test_a_step_whose_connection_died_while_idle_is_written_on_a_new_one(
    store: PostgresBackend,
) -> None:
    """BEGIN and the guard's check meet the dead connection: nothing of the step was sent, so
    its transaction runs again at once on a new connection, its record sent with the COMMIT
    there too."""
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    with store.driver.keep_connection():
        pid = store.driver.read(lambda tx: tx.connection.info.backend_pid)
        with psycopg.connect(pg.session_database(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with counting(statement_names(store.driver.schema)) as (counts, waits):
            assert store.db_step(guard, KEY, "effect", selected, (7,)) == (True, 7)
    assert waits == {"(one trip)": 3, "SELECT": 1}  # the dead one's, then the new one's two
    assert counts["BEGIN"] == 2
    assert counts["insert_step_or_fail"] == counts["COMMIT"] == 1
    assert store.db_step(guard, KEY, "effect", selected, (8,)) == (False, 7)


def test_db_writes_go_on_after_a_step_rolled_back_on_the_same_connection(
    store: PostgresBackend,
) -> None:
    """A rolled-back transaction makes psycopg deallocate every statement prepared on its
    connection, once it prepared one of its own (a step's statement, at its sixth use): the
    statements jobguard prepared there are prepared again, not sent by a name the server
    dropped."""
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    for n in range(6):
        assert store.db_step(guard, KEY, f"select-{n}", selected, (n,)) == (True, n)
    assert store.db_writes(guard, KEY, "first", [("SELECT 1", None)])
    with pytest.raises(ZeroDivisionError):
        store.db_step(guard, KEY, "fails", lambda conn: 1 / 0, ())
    assert store.db_writes(guard, KEY, "second", [("SELECT 2", None)])
    assert store.db_step(guard, KEY, "after", selected, (9,)) == (True, 9)


def test_a_steps_record_is_one_round_trip(store: PostgresBackend) -> None:
    """ctx.step's record of an effect outside the database: the record, proving the guard as
    it is written, and its commit, sent at once."""
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    with counting(statement_names(store.driver.schema)) as (counts, waits):
        store.put_step(guard, KEY, "email", '"sent"')
    assert waits == {"(one trip)": 1}
    assert counts == {"insert_step_or_fail": 1}
    operation = store.get_operation(KEY)
    assert operation is not None
    assert operation.steps == {"email": "sent"}


# Statements whose effect outlives the step's transaction on its connection.
SESSION_CHANGES = [
    "DEALLOCATE ALL",
    "deallocate prepare all",
    "DEALLOCATE _jg_0",
    "SET statement_timeout = 1",
    "set search_path to public",
    "/* a comment */ SET SESSION ROLE postgres",
    "SET TIME ZONE 'UTC'",
    "RESET ALL",
    "reset statement_timeout",
    "PREPARE mine AS SELECT 1",
    "LISTEN elsewhere",
    "UNLISTEN *",
    "DISCARD TEMP",
]


@pytest.mark.parametrize("text", SESSION_CHANGES)
def test_a_step_may_not_change_what_its_connection_keeps_after_it(
    store: PostgresBackend, text: str
) -> None:
    """A step's connection is the worker's: a setting changed for the session, a statement
    prepared or dropped, a channel listened to would outlive the step and reach the jobs that
    use the connection next, jobguard's own statements included. Refused before it is sent."""
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    assert store.db_writes(guard, KEY, "first", [("SELECT 1", None)])

    def change(conn: Any) -> int:
        conn.execute(text)
        return 1

    with pytest.raises(StepSQLError, match="SET LOCAL"):
        store.db_step(guard, KEY, "changes", change, ())
    with pytest.raises(StepSQLError, match="SET LOCAL"):
        store.db_writes(guard, KEY, "changes-too", [(text, None)])
    assert store.db_writes(guard, KEY, "second", [("SELECT 2", None)])
    assert store.db_step(guard, KEY, "after", selected, (9,)) == (True, 9)


def test_a_step_may_change_a_setting_for_its_own_transaction(store: PostgresBackend) -> None:
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None

    def within(conn: Any) -> str:
        conn.execute("SET LOCAL statement_timeout = '5s'")
        return str(conn.execute("SHOW statement_timeout").fetchone()[0])

    def shown(tx: Any) -> Any:
        return tx.connection.execute("SHOW statement_timeout").fetchone()

    with store.driver.keep_connection():
        before = store.driver.read(shown)
        assert before != ("5s",)
        assert store.db_step(guard, KEY, "local", within, ()) == (True, "5s")
        assert store.driver.read(shown) == before


def test_statements_dropped_behind_jobguards_back_are_prepared_again(
    store: PostgresBackend,
) -> None:
    """Prepared statements gone from the server where psycopg did not see them go (a
    DEALLOCATE ALL it sent when it had prepared none of its own): the write that meets their
    absence ran nothing, so it is sent again at once with them prepared anew; so is a step's."""
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    with store.driver.keep_connection():
        assert store.db_writes(guard, KEY, "first", [("SELECT 1", None)])
        assert store.db_step(guard, KEY, "select-1", selected, (1,)) == (True, 1)
        for name in ("second", "third"):
            store.driver.read(lambda tx: tx.connection.execute("DEALLOCATE ALL"))
            assert store.db_writes(guard, KEY, name, [("SELECT 2", None)])
        store.driver.read(lambda tx: tx.connection.execute("DEALLOCATE ALL"))
        assert store.db_step(guard, KEY, "select-2", selected, (2,)) == (True, 2)
        store.put_step(guard, KEY, "email", '"sent"')
    operation = store.get_operation(KEY)
    assert operation is not None
    assert set(operation.steps) == {"first", "select-1", "second", "third", "select-2", "email"}


@pytest.fixture
def store_of_one_connection(clock: ControlledClock) -> Iterator[PostgresBackend]:
    url = pg.fresh_store_url(pg.session_database())
    backend = PostgresBackend(url, clock=clock, pool_size=1)
    yield backend
    backend.close()


def test_one_statement_dropped_alone_leaves_the_others_names_unused(
    store_of_one_connection: PostgresBackend,
) -> None:
    """The statements are prepared again under names never given on the connection: the
    others, still prepared on the server under theirs, do not stand in the way."""
    store = store_of_one_connection
    guard = deliver(store)
    assert begin_operation(store, guard, KEY, None) is not None
    ours = "SELECT name FROM pg_prepared_statements WHERE name LIKE '_jg_%' ORDER BY name"
    with store.driver.keep_connection():
        # Seen by psycopg, which had prepared the fetch: every statement goes, and psycopg,
        # with none of its own left, does not deallocate them all again at a rollback.
        store.driver.read(lambda tx: tx.connection.execute("DEALLOCATE ALL"))
        assert store.db_step(guard, KEY, "select-1", selected, (1,)) == (True, 1)
        names = store.driver.read(lambda tx: tx.connection.execute(ours).fetchall())
        assert len(names) == 2  # the guard's check and the step's record
        store.driver.read(lambda tx: tx.connection.execute(f"DEALLOCATE {names[-1][0]}"))
        for n in range(2, 5):
            assert store.db_step(guard, KEY, f"select-{n}", selected, (n,)) == (True, n)
            assert store.db_writes(guard, KEY, f"writes-{n}", [("SELECT 1", None)])

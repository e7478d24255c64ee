"""Conformance tests of ``db_writes``: write statements and their step record, sent at once (G5.2).

Runs against every backend in ``conftest.BACKENDS``. On PostgreSQL the whole transaction travels
in one round trip, so nothing is read between the statements: what each test checks is what
committed afterwards, and, where it matters, that a statement never ran at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobguard.backends.base import Backend
from jobguard.exceptions import StaleFenceError, StepSQLError
from jobguard.testing import ControlledClock
from tests.contract.conftest import BACKENDS, business_table
from tests.contract.test_operation_port import KEY, STALE_GUARDS, deliver, stored
from tests.contract.test_slot_port import held, slot_taken_over
from tests.support.ports import begin_operation, fetch, guard_of

_reads = itertools.count()


def placeholder(backend: Backend) -> str:
    """The store's parameter placeholder (the statements are the store's own SQL)."""
    return "%s" if backend.driver.dialect == "postgres" else "?"  # type: ignore[attr-defined]


@pytest.fixture
def invoices(backend: Backend) -> str:
    """A business table beside this test's store: one invoice per order."""
    return invoice_table(backend)


def invoice_table(backend: Backend) -> str:
    """Make the table of invoices beside ``backend``, in a step of its own; its name."""
    table = business_table(backend, "invoices")
    guard = deliver(backend, operation_key="schema")
    begin_operation(backend, guard, "schema", None)
    create = f"CREATE TABLE {table} (order_id INTEGER PRIMARY KEY, fence INTEGER)"
    backend.db_step(guard, "schema", "create", lambda conn: conn.execute(create) and None, ())
    return table


def rows(backend: Backend, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table``, read in a step of an operation of its own."""
    key = f"read-{next(_reads)}"
    guard = deliver(backend, operation_key=key)
    begin_operation(backend, guard, key, None)

    def read(conn: Any) -> list[list[Any]]:
        return [list(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1")]

    return [tuple(row) for row in backend.db_step(guard, key, "read", read, ())[1]]


def insert(backend: Backend, table: str, order_id: int, fence: int | None = None) -> Any:
    """One write statement: an invoice for ``order_id``."""
    mark = placeholder(backend)
    return (f"INSERT INTO {table} (order_id, fence) VALUES ({mark}, {mark})", (order_id, fence))


def test_writes_commit_with_their_step_record_once(
    backend: Backend, clock: ControlledClock, invoices: str
) -> None:
    """G5.1, G5.2: every statement and the step record commit together; a retry of the
    operation runs nothing again, and says so."""
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    writes = [insert(backend, invoices, 42), insert(backend, invoices, 43)]
    assert backend.db_writes(guard, KEY, "invoices", writes) is True
    assert rows(backend, invoices) == [(42, None), (43, None)]
    assert stored(backend).steps["invoices"] is None

    clock.advance(5.0)
    (redelivered,) = fetch(backend, ["default"], 1, "w2")
    retry = guard_of(redelivered)
    begin_operation(backend, retry, KEY, None)
    assert backend.db_writes(retry, KEY, "invoices", writes) is False
    assert rows(backend, invoices) == [(42, None), (43, None)]


def test_writes_of_a_step_recorded_already_are_not_run_and_say_so(
    backend: Backend, clock: ControlledClock, invoices: str
) -> None:
    """G5.1: a retry whose statements would commit on their own (another order's invoice)
    finds the step recorded: it runs none of them and says so; neither a duplicate record nor
    the store is an error."""
    guard = deliver(backend, visibility_timeout_s=5.0)
    begin_operation(backend, guard, KEY, None)
    assert backend.db_writes(guard, KEY, "invoice", [insert(backend, invoices, 42)]) is True

    clock.advance(5.0)
    (redelivered,) = fetch(backend, ["default"], 1, "w2")
    retry = guard_of(redelivered)
    begin_operation(backend, retry, KEY, None)
    assert backend.db_writes(retry, KEY, "invoice", [insert(backend, invoices, 43)]) is False
    assert rows(backend, invoices) == [(42, None)]


@pytest.mark.parametrize("staleness", sorted(STALE_GUARDS))
def test_writes_of_a_stale_guard_are_refused_and_nothing_commits(
    backend: Backend, clock: ControlledClock, invoices: str, staleness: str
) -> None:
    """Invariants 2, 5, 10: a stale lease, fence or claim writes neither rows nor the step."""
    make_stale, error = STALE_GUARDS[staleness]
    guard = make_stale(backend, clock)
    with pytest.raises(error):
        backend.db_writes(guard, KEY, "invoice", [insert(backend, invoices, 42)])
    assert rows(backend, invoices) == []
    assert "invoice" not in stored(backend).steps


def test_writes_of_a_stale_slot_holder_are_refused_and_nothing_commits(
    backend: Backend, clock: ControlledClock, invoices: str
) -> None:
    """G3.5: a holder paused past its concurrency slot's TTL, whose slot went to another
    delivery (its lease and claim still its own), writes neither rows nor the step."""
    stale, fresh = slot_taken_over(backend, clock)
    with pytest.raises(StaleFenceError, match=r"acct:1 \(concurrency slot 0\)"):
        backend.db_writes(held(stale), "op:a", "invoice", [insert(backend, invoices, 42)])
    assert rows(backend, invoices) == []
    assert "invoice" not in stored(backend, "op:a").steps
    assert backend.db_writes(held(fresh), "op:b", "invoice", [insert(backend, invoices, 43)])
    assert rows(backend, invoices) == [(43, None)]


def test_a_failing_statement_rolls_back_the_ones_before_it_and_the_step(
    backend: Backend, invoices: str
) -> None:
    """Invariant 10: the second invoice for one order breaks the primary key; the first
    statement's row does not commit either, the step is not recorded, and the error says
    what the database refused. The step can then run and commit once."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    twice = [
        insert(backend, invoices, 7),
        insert(backend, invoices, 42),
        insert(backend, invoices, 42),
    ]
    with pytest.raises(StepSQLError, match=r"(?i)unique|primary|duplicate"):
        backend.db_writes(guard, KEY, "invoice", twice)
    assert rows(backend, invoices) == []
    assert "invoice" not in stored(backend).steps
    assert backend.db_writes(guard, KEY, "invoice", twice[:2]) is True
    assert rows(backend, invoices) == [(7, None), (42, None)]


@pytest.mark.parametrize("statement", ["COMMIT", "/* c */ rollback", "BEGIN", "SAVEPOINT mine"])
def test_a_statement_that_would_end_the_transaction_is_refused_before_any_runs(
    backend: Backend, invoices: str, statement: str
) -> None:
    """Invariant 10: the statements' rows commit only with the step record, so one that would
    end (or split) the transaction is refused before anything is sent."""
    guard = deliver(backend)
    begin_operation(backend, guard, KEY, None)
    writes = [insert(backend, invoices, 42), (statement, None)]
    # PostgreSQL refuses it by its text before sending; SQLite's step connection when it runs.
    with pytest.raises(StepSQLError, match="may not begin, commit or roll back"):
        backend.db_writes(guard, KEY, "invoice", writes)
    assert rows(backend, invoices) == []
    assert "invoice" not in stored(backend).steps


@pytest.fixture
def postgres(tmp_path: Path, clock: ControlledClock) -> Iterator[Backend]:
    """The PostgreSQL store alone: what its pipeline's implicit transaction changes."""
    store = BACKENDS["postgres"](tmp_path, clock)
    yield store
    store.close()


@pytest.mark.parametrize(
    "commits",
    [
        "CALL {schema}.commit_an_invoice()",
        "DO $$ BEGIN INSERT INTO {table} VALUES (99, NULL); COMMIT; END $$",
    ],
)
def test_a_procedure_that_commits_fails_the_step_and_nothing_of_it_commits(
    postgres: Backend, commits: str
) -> None:
    """Invariant 10 on PostgreSQL: plain DML runs in the pipeline's implicit transaction, where
    a procedure or a DO block that commits would commit what ran before it; so a step with any
    other statement runs in a BEGIN ... COMMIT block, where that commit is refused and the step
    fails whole."""
    table = business_table(postgres, "invoices")
    schema = table.split(".")[0]
    create = [
        f"CREATE TABLE {table} (order_id INTEGER PRIMARY KEY, fence INTEGER)",
        f"CREATE PROCEDURE {schema}.commit_an_invoice() LANGUAGE plpgsql AS "
        f"$$ BEGIN INSERT INTO {table} VALUES (98, NULL); COMMIT; END $$",
    ]
    guard = deliver(postgres, operation_key="schema")
    begin_operation(postgres, guard, "schema", None)
    postgres.db_writes(guard, "schema", "create", [(statement, None) for statement in create])
    guard = deliver(postgres)
    begin_operation(postgres, guard, KEY, None)
    writes = [insert(postgres, table, 7), (commits.format(schema=schema, table=table), None)]
    with pytest.raises(StepSQLError, match="invalid transaction termination"):
        postgres.db_writes(guard, KEY, "invoice", writes)
    assert rows(postgres, table) == []
    assert "invoice" not in stored(postgres).steps


def invoices_and_a_delivery(postgres: Backend) -> tuple[str, Any]:
    """A table of invoices made by a step of its own, and the guard of a delivery of KEY."""
    table = business_table(postgres, "invoices")
    guard = deliver(postgres, operation_key="schema")
    begin_operation(postgres, guard, "schema", None)
    create = f"CREATE TABLE {table} (order_id INTEGER PRIMARY KEY, fence INTEGER)"
    postgres.db_writes(guard, "schema", "create", [(create, None)])
    guard = deliver(postgres)
    begin_operation(postgres, guard, KEY, None)
    return table, guard


def test_a_lock_statement_takes_its_lock_in_the_steps_transaction(postgres: Backend) -> None:
    """``LOCK`` needs a transaction block: a step with one runs in BEGIN ... COMMIT and
    commits whole."""
    table, guard = invoices_and_a_delivery(postgres)
    writes = [(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE", None), insert(postgres, table, 7)]
    assert postgres.db_writes(guard, KEY, "invoice", writes) is True
    assert rows(postgres, table) == [(7, None)]


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ((7,), "the query has 2 placeholders but 1 parameters were passed"),
        ({"order_id": 7}, "named placeholders|sequence"),
        ((7, object()), "cannot adapt type 'object'"),
        ((7, "a\x00"), "NUL"),
    ],
)
def test_values_that_do_not_fit_their_statement_fail_the_step_before_anything_is_sent(
    postgres: Backend, values: Any, words: str
) -> None:
    """The caller's mistake, said in psycopg's words as a StepSQLError (not the store failing):
    nothing of the step is sent, and the step then runs once with fitting values."""
    table, guard = invoices_and_a_delivery(postgres)
    text = insert(postgres, table, 7)[0]
    with pytest.raises(StepSQLError, match=words):
        postgres.db_writes(guard, KEY, "invoice", [insert(postgres, table, 6), (text, values)])
    assert rows(postgres, table) == []
    assert "invoice" not in stored(postgres).steps
    assert postgres.db_writes(guard, KEY, "invoice", [(text, (7, None))]) is True
    assert rows(postgres, table) == [(7, None)]


@pytest.mark.parametrize("copy", ["COPY {table} FROM STDIN", "/* rows */ copy {table} TO STDOUT"])
def test_a_copy_is_refused_before_anything_is_sent(postgres: Backend, copy: str) -> None:
    """COPY needs an exchange of its own with the server, which a step sent at once has not:
    the caller's mistake, said before anything runs (the store is not unavailable)."""
    table, guard = invoices_and_a_delivery(postgres)
    writes = [insert(postgres, table, 7), (copy.format(table=table), None)]
    with pytest.raises(StepSQLError, match="cannot be COPY"):
        postgres.db_writes(guard, KEY, "invoice", writes)
    assert rows(postgres, table) == []
    assert "invoice" not in stored(postgres).steps


@pytest.fixture
def sqlite(tmp_path: Path, clock: ControlledClock) -> Iterator[Backend]:
    """The SQLite store alone: what its step connection lets through."""
    store = BACKENDS["sqlite"](tmp_path, clock)
    yield store
    store.close()


CONNECTION_CHANGES = [
    "PRAGMA query_only = ON",
    "pragma recursive_triggers=1",
    "PRAGMA main.cache_size = -4000",
    "/* shorter */ PRAGMA busy_timeout(5)",
    "PRAGMA synchronous = OFF",
    "ATTACH DATABASE ':memory:' AS elsewhere",
    "DETACH DATABASE temp",
]


@pytest.mark.parametrize("text", CONNECTION_CHANGES)
def test_a_sqlite_step_may_not_change_what_its_connection_keeps_after_it(
    sqlite: Backend, text: str
) -> None:
    """A step's connection is the worker's: a PRAGMA set in one job's step (``query_only``
    turned on, a shorter busy timeout, synchronous turned off) or a database attached would
    outlive the step and reach the jobs that use the connection next, jobguard's own writes
    included. Refused when it runs; the step's rows and record roll back."""
    invoices = invoice_table(sqlite)
    guard = deliver(sqlite)
    begin_operation(sqlite, guard, KEY, None)

    def change(conn: Any) -> int:
        conn.execute(*insert(sqlite, invoices, 6))
        conn.execute(text)
        return 1

    with pytest.raises(StepSQLError, match="PRAGMA defer_foreign_keys"):
        sqlite.db_step(guard, KEY, "changes", change, ())
    with pytest.raises(StepSQLError, match="PRAGMA defer_foreign_keys"):
        sqlite.db_writes(guard, KEY, "changes-too", [insert(sqlite, invoices, 7), (text, None)])
    assert sqlite.db_writes(guard, KEY, "after", [insert(sqlite, invoices, 8)]) is True
    assert rows(sqlite, invoices) == [(8, None)]
    assert "changes" not in stored(sqlite).steps
    assert "changes-too" not in stored(sqlite).steps


def test_a_sqlite_step_may_read_pragmas_and_set_one_that_ends_with_it(
    sqlite: Backend,
) -> None:
    """What reads (a PRAGMA without a value, or one whose argument names what to read) and
    what ends with the transaction (``defer_foreign_keys``) stays allowed."""
    invoices = invoice_table(sqlite)
    guard = deliver(sqlite)
    begin_operation(sqlite, guard, KEY, None)

    def reads(conn: Any) -> list[Any]:
        conn.execute("PRAGMA defer_foreign_keys = ON")
        deferred = conn.execute("PRAGMA defer_foreign_keys").fetchone()[0]
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({invoices})")]
        listed = conn.execute("SELECT count(*) FROM pragma_table_info(?)", (invoices,))
        return [deferred, columns, listed.fetchone()[0]]

    assert sqlite.db_step(guard, KEY, "reads", reads, ()) == (True, [1, ["order_id", "fence"], 2])
    assert sqlite.db_writes(guard, KEY, "after", [insert(sqlite, invoices, 8)]) is True


@pytest.mark.parametrize(
    "text",
    ["COMMIT", "SAVEPOINT request", "RELEASE item", "PRAGMA synchronous=FULL", "BEGIN IMMEDIATE"],
)
def test_a_sqlite_step_is_refused_its_statement_even_when_jobguard_ran_the_same_text(
    sqlite: Backend, text: str
) -> None:
    """The worker's write connection keeps one authorizer, watching only during a step, and
    ``sqlite3`` reuses a statement prepared before without asking it again: jobguard's own
    statements there (its commits, savepoints and pragmas, run many times before this step)
    must never be a step's text, or the step's ``COMMIT`` would run unchecked."""
    invoices = invoice_table(sqlite)
    guard = deliver(sqlite)
    begin_operation(sqlite, guard, KEY, None)
    for order_id in range(3):  # more commits, savepoints and releases on the connection
        assert sqlite.db_writes(
            guard, KEY, f"invoice-{order_id}", [insert(sqlite, invoices, order_id)]
        )
    with pytest.raises(StepSQLError, match="may not"):
        sqlite.db_writes(guard, KEY, "ends", [insert(sqlite, invoices, 9), (text, None)])
    assert rows(sqlite, invoices) == [(0, None), (1, None), (2, None)]
    assert "ends" not in stored(sqlite).steps

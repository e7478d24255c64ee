"""``Driver.write_from``: a transaction opened by a named read, whose row the block gets.

On PostgreSQL the read travels with the BEGIN (``BEGIN; EXECUTE …`` of a statement prepared on
the connection); on SQLite it is the transaction's first statement. Either way the block's
writes commit with it, or nothing of them does.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest

from jobguard.backends.base import Backend
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.postgres.opening import literal, positional
from jobguard.backends.sql.driver import StatementRefused
from jobguard.backends.sql.proofs import guard_params
from jobguard.backends.sql.store import SQLStore
from jobguard.testing import ControlledClock
from tests.contract.conftest import business_table
from tests.support import pg
from tests.support.ports import begin_operation, fetch_one, guard_of, keyed_spec


def _driver(backend: Backend) -> Any:
    assert isinstance(backend, SQLStore)
    return backend.driver


def _table(backend: Backend) -> str:
    table = business_table(backend, "opened_rows")
    _driver(backend).write(
        lambda tx: _run(tx, backend, f"CREATE TABLE {table} (n integer NOT NULL)")
    )
    return table


def _run(tx: Any, backend: Backend, statement: str) -> None:
    with _driver(backend).step_connection(tx) as conn:
        conn.execute(statement)


def _count(backend: Backend, table: str) -> int:
    def op(tx: Any) -> int:
        with _driver(backend).step_connection(tx) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    return int(_driver(backend).write(op))


def test_the_block_gets_the_reads_row_and_its_writes_commit_with_it(backend: Backend) -> None:
    table = _table(backend)
    backend.enqueue(keyed_spec("a", None, "op:1"))
    guard = guard_of(fetch_one(backend, ["a"]))

    def block(tx: Any, row: Any) -> Any:
        _run(tx, backend, f"INSERT INTO {table} (n) VALUES (1)")
        return row

    row = _driver(backend).write_from("guard_state", guard_params(guard, None), block)
    assert row["lease_ok"] == 1
    assert row["claim_ok"] is None
    assert row["step_result"] is None
    other = guard_params(guard, None)
    other["lease_token"] = "not-the-lease"
    assert _driver(backend).write_from("guard_state", other, block)["lease_ok"] is None
    assert _count(backend, table) == 2


def test_a_block_that_raises_commits_nothing_and_the_next_write_goes_on(
    backend: Backend,
) -> None:
    table = _table(backend)
    backend.enqueue(keyed_spec("a", None, None))
    guard = guard_of(fetch_one(backend, ["a"]))

    def failing(tx: Any, row: Any) -> None:
        _run(tx, backend, f"INSERT INTO {table} (n) VALUES (1)")
        raise RuntimeError("the block fails")

    def writing(tx: Any, row: Any) -> None:
        _run(tx, backend, f"INSERT INTO {table} (n) VALUES (2)")

    for _ in range(3):
        with pytest.raises(RuntimeError, match="the block fails"):
            _driver(backend).write_from("guard_state", guard_params(guard, None), failing)
    _driver(backend).write_from("guard_state", guard_params(guard, None), writing)
    assert _count(backend, table) == 1


def _step_params(tx: Any, guard: Any, key: str, lease_token: str) -> dict[str, Any]:
    return {
        "key": key,
        "name": "effect",
        "result": "1",
        "fence": None,
        "now": tx.now(),
        "job_id": guard.job_id,
        "lease_token": lease_token,
        "resource": None,
        "slot_key": None,
        "slot": None,
        "slot_fence": None,
    }


def test_a_last_write_that_changes_no_row_writes_nothing_of_its_transaction(
    backend: Backend,
) -> None:
    """On PostgreSQL the last write travels with the COMMIT, which must then not run."""
    table = _table(backend)
    backend.enqueue(keyed_spec("a", None, "op:1"))
    guard = guard_of(fetch_one(backend, ["a"]))
    assert begin_operation(backend, guard, "op:1", None) is not None

    def step_as(lease_token: str) -> Any:
        def block(tx: Any, row: Any) -> None:
            _run(tx, backend, f"INSERT INTO {table} (n) VALUES (1)")
            tx.run_last("insert_step", _step_params(tx, guard, "op:1", lease_token))

        return block

    opening = guard_params(guard, "op:1")
    with pytest.raises(StatementRefused, match="insert_step changed no row"):
        _driver(backend).write_from("guard_state", opening, step_as("not-the-lease"))
    assert _count(backend, table) == 0
    assert backend.get_operation("op:1").steps == {}  # type: ignore[union-attr]
    _driver(backend).write_from("guard_state", opening, step_as(guard.lease_token))
    assert _count(backend, table) == 1
    assert list(backend.get_operation("op:1").steps) == ["effect"]  # type: ignore[union-attr]


def test_a_connection_whose_prepared_statements_were_dropped_prepares_them_again() -> None:
    backend = PostgresBackend(
        pg.fresh_store_url(pg.session_database()), pool_size=1, clock=ControlledClock()
    )
    try:
        table = _table(backend)
        backend.enqueue(keyed_spec("a", None, None))
        guard = guard_of(fetch_one(backend, ["a"]))
        params = guard_params(guard, None)

        def drop_them(tx: Any, row: Any) -> Any:
            # Allowed inside a transaction: what a pooler's reset or a user's code may do.
            _run(tx, backend, "DEALLOCATE ALL")
            return row

        assert backend.driver.write_from("guard_state", params, drop_them)["lease_ok"] == 1

        def write(tx: Any, row: Any) -> Any:
            _run(tx, backend, f"INSERT INTO {table} (n) VALUES (1)")
            return row

        assert backend.driver.write_from("guard_state", params, write)["lease_ok"] == 1
        assert _count(backend, table) == 1
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("text", "body", "names"),
    [
        ("SELECT %(a)s, %(b)s, %(a)s", "SELECT $1, $2, $1", ("a", "b")),
        ("SELECT 5 %% 3 + %(x)s::int", "SELECT 5 % 3 + $1::int", ("x",)),
        ("SELECT 1", "SELECT 1", ()),
    ],
)
def test_placeholders_become_numbered_parameters(
    text: str, body: str, names: tuple[str, ...]
) -> None:
    assert positional(text) == (body, names)


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -7,
        2**62,
        1733245678.123456,
        1e-05,
        -0.5,
        float("inf"),
        float("nan"),
        True,
        "plain",
        "it's",
        "back\\slash",
        "",
        "ünïcode ✓",
    ],
)
def test_a_literal_reads_back_as_the_value_it_renders(value: Any) -> None:
    """As a prepared statement's parameter of the value's type takes it (a float's text is a
    numeric constant, made a double by the parameter's type: it must be the same double)."""
    kind = {bool: "boolean", int: "bigint", float: "float8", str: "text"}.get(type(value), "text")
    with psycopg.connect(pg.session_database(), autocommit=True) as conn:
        escaping = psycopg.pq.Escaping(conn.pgconn)
        text = literal(conn, escaping, value)
        row = conn.execute(f"SELECT ({text})::{kind}").fetchone()
    assert row is not None
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(row[0])
    else:
        assert row[0] == value
        assert type(row[0]) is type(value)


def test_a_text_with_a_nul_is_refused_before_it_is_sent() -> None:
    with psycopg.connect(pg.session_database(), autocommit=True) as conn:
        escaping = psycopg.pq.Escaping(conn.pgconn)
        with pytest.raises(psycopg.DataError, match="NUL"):
            literal(conn, escaping, "a\x00b")

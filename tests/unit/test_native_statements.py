"""jobguard's named PostgreSQL statements in PostgreSQL's own ``$n`` form, converted once."""

from __future__ import annotations

import re

import psycopg
import pytest

from jobguard.backends.postgres.driver import render_queries
from jobguard.backends.postgres.statements import Statement, native_statements
from tests.support import pg


def test_names_are_numbered_in_order_of_first_use_and_a_repeated_name_keeps_its_number() -> None:
    statement = Statement.of("SELECT %(b)s, %(a)s, %(b)s, '100%%' WHERE x LIKE 'a%%'")
    assert statement.native == b"SELECT $1, $2, $1, '100%' WHERE x LIKE 'a%'"
    assert statement.names == ("b", "a")
    assert statement.values({"a": 1, "b": 2, "unused": 3}) == [2, 1]


def test_a_missing_parameter_is_psycopgs_own_error_naming_it() -> None:
    """Callers of the driver handle a psycopg error; a KeyError would escape them."""
    statement = Statement.of("SELECT %(present)s, %(absent)s")
    with pytest.raises(psycopg.ProgrammingError, match="query parameter missing: absent"):
        statement.values({"present": 1})


@pytest.mark.parametrize("text", ["SELECT %s", "SELECT %(n)b", "SELECT 5 % 2"])
def test_a_placeholder_it_does_not_convert_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="only %\\(name\\)s placeholders"):
        Statement.of(text)


def test_every_named_statement_converts_to_consecutive_numbers_with_nothing_of_psycopg_left() -> (
    None
):
    statements = native_statements(render_queries("jobguard"))
    assert statements
    for name, statement in statements.items():
        text = statement.native.decode()
        used = {int(number) for number in re.findall(r"\$(\d+)", text)}
        assert used == set(range(1, len(statement.names) + 1)), name
        assert "%(" not in text, name


def test_a_native_statement_runs_as_its_psycopg_text_does_on_the_server() -> None:
    """The same rows from the server either way: the conversion is psycopg's."""
    text = "SELECT %(a)s::int + %(b)s::int AS sum, %(a)s::text || '%%' AS percent, %(c)s AS c"
    params = {"a": 2, "b": 40, "c": None}
    statement = Statement.of(text)
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        named = conn.execute(text, params).fetchall()
        native = psycopg.RawCursor(conn).execute(statement.native, statement.values(params))
        assert native.fetchall() == named == [(42, "2%", None)]

"""Unit tests of the named-query loader ``jobguard.backends._sql`` and the drivers' query files."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from jobguard.backends import _sql
from jobguard.backends.sql import cancels, endings, leases, pauses, proofs, reads, store
from jobguard.backends.sqlite.connection import split_statements


def test_parse_queries_splits_named_statements_and_keeps_their_comments() -> None:
    """STYLE: SQL lives in .sql files as named queries, loaded once."""
    text = """
-- header comment, not a query
-- name: first
-- What the first one does.
SELECT 1;

-- name: second_one
UPDATE t SET x = 1
WHERE y = :y;
"""
    queries = _sql.parse_queries(text)
    assert list(queries) == ["first", "second_one"]
    assert queries["first"] == "-- What the first one does.\nSELECT 1;"
    assert queries["second_one"] == "UPDATE t SET x = 1\nWHERE y = :y;"


def test_a_query_name_defined_twice_is_refused() -> None:
    """A duplicate name would silently replace a statement; it is an error at load time."""
    with pytest.raises(ValueError, match="'same' is defined twice"):
        _sql.parse_queries("-- name: same\nSELECT 1;\n-- name: same\nSELECT 2;\n")


def test_an_empty_query_is_refused() -> None:
    """A name with no statement under it is a mistake in the file."""
    with pytest.raises(ValueError, match="'nothing' is empty"):
        _sql.parse_queries("-- name: nothing\n\n-- name: something\nSELECT 1;\n")


def test_a_part_is_put_in_place_in_every_query_that_names_it() -> None:
    """A condition several statements share is written once; each gets it, without its
    documenting comments, where it names it."""
    text = """
-- part: held
-- Why the row is held.
held_by = :me
AND until > :now

-- name: renew
UPDATE t SET until = :later WHERE {part:held};

-- name: release
DELETE FROM t WHERE {part:held} RETURNING id;
"""
    queries = _sql.parse_queries(text)
    assert list(queries) == ["renew", "release"]
    assert queries["renew"] == "UPDATE t SET until = :later WHERE held_by = :me\nAND until > :now;"
    assert queries["release"] == (
        "DELETE FROM t WHERE held_by = :me\nAND until > :now RETURNING id;"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: q\nSELECT 1 WHERE {part:missing};\n", "part 'missing' is used but not defined"),
        ("-- part: idle\nx = 1\n-- name: q\nSELECT 1;\n", "part 'idle' is defined but no query"),
        ("-- part: p\nx\n-- part: p\ny\n-- name: q\nSELECT {part:p};\n", "'p' is defined twice"),
        ("-- part: p\n\n-- name: q\nSELECT {part:p};\n", "part 'p' is empty"),
    ],
)
def test_a_part_missing_unused_twice_or_empty_is_refused_at_load(text: str, error: str) -> None:
    """A statement left with a part's name in it, or a shared condition no statement checks, is
    a mistake in the file, found when it is loaded."""
    with pytest.raises(ValueError, match=re.escape(error)):
        _sql.parse_queries(text)


DRIVERS = ["jobguard.backends.sqlite", "jobguard.backends.postgres"]
DIALECT_ONLY = {
    "settle_set": "postgres",
    "begin_batch": "postgres",
    "lease_and_begin": "postgres",
    "ready_jobs": "sqlite",
    **{name: "sqlite" for name in ("settle_jobs", "complete_operations", "release_operations")},
    "close_attempts": "sqlite",
}


@pytest.mark.parametrize("package", DRIVERS)
def test_every_query_the_store_uses_is_defined_and_every_defined_one_is_used(package: str) -> None:
    """No ``KeyError`` waiting in a rare code path, and no dead SQL in any driver's queries.sql."""
    defined = set(_sql.load_queries(package))
    parts = (store, leases, proofs, endings, reads, pauses, cancels)
    parts = (*parts, importlib.import_module(package + ".driver"))
    source = "".join(inspect.getsource(part) for part in parts)
    used = set(re.findall(r'(?:one|all|run|_read_all)\(\s*"([a-z_0-9]+)"', source))
    # Names also travel as plain strings (``query="retry_job"``); any mention counts as a use.
    mentioned = set(re.findall(r'"([a-z_0-9]+)"', source))
    # Statements only one dialect can write in one piece (SQLite has no writes inside WITH);
    # the store chooses them by the driver's dialect.
    only = {name for name, dialect in DIALECT_ONLY.items() if not package.endswith(dialect)}
    assert used - defined - only == set()
    assert defined - mentioned == set()


@pytest.mark.parametrize("package", DRIVERS)
def test_each_write_has_one_statement_shape_the_set_form(package: str) -> None:
    """No single-row twin of a set statement (``grant_lock`` beside ``grant_locks``): one item
    is a set of one, so a rule of the guard is written once per database."""
    defined = set(_sql.load_queries(package))
    assert {name for name in defined if name + "s" in defined} == set()


@pytest.mark.parametrize("package", DRIVERS)
def test_migrations_are_numbered_from_one_each_number_once(package: str) -> None:
    """Migrations apply in order; a duplicate or a missing number (a file lost, which a store
    past it would never apply) is refused at load time."""
    migrations = _sql.load_migrations(package)
    versions = [version for version, _, _ in migrations]
    assert versions[0] == 1
    assert versions == sorted(set(versions))
    assert versions == list(range(1, len(versions) + 1))
    assert all(sql.strip() for _, _, sql in migrations)


def test_split_statements_keeps_multi_line_statements_whole_and_drops_comments() -> None:
    """Migrations run statement by statement inside one transaction."""
    script = "-- comment\nCREATE TABLE a (\n  x INTEGER -- inline\n);\n\nCREATE INDEX i ON a (x);\n"
    assert split_statements(script) == [
        "CREATE TABLE a (\n  x INTEGER -- inline\n);",
        "CREATE INDEX i ON a (x);",
    ]
    with pytest.raises(ValueError, match="incomplete"):
        split_statements("CREATE TABLE b (x INTEGER")

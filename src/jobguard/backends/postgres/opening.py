"""A transaction's BEGIN with its first statement, and its COMMIT with its last (PostgreSQL).

psycopg sends a transaction's BEGIN and its COMMIT each on its own and waits for each answer;
a ``db_step`` (its guard's proofs read first, its step record written last) paid both waits.
Here the BEGIN and the read travel as one simple query, ``BEGIN; EXECUTE name(...)``, and the
last write and the COMMIT as another, ``EXECUTE name__last(...); COMMIT``. Each statement is a
SQL-level prepared statement of the connection (prepared on its first use there, so its plan is
made once, as psycopg's own prepared statements are), its parameters rendered as literals
(text quoted and escaped by libpq for the connection, never formatted by hand). A last write
that changes no row fails (a division by zero), so the COMMIT after it does not run: the
transaction writes nothing, as when the proofs it carries no longer hold.
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import errors, pq, sql

_PARAMETER = re.compile(r"%\((\w+)\)s|%%")
# The prepared form of a write sent with the COMMIT is named after it with this ending.
LAST = "__last"
# What the server says when such a write changed no row.
REFUSED = errors.DivisionByZero


def positional(text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with psycopg's ``%(name)s`` placeholders as ``$1``, ``$2``… (a name used twice
    keeps its number) and ``%%`` as ``%``; and the names in the order of their numbers."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PARAMETER.sub(number, text), tuple(names)


class OpeningStatements:
    """The named statements a transaction may open with, prepared per connection on first use.

    Args:
        queries: The driver's rendered named statements.
        prefix: What the prepared statements' names start with on the server (a connection
            serves one driver; the names must only not meet psycopg's own, ``_pg3_…``).
    """

    def __init__(self, queries: Mapping[str, str], prefix: str) -> None:
        self._queries = queries
        self._prefix = prefix
        self._shapes: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = (
            weakref.WeakKeyDictionary()
        )
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()

    def _shape(self, name: str) -> tuple[str, tuple[str, ...]]:
        shape = self._shapes.get(name)
        if shape is None:
            base, last = (name[: -len(LAST)], True) if name.endswith(LAST) else (name, False)
            text = self._queries[base].rstrip().rstrip(";")
            if last:
                # A write that must change a row: with none, 1 / 0 fails the statement, and
                # the COMMIT sent after it in the same query does not run.
                text = f"WITH changed AS ({text} RETURNING 1) SELECT 1 / count(*) FROM changed"
            shape = self._shapes[name] = positional(text)
        return shape

    def _prepare(self, conn: psycopg.Connection[Any], name: str) -> None:
        """``PREPARE`` the statement on ``conn`` unless this connection already has it."""
        with self._lock:
            done = self._prepared.setdefault(conn, set())
            if name in done:
                return
        body, _ = self._shape(name)
        statement = sql.SQL("PREPARE {} AS ").format(sql.Identifier(self._prefix + name))
        # Already there: prepared by an earlier use that this process lost track of.
        with suppress(errors.DuplicatePreparedStatement):
            conn.execute(statement + sql.SQL(body), prepare=False)
        with self._lock:
            done.add(name)

    def forget(self, conn: psycopg.Connection[Any]) -> None:
        """``conn`` holds none of these statements any more (they were deallocated)."""
        with self._lock:
            self._prepared.pop(conn, None)

    def begin_with(
        self, conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any]
    ) -> str:
        """The text that begins a transaction on ``conn`` and runs ``name`` with ``params``
        (the statement prepared there first, if it is not yet)."""
        return f"BEGIN; {self._execute(conn, name, params)}"

    def end_with(self, conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any]) -> str:
        """The text that runs the write ``name`` with ``params``, refused unless it changes a
        row (division by zero: :data:`REFUSED`), and commits the transaction if it is not."""
        return f"{self._execute(conn, name + LAST, params)}; COMMIT"

    def _execute(self, conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any]) -> str:
        self._prepare(conn, name)
        _, names = self._shape(name)
        escaping: Any = pq.Escaping(conn.pgconn)  # libpq's; its type is the binding's
        values = ", ".join(literal(conn, escaping, params[key]) for key in names)
        return f"EXECUTE {self._quoted(conn, name)}({values})"

    def _quoted(self, conn: psycopg.Connection[Any], name: str) -> str:
        quoted = self._names.get(name)
        if quoted is None:
            quoted = self._names[name] = sql.Identifier(self._prefix + name).as_string(conn)
        return quoted


def literal(conn: psycopg.Connection[Any], escaping: Any, value: Any) -> str:
    """``value`` as a SQL literal: the common kinds rendered here (text by libpq's own
    escaping, for this connection), the rest by psycopg, which is many times slower."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        if "\x00" in value:  # what psycopg says of a NUL in a text parameter
            raise errors.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        encoding = conn.info.encoding
        return str(escaping.escape_literal(value.encode(encoding)).decode(encoding))
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)  # the shortest text that reads back as the same double
    return sql.Literal(value).as_string(conn)

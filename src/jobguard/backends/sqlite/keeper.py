"""What a step's SQL may not do on SQLite, enforced as each statement is prepared.

A step's statements run on the connection they are given, inside the step's transaction: on
the worker's write connection (``db_step``, ``db_writes``) or on the caller's own (a step on an
adopted connection). SQLite calls an authorizer as it prepares a statement, so the keeper below
refuses there what would end the step's transaction or outlive it on the connection, whatever
the text looks like.

SQLite forgets every prepared statement of a connection when an authorizer is installed on it,
so the worker's write connection keeps one keeper for its life and turns it on for each step
(:meth:`StepKeeper.watch`): jobguard's own statements stay prepared between steps. A statement
prepared while the keeper was not watching is reused from ``sqlite3``'s statement cache without
being asked about again; jobguard's own statements on that connection that the keeper would
refuse (``BEGIN``, ``SAVEPOINT``, ``COMMIT``, its pragmas) therefore carry :data:`OWN`, a
comment no step's text has, so that a step's ``COMMIT`` is never one of them.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from jobguard.core import messages

# Put before each statement of jobguard's own that a watching keeper would refuse: the text is
# then this process's alone, never a step's, in the statement cache.
OWN = f"/* jobguard {secrets.token_hex(8)} */ "


class OwnSavepoint(NamedTuple):
    """The statements of one savepoint of jobguard's own, each carrying :data:`OWN`."""

    begin: str
    roll_back: str
    release: str


def own_savepoint(name: str) -> OwnSavepoint:
    """The savepoint ``name``'s statements, in texts no step's statement has."""
    return OwnSavepoint(
        f"{OWN}SAVEPOINT {name}", f"{OWN}ROLLBACK TO {name}", f"{OWN}RELEASE {name}"
    )


# PRAGMAs whose argument only names what to read, and values kept in the database file itself
# (written and rolled back with the step's transaction), or dropped at its end.
_PRAGMAS_ENDING_WITH_THE_STEP = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_info",
        "index_xinfo",
        "index_list",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
        "defer_foreign_keys",
        "user_version",
        "application_id",
    }
)

_WATCHED_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_TRANSACTION,
        sqlite3.SQLITE_SAVEPOINT,
        sqlite3.SQLITE_PRAGMA,
        sqlite3.SQLITE_ATTACH,
        sqlite3.SQLITE_DETACH,
    }
)


class StepKeeper:
    """SQLite authorizer for the statements of a step. Watching, it refuses what would end the
    step's transaction: BEGIN, COMMIT, ROLLBACK, and (unless ``savepoints``: an ORM's own,
    inside the step's BEGIN, cannot end it) SAVEPOINT; and what would outlive the step on the
    connection: a PRAGMA given a value (but those of :data:`_PRAGMAS_ENDING_WITH_THE_STEP`),
    ATTACH, DETACH. It remembers why it refused, so the error can say so instead of SQLite's
    "not authorized"."""

    def __init__(self, savepoints: bool = False, *, watching: bool = True) -> None:
        self.savepoints = savepoints
        self.watching = watching
        self.refused: str | None = None

    @contextmanager
    def watch(self, savepoints: bool) -> Iterator[StepKeeper]:
        """Watch the statements prepared inside the block (those of one step)."""
        self.savepoints, self.refused, self.watching = savepoints, None, True
        try:
            yield self
        finally:
            self.watching = False

    def __call__(self, action: int, first: str | None, second: str | None, *_: str | None) -> int:
        # Nearly every call: a read, an insert, a function, or jobguard's own statement.
        if not self.watching or action not in _WATCHED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_SAVEPOINT and self.savepoints:
            return sqlite3.SQLITE_OK
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            self.refused = messages.STEP_CANNOT_END_ITS_TRANSACTION
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and (
            second is None or (first or "").lower() in _PRAGMAS_ENDING_WITH_THE_STEP
        ):
            return sqlite3.SQLITE_OK
        self.refused = messages.STEP_CANNOT_CHANGE_ITS_SQLITE_CONNECTION
        return sqlite3.SQLITE_DENY

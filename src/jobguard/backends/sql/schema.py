"""Versioned, forward-only schema migrations: the rules every SQL driver applies the same way.

Each backend ships ``migrations/NNNN_name.sql``; the versions applied are rows of jobguard's own
``jobguard_schema`` table (never a setting of the database that its owner may use).
"""

from __future__ import annotations

from collections.abc import Sequence

from jobguard.backends._sql import load_migrations
from jobguard.exceptions import SchemaVersionError

Migration = tuple[int, str, str]


def migrations_of(package: str) -> list[Migration]:
    """``(version, name, sql)`` of a backend package, in order."""
    return load_migrations(package)


def latest(migrations: Sequence[Migration]) -> int:
    """The newest version this jobguard knows."""
    return migrations[-1][0] if migrations else 0


def pending(current: int, migrations: Sequence[Migration], where: str) -> list[Migration]:
    """The migrations a store at ``current`` lacks; refuse a store newer than this jobguard."""
    newest = latest(migrations)
    if current > newest:
        raise SchemaVersionError(
            f"{where} is at schema version {current}, newer than this jobguard knows "
            f"({newest}); upgrade jobguard instead of opening it with an older one"
        )
    return [migration for migration in migrations if migration[0] > current]


def require_current(current: int, migrations: Sequence[Migration], where: str) -> None:
    """Refuse a store whose schema is not exactly the one this jobguard knows, saying why."""
    missing = pending(current, migrations, where)
    if missing:
        raise SchemaVersionError(
            f"{where} is at schema version {current}; this jobguard needs version "
            f"{latest(migrations)}: run `jobguard migrate` (or App.migrate()) first"
        )

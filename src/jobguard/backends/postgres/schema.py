"""jobguard's schema in a PostgreSQL database: versioned, forward-only migrations.

The applied versions are rows of ``jobguard_schema`` inside jobguard's own schema; migrations
run one transaction at a time under an advisory lock, so two ``jobguard migrate`` started
together apply each version once.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from jobguard.backends.sql.schema import migrations_of, pending, require_current
from jobguard.exceptions import StoreUnavailableError

_PACKAGE = "jobguard.backends.postgres"
_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS {schema}.jobguard_schema ("
    " version integer PRIMARY KEY, name text NOT NULL,"
    " applied_at double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))"
)


def schema_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The version recorded in ``schema`` (0 when jobguard was never installed there)."""
    found = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'jobguard_schema'",
        (schema,),
    ).fetchone()
    if found is None:
        return 0
    query = sql.SQL("SELECT max(version) FROM {}.jobguard_schema").format(sql.Identifier(schema))
    row = conn.execute(query).fetchone()
    return int(row[0] or 0) if row else 0


def check_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Refuse a schema older or newer than this jobguard knows, saying what to run."""
    where = f"the PostgreSQL schema {schema!r}"
    try:
        current = schema_version(conn, schema)
    except psycopg.Error as exc:
        raise StoreUnavailableError(f"cannot read {where}: {exc}") from exc
    require_current(current, migrations_of(_PACKAGE), where)


def migrate(
    conn: psycopg.Connection[Any], schema: str, *, dry_run: bool = False
) -> tuple[int, list[str]]:
    """Apply the migrations ``schema`` lacks (creating it if needed), one transaction.

    Returns the version reached and the SQL applied (with ``dry_run``: that would be applied;
    nothing is changed).
    """
    migrations = migrations_of(_PACKAGE)
    name = sql.Identifier(schema)
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('jobguard.migrate'))")
            current = schema_version(conn, schema)
            todo = pending(current, migrations, f"the PostgreSQL schema {schema!r}")
            applied = [text for _version, _name, text in todo]
            if dry_run or not todo:
                return current, applied
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            conn.execute(sql.SQL(_VERSION_TABLE).format(schema=name))
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(name))
            for version, label, text in todo:
                conn.execute(text.encode())  # a script: no parameters, several statements
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.jobguard_schema (version, name) VALUES (%s, %s)"
                    ).format(name),
                    (version, label),
                )
                current = version
    except psycopg.Error as exc:
        raise StoreUnavailableError(
            f"cannot migrate the PostgreSQL schema {schema!r}: {exc}"
        ) from exc
    return current, applied

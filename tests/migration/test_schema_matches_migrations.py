"""Replaying every migration on an empty store gives exactly the schema in ``schema.sql``.

``schema.sql`` is the schema in one piece, for reading; the migrations are what stores run.
This keeps the two from drifting apart, on each backend.
"""

from __future__ import annotations

import secrets
import sqlite3
from contextlib import closing
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobguard.backends import migrate_store
from jobguard.backends.sqlite.connection import split_statements
from tests.support import pg


def schema_sql(package: str) -> str:
    return resources.files(package).joinpath("schema.sql").read_text("utf-8")


def sqlite_catalog(path: Path) -> dict[str, Any]:
    """Every table's columns and every index's definition, jobguard's version table aside."""
    with closing(sqlite3.connect(path)) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND name != 'jobguard_schema' ORDER BY name"
            )
        ]
        return {
            "columns": {t: conn.execute(f"PRAGMA table_info({t})").fetchall() for t in tables},
            "indexes": sorted(
                conn.execute(
                    "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index'"
                    " AND sql IS NOT NULL"
                ).fetchall()
            ),
        }


def test_sqlite_migrations_replayed_equal_schema_sql(tmp_path: Path) -> None:
    migrated = tmp_path / "migrated.db"
    migrate_store(f"sqlite:///{migrated}")
    direct = tmp_path / "direct.db"
    with closing(sqlite3.connect(direct, isolation_level=None)) as conn:
        for statement in split_statements(schema_sql("jobguard.backends.sqlite")):
            conn.execute(statement)
    assert sqlite_catalog(migrated) == sqlite_catalog(direct)


def postgres_catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    columns = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default,"
        " is_identity, ordinal_position FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name != 'jobguard_schema'"
        " ORDER BY table_name, ordinal_position",
        (schema,),
    ).fetchall()
    indexes = conn.execute(
        "SELECT indexname, replace(indexdef, %s, 'S') FROM pg_indexes WHERE schemaname = %s"
        " AND tablename != 'jobguard_schema' ORDER BY indexname",
        (f"{schema}.", schema),
    ).fetchall()
    checks = conn.execute(
        "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE connamespace = %s::regnamespace ORDER BY 1, 2",
        (schema,),
    ).fetchall()
    tables = [(name.split(".")[-1], definition) for name, definition in checks]
    ours = [row for row in tables if row[0] != "jobguard_schema"]
    storage = conn.execute(
        "SELECT relname, reloptions FROM pg_class WHERE relnamespace = %s::regnamespace"
        " AND relkind = 'r' AND relname != 'jobguard_schema' ORDER BY relname",
        (schema,),
    ).fetchall()
    return {"columns": columns, "indexes": indexes, "constraints": sorted(ours), "storage": storage}


def test_postgres_migrations_replayed_equal_schema_sql() -> None:
    database = pg.session_database()
    migrated = f"m_{secrets.token_hex(4)}"
    direct = f"d_{secrets.token_hex(4)}"
    migrate_store(f"{database}?schema={migrated}")
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(direct)))
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(direct)))
            conn.execute(schema_sql("jobguard.backends.postgres").encode())
        assert postgres_catalog(conn, migrated) == postgres_catalog(conn, direct)
        assert postgres_catalog(conn, migrated)["columns"]  # not vacuous

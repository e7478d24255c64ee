"""SQLAlchemy URLs and tables beside a test store (the store's own file or schema)."""

from __future__ import annotations

from typing import Any

from tests.support import stores


def sqlalchemy_url(store_url: str, *, asyncio: bool = False) -> str:
    """The SQLAlchemy URL of the store's database (psycopg, pysqlite or aiosqlite)."""
    if stores.kind_of(store_url) == "sqlite":
        driver = "sqlite+aiosqlite" if asyncio else "sqlite"
        return f"{driver}:///{stores.sqlite_file(store_url)}"
    return stores.conninfo_of(store_url).replace("postgresql://", "postgresql+psycopg://", 1)


def business_schema(store_url: str) -> str | None:
    """Where business tables live beside the store: its schema on PostgreSQL, main on SQLite."""
    return None if stores.kind_of(store_url) == "sqlite" else stores.schema_of(store_url)


def orders_table(store_url: str) -> Any:
    """A SQLAlchemy ``orders`` table (id, status) beside the store, created if missing."""
    import sqlalchemy as sa

    metadata = sa.MetaData(schema=business_schema(store_url))
    table = sa.Table(
        "orders",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(20), nullable=False),
    )
    engine = sa.create_engine(sqlalchemy_url(store_url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    return table

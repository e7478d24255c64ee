"""Transactional enqueue on SQLAlchemy's and asyncio's connections, and on a pooled one: the job
exists if and only if the caller's transaction commits (G3), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiosqlite
import psycopg
import pytest
import sqlalchemy as sa
from psycopg_pool import ConnectionPool
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from jobguard import App, ConfigurationError, Context, JobStatus
from jobguard.testing import drain
from tests.support import pg, stores
from tests.support.frameworks import orders_table, sqlalchemy_url


@pytest.fixture
def shop(store_url: str) -> Iterator[tuple[App, Any]]:
    app = App(store_url)
    shipped: list[int] = []

    @app.task(name="ship", operation_key="ship:{order_id}")
    def ship(ctx: Context, order_id: int) -> None:
        shipped.append(order_id)

    _ = app.backend  # the schema exists before the application's transactions use it
    yield app, orders_table(store_url)
    app.close()


def order_ids(store_url: str) -> list[int]:
    return [
        row[0]
        for row in stores.query(store_url, f"SELECT id FROM {stores.table(store_url, 'orders')}")
    ]


def test_sqlalchemy_connection_rolled_back_leaves_nothing_committed_leaves_one(
    shop: tuple[App, Any], store_url: str
) -> None:
    app, orders = shop
    engine = sa.create_engine(sqlalchemy_url(store_url))
    try:
        with engine.connect() as conn:
            conn.execute(orders.insert().values(id=1, status="new"))
            app.tasks["ship"].enqueue(order_id=1, connection=conn)
            conn.rollback()
        assert order_ids(store_url) == []
        assert app.jobs() == []
        with engine.connect() as conn:
            # enqueue first: the connection is begun by it, as by any statement
            job = app.tasks["ship"].enqueue(order_id=2, connection=conn)
            conn.execute(orders.insert().values(id=2, status="new"))
            conn.commit()
        with engine.begin() as conn:
            app.tasks["ship"].enqueue_many([{"order_id": 3}], connection=conn)
            conn.execute(orders.insert().values(id=3, status="new"))
    finally:
        engine.dispose()
    assert order_ids(store_url) == [2, 3]
    assert [j.id for j in app.jobs() if j.id == job.id] == [job.id]
    assert drain(app)[JobStatus.COMPLETED] == 2


def test_sqlalchemy_orm_session(shop: tuple[App, Any], store_url: str) -> None:
    app, orders = shop
    engine = sa.create_engine(sqlalchemy_url(store_url))
    try:
        with Session(engine) as session:
            session.execute(orders.insert().values(id=1, status="new"))
            app.tasks["ship"].enqueue(order_id=1, connection=session)
            session.rollback()
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=2, status="new"))
            app.tasks["ship"].enqueue(order_id=2, connection=session)
    finally:
        engine.dispose()
    assert order_ids(store_url) == [2]
    [job] = app.jobs()
    assert job.operation_key == "ship:2"
    assert drain(app)[JobStatus.COMPLETED] == 1


def test_sqlalchemy_async_session(shop: tuple[App, Any], store_url: str) -> None:
    app, orders = shop

    async def run() -> None:
        engine = create_async_engine(sqlalchemy_url(store_url, asyncio=True))
        try:
            async with AsyncSession(engine) as session:
                await session.execute(orders.insert().values(id=1, status="new"))
                await app.tasks["ship"].enqueue_async(order_id=1, connection=session)
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(orders.insert().values(id=2, status="new"))
                await (
                    app.tasks["ship"]
                    .options(priority=1)
                    .enqueue_async(order_id=2, connection=session)
                )
            async with engine.begin() as conn:
                await app.tasks["ship"].enqueue_many_async([{"order_id": 3}], connection=conn)
                await conn.execute(orders.insert().values(id=3, status="new"))
        finally:
            await engine.dispose()

    asyncio.run(run())
    assert order_ids(store_url) == [2, 3]
    assert sorted(job.operation_key or "" for job in app.jobs()) == ["ship:2", "ship:3"]
    assert drain(app)[JobStatus.COMPLETED] == 2


async def _driver_connection(store_url: str) -> Any:
    if stores.kind_of(store_url) == "sqlite":
        return await aiosqlite.connect(stores.sqlite_file(store_url), timeout=30.0)
    return await psycopg.AsyncConnection.connect(stores.conninfo_of(store_url))


def test_asyncio_driver_connection(shop: tuple[App, Any], store_url: str) -> None:
    """psycopg's AsyncConnection on PostgreSQL, aiosqlite's on SQLite."""
    app, _ = shop
    insert = stores.dialect_sql(
        store_url, f"INSERT INTO {stores.table(store_url, 'orders')} (id, status) VALUES (?, 'new')"
    )

    async def run() -> None:
        conn = await _driver_connection(store_url)
        try:
            await conn.execute(insert, (1,))
            await app.tasks["ship"].enqueue_async(order_id=1, connection=conn)
            await conn.rollback()
            await conn.execute(insert, (2,))
            await app.tasks["ship"].enqueue_async(order_id=2, connection=conn)
            await conn.commit()
        finally:
            await conn.close()

    asyncio.run(run())
    assert order_ids(store_url) == [2]
    [job] = app.jobs()
    assert job.operation_key == "ship:2"
    assert drain(app)[JobStatus.COMPLETED] == 1


def test_asyncio_connection_on_a_sync_enqueue_is_refused(
    shop: tuple[App, Any], store_url: str
) -> None:
    app, _ = shop

    async def run() -> None:
        conn = await _driver_connection(store_url)
        try:
            with pytest.raises(ConfigurationError, match="enqueue_async"):
                app.tasks["ship"].enqueue(order_id=1, connection=conn)
            with pytest.raises(ConfigurationError, match="connection="):
                await app.tasks["ship"].enqueue_async(order_id=1, connection=object())
        finally:
            await conn.close()

    asyncio.run(run())
    assert app.jobs() == []


def test_a_synchronous_connection_given_to_enqueue_async(
    shop: tuple[App, Any], store_url: str
) -> None:
    """It is used on the store's thread, as by enqueue (a psycopg or sqlite3 connection)."""
    app, orders = shop
    engine = sa.create_engine(sqlalchemy_url(store_url))

    async def run() -> None:
        with engine.connect() as conn:
            conn.execute(orders.insert().values(id=1, status="new"))
            await app.tasks["ship"].enqueue_async(order_id=1, connection=conn)
            conn.rollback()
        with engine.begin() as conn:
            conn.execute(orders.insert().values(id=2, status="new"))
            await app.tasks["ship"].enqueue_async(order_id=2, connection=conn)

    try:
        asyncio.run(run())
    finally:
        engine.dispose()
    assert order_ids(store_url) == [2]
    assert [job.operation_key for job in app.jobs()] == ["ship:2"]


def test_a_pooled_psycopg_connection() -> None:
    """A connection lent by a psycopg_pool pool (PostgreSQL only: SQLite has no pool)."""
    url = pg.fresh_store_url(pg.session_database())
    app = App(url)

    @app.task(name="ship")
    def ship(ctx: Context, order_id: int) -> None:
        """Nothing to do: the test is about whether the job exists."""

    _ = app.backend
    orders_table(url)
    insert = f"INSERT INTO {stores.table(url, 'orders')} (id, status) VALUES (%s, 'new')"
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        stores.conninfo_of(url), min_size=1, max_size=2, open=True
    )
    try:
        with pool.connection() as conn:
            conn.execute(insert, (1,))
            ship.enqueue(order_id=1, connection=conn)
            conn.rollback()
        with pool.connection() as conn:  # committed when the block ends without error
            conn.execute(insert, (2,))
            ship.enqueue(order_id=2, connection=conn)
    finally:
        pool.close()
    assert order_ids(url) == [2]
    assert len(app.jobs()) == 1
    assert drain(app)[JobStatus.COMPLETED] == 1
    app.close()

"""Transactional enqueue: a job written in the caller's own transaction exists if and only if
that transaction commits — the producer's half of "the publish status was unclear".

Runs on every backend: a ``sqlite3`` connection to the store's file, a psycopg connection to the
store's PostgreSQL database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobguard import App, ConfigurationError, Context, JobStatus
from jobguard.testing import drain
from tests.support import stores


def make_shop(url: str) -> App:
    app = App(url)

    @app.task(name="ship", operation_key="ship:{order_id}")
    def ship(ctx: Context, order_id: int) -> None:
        """Nothing to do: the test is about whether the job exists."""

    return app


@pytest.fixture
def shop(store_url: str) -> Iterator[App]:
    stores.execute(store_url, [f"CREATE TABLE {stores.table(store_url, 'orders')} (id INTEGER)"])
    app = make_shop(store_url)
    _ = app.backend  # the store exists before the application's transactions use it
    yield app
    app.close()


def user_connection(url: str) -> Any:
    """The application's own connection, in its default (transactional) mode."""
    if stores.kind_of(url) == "sqlite":
        return sqlite3.connect(stores.sqlite_file(url), timeout=30.0)
    return psycopg.connect(stores.conninfo_of(url))


def place_order(url: str, conn: Any, order_id: int) -> None:
    insert = f"INSERT INTO {stores.table(url, 'orders')} (id) VALUES (?)"
    conn.execute(stores.dialect_sql(url, insert), (order_id,))


def orders(url: str) -> list[int]:
    return [row[0] for row in stores.query(url, f"SELECT id FROM {stores.table(url, 'orders')}")]


def test_a_rolled_back_transaction_leaves_no_job(shop: App, store_url: str) -> None:
    conn = user_connection(store_url)
    try:
        place_order(store_url, conn, 1)
        job = shop.tasks["ship"].enqueue(order_id=1, connection=conn)
        assert job.status == JobStatus.QUEUED
        conn.rollback()
    finally:
        conn.close()
    assert orders(store_url) == []
    assert shop.jobs() == []


def test_a_committed_transaction_leaves_exactly_one_job_that_runs(
    shop: App, store_url: str
) -> None:
    conn = user_connection(store_url)
    try:
        place_order(store_url, conn, 2)
        ship = shop.tasks["ship"]
        first = ship.options(dedup_key="ship:2").enqueue(order_id=2, connection=conn)
        again = ship.options(dedup_key="ship:2").enqueue(order_id=2, connection=conn)
        assert again.deduplicated
        assert again.id == first.id
        [other] = ship.enqueue_many([{"order_id": 3}], connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert orders(store_url) == [2]
    assert sorted(job.id for job in shop.jobs()) == sorted([first.id, other.id])
    assert drain(shop, timeout_s=30)[JobStatus.COMPLETED] == 2


def test_a_connection_that_cannot_hold_the_job_is_refused(shop: App, store_url: str) -> None:
    """A connection in autocommit mode outside a transaction would write the job at once, alone;
    one to another database would write it where no worker looks. Both are refused."""
    ship = shop.tasks["ship"]
    if stores.kind_of(store_url) == "sqlite":
        autocommit: Any = sqlite3.connect(stores.sqlite_file(store_url), isolation_level=None)
        elsewhere: Any = sqlite3.connect(":memory:")
    else:
        autocommit = psycopg.connect(stores.conninfo_of(store_url), autocommit=True)
        elsewhere = object()
    try:
        with pytest.raises(ConfigurationError, match="autocommit"):
            ship.enqueue(order_id=4, connection=autocommit)
        with pytest.raises(ConfigurationError, match="connection="):
            ship.enqueue(order_id=5, connection=elsewhere)
    finally:
        autocommit.close()
        if hasattr(elsewhere, "close"):
            elsewhere.close()
    assert shop.jobs() == []


def test_a_handler_argument_named_connection_is_refused_at_registration(store_url: str) -> None:
    app = App(store_url)
    with pytest.raises(ConfigurationError, match="'connection' is reserved"):

        @app.task
        def clash(ctx: Context, connection: str) -> None:
            """Would be ambiguous with enqueue(connection=...)."""

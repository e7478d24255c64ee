"""``ctx.db_step(..., on=SQLAlchemySteps(engine))``: the step function writes through a SQLAlchemy
ORM session in the step's transaction; the rows commit with the step record or not at all, and a
stale fence rolls the ORM's writes back (G5.2), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, registry

from jobguard import App, Context, JobStatus
from jobguard.backends.base import Backend
from jobguard.contrib.sqlalchemy import SQLAlchemySteps
from jobguard.exceptions import ConfigurationError, StaleFenceError, StoreUnavailableError
from jobguard.models import Guard
from jobguard.testing import ControlledClock, drain
from tests.support import pg, stores
from tests.support.frameworks import business_schema, sqlalchemy_url
from tests.support.ports import begin_operation, fetch, guard_of

KEY = "pay:7"


class Payment:
    """Mapped per store below (its table lives in the store's schema on PostgreSQL)."""

    id: Mapped[int]
    order_id: Mapped[int]


def mapped_payments(store_url: str) -> sa.Table:
    reg = registry()
    table = sa.Table(
        "payments",
        reg.metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("order_id", sa.Integer, nullable=False),
        schema=business_schema(store_url),
    )
    reg.dispose()
    reg = registry()
    reg.map_imperatively(Payment, table)
    return table


@contextmanager
def opened_world(url: str) -> Iterator[tuple[Backend, ControlledClock, sa.Engine]]:
    """The store at ``url`` on a controlled clock, with a mapped ``payments`` table beside it."""
    clock = ControlledClock()
    backend = stores.open_backend(url, clock=clock)
    table = mapped_payments(url)
    engine = sa.create_engine(sqlalchemy_url(url))
    table.create(engine)
    try:
        yield backend, clock, engine
    finally:
        sa.orm.clear_mappers()
        engine.dispose()
        backend.close()


@pytest.fixture
def world(store_url: str) -> Iterator[tuple[Backend, ControlledClock, sa.Engine]]:
    with opened_world(store_url) as opened:
        yield opened


@pytest.fixture
def pg_world() -> Iterator[tuple[Backend, ControlledClock, sa.Engine]]:
    """PostgreSQL only: another connection can commit while the step's transaction is open."""
    with opened_world(pg.fresh_store_url(pg.session_database())) as opened:
        yield opened


def payments(engine: sa.Engine) -> list[int]:
    with Session(engine) as session:
        return sorted(p.order_id for p in session.query(Payment).all())


def delivered(backend: Backend, *, resource: str | None = None) -> Guard:
    from jobguard.models import JobSpec

    backend.enqueue(
        JobSpec(
            task="pay",
            queue="default",
            payload="{}",
            max_attempts=3,
            visibility_timeout_s=30.0,
            operation_key=KEY,
        )
    )
    (delivery,) = fetch(backend, ["default"], 1, "w1")
    guard = guard_of(delivery)
    if resource is not None:
        grant = backend.acquire_lock(resource, "owner-1", 5.0)
        assert grant is not None
        guard = Guard(guard.job_id, guard.lease_token, guard.attempt_id, grant)
    assert begin_operation(backend, guard, KEY, resource) is not None
    return guard


def pay(session: Session, order_id: int) -> dict[str, int]:
    session.add(Payment(order_id=order_id))
    session.commit()  # joined to the step's transaction: this does not end it
    return {"paid": order_id}


def test_orm_writes_commit_once_with_the_step_record(
    world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    backend, clock, engine = world
    steps = SQLAlchemySteps(engine)
    guard = delivered(backend)
    assert backend.db_step(guard, KEY, "pay", pay, (7,), steps) == (True, {"paid": 7})
    clock.advance(31)  # the lease expires: a second worker gets the same job
    (again,) = fetch(backend, ["default"], 1, "w2")
    retry = guard_of(again)
    assert begin_operation(backend, retry, KEY, None) is not None

    def must_not_run(session: Session, order_id: int) -> None:
        raise AssertionError("a recorded step ran again")

    assert backend.db_step(retry, KEY, "pay", must_not_run, (7,), steps) == (False, {"paid": 7})
    assert payments(engine) == [7]


def test_the_orm_may_use_savepoints_of_its_own_inside_the_step(
    world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    backend, _, engine = world
    guard = delivered(backend)

    def pay_nested(session: Session, order_id: int) -> int:
        with session.begin_nested():  # a SAVEPOINT, released: the step's transaction goes on
            session.add(Payment(order_id=order_id))
        return order_id

    assert backend.db_step(guard, KEY, "pay", pay_nested, (7,), SQLAlchemySteps(engine)) == (
        True,
        7,
    )
    assert payments(engine) == [7]


def test_a_step_function_that_raises_leaves_no_orm_write(
    world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    backend, _, engine = world
    guard = delivered(backend)

    def pay_then_fail(session: Session, order_id: int) -> None:
        session.add(Payment(order_id=order_id))
        session.flush()
        raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        backend.db_step(guard, KEY, "pay", pay_then_fail, (7,), SQLAlchemySteps(engine))
    assert payments(engine) == []
    assert backend.get_operation(KEY).steps == {}  # type: ignore[union-attr]


def test_a_stale_fence_refuses_the_step_and_writes_nothing(
    world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    backend, clock, engine = world
    guard = delivered(backend, resource="order:7")
    clock.advance(6)  # the 5 s lock expires and another owner takes it (a higher fence)
    assert backend.acquire_lock("order:7", "newer", 30.0) is not None
    ran: list[int] = []

    def pay_counted(session: Session, order_id: int) -> None:
        ran.append(order_id)
        session.add(Payment(order_id=order_id))

    with pytest.raises(StaleFenceError):
        backend.db_step(guard, KEY, "pay", pay_counted, (7,), SQLAlchemySteps(engine))
    assert ran == []
    assert payments(engine) == []


def test_a_lock_taken_over_while_the_step_runs_rolls_the_orm_write_back(
    pg_world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    """Another owner's lock commits while the ORM write is pending; the check after the step
    function sees the newer fence and the write is rolled back. (On SQLite the step holds the
    file's write lock, so no takeover can commit meanwhile.)"""
    backend, clock, engine = pg_world
    guard = delivered(backend, resource="order:7")

    def pay_while_taken_over(session: Session, order_id: int) -> None:
        session.add(Payment(order_id=order_id))
        session.flush()
        clock.advance(6)
        assert backend.acquire_lock("order:7", "newer", 30.0) is not None

    with pytest.raises(StaleFenceError):
        backend.db_step(guard, KEY, "pay", pay_while_taken_over, (7,), SQLAlchemySteps(engine))
    assert payments(engine) == []
    assert backend.get_operation(KEY).steps == {}  # type: ignore[union-attr]


def test_ctx_db_step_on_an_engine_through_a_worker(store_url: str) -> None:
    table = mapped_payments(store_url)
    engine = sa.create_engine(sqlalchemy_url(store_url))
    app = App(store_url)
    _ = app.backend
    table.create(engine)
    steps = SQLAlchemySteps(engine)

    @app.task(name="pay", operation_key="pay:{order_id}")
    def pay_task(ctx: Context, order_id: int) -> Any:
        return ctx.db_step("pay", pay, order_id, on=steps)

    @app.task(name="pay_async", operation_key="pay-async:{order_id}")
    async def pay_async(ctx: Context, order_id: int) -> Any:
        return await ctx.db_step_async("pay", pay, order_id, on=steps)

    try:
        app.tasks["pay"].enqueue(order_id=1)
        app.tasks["pay_async"].enqueue(order_id=2)
        assert drain(app)[JobStatus.COMPLETED] == 2
        assert payments(engine) == [1, 2]
    finally:
        sa.orm.clear_mappers()
        engine.dispose()
        app.close()


def test_only_an_engine_is_taken() -> None:
    with pytest.raises(ConfigurationError, match="Engine"):
        SQLAlchemySteps("sqlite:///x.db")  # type: ignore[arg-type]


def test_a_connection_lost_in_the_step_is_a_store_outage_and_writes_nothing(
    pg_world: tuple[Backend, ControlledClock, sa.Engine],
) -> None:
    """PostgreSQL cuts the step's connection after the ORM write: the handler sees jobguard's
    StoreUnavailableError (retried as an outage), never a driver's error, and nothing commits."""
    backend, _, engine = pg_world
    guard = delivered(backend)

    def pay_then_lose_the_connection(session: Session, order_id: int) -> int:
        session.add(Payment(order_id=order_id))
        session.flush()
        pid = session.connection().connection.driver_connection.info.backend_pid
        with engine.connect() as other:  # the server cuts the step's connection
            other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        return order_id

    with pytest.raises(StoreUnavailableError):
        backend.db_step(
            guard, KEY, "pay", pay_then_lose_the_connection, (7,), SQLAlchemySteps(engine)
        )
    assert payments(engine) == []
    assert backend.get_operation(KEY).steps == {}  # type: ignore[union-attr]

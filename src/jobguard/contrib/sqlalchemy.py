"""SQLAlchemy: ``ctx.db_step`` whose function writes through a SQLAlchemy session or connection.

Enqueueing in a SQLAlchemy transaction needs nothing from here: ``task.enqueue(...,
connection=session_or_connection)`` (``enqueue_async`` for ``AsyncSession``/``AsyncConnection``).
For a step::

    steps = SQLAlchemySteps(engine)          # an Engine on the store's database

    @app.task(operation_key="pay:{order_id}")
    def pay(ctx, order_id):
        ctx.db_step("mark-paid", mark_paid, order_id, on=steps)   # mark_paid(session, order_id)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jobguard.exceptions import ConfigurationError, StoreUnavailableError
from jobguard.steptx import StepCall

try:
    from sqlalchemy import Engine
    from sqlalchemy import exc as sa_errors
    from sqlalchemy.orm import Session
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "jobguard.contrib.sqlalchemy needs SQLAlchemy: pip install 'jobguard[sqlalchemy]'"
    ) from exc


def engine_url(store_url: str, *, asyncio: bool = False) -> str:
    """The SQLAlchemy URL of a jobguard store URL, so one setting names both.

    ``sqlite:///file.db`` gives pysqlite (aiosqlite with ``asyncio``); ``postgresql://...``
    gives psycopg (sync or async). jobguard's own ``?schema=`` option is dropped: it names
    where jobguard's tables are, not where the application's are.
    """
    base = store_url.split("?", 1)[0]
    if base.startswith("sqlite:///"):
        return base.replace("sqlite:", "sqlite+aiosqlite:", 1) if asyncio else base
    for scheme in ("postgresql://", "postgres://"):
        if base.startswith(scheme):
            return "postgresql+psycopg://" + base.removeprefix(scheme)
    raise ConfigurationError(
        f"a jobguard store URL is sqlite:///... or postgresql://..., not {store_url!r}"
    )


class SQLAlchemySteps:
    """``db_step`` transactions on a SQLAlchemy engine (pass as ``ctx.db_step(..., on=)``).

    Args:
        engine: An :class:`~sqlalchemy.Engine` on the store's database (psycopg on PostgreSQL,
            pysqlite on the store's SQLite file). An asyncio application gives a synchronous
            engine on the same database (``create_engine(engine_url(url))``):
            ``ctx.db_step_async`` runs the step on a thread, off the event loop.

    The step function gets an ORM :class:`~sqlalchemy.orm.Session` (Core statements run with
    ``session.execute(...)``). The session is bound to the step's transaction:
    ``session.commit()`` inside the step does not end it (SQLAlchemy's "conservative
    savepoint" joining), and its pending changes are flushed before the step record is
    written, so they commit together.
    """

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise ConfigurationError(
                f"SQLAlchemySteps takes a SQLAlchemy Engine, not {type(engine).__name__}"
            )
        if engine.dialect.name not in ("postgresql", "sqlite"):
            raise ConfigurationError(
                f"SQLAlchemySteps needs the store's PostgreSQL or SQLite database, not "
                f"{engine.dialect.name}"
            )
        self.engine = engine

    @contextmanager
    def transaction(self) -> Iterator[tuple[Any, StepCall]]:
        """A transaction on a pooled connection of the engine (see the protocol).

        The engine's own connection failures (connect, begin, commit) are raised as
        :class:`~jobguard.exceptions.StoreUnavailableError`, as the store's own are.
        """
        try:
            with self._transaction() as opened:
                yield opened
        except (sa_errors.OperationalError, sa_errors.InterfaceError) as error:
            raise StoreUnavailableError(f"the db_step transaction failed: {error}") from error

    @contextmanager
    def _transaction(self) -> Iterator[tuple[Any, StepCall]]:
        with self.engine.connect() as conn, conn.begin():
            if conn.dialect.name == "sqlite":
                # The step reads the guard and then writes: take the write lock first, or a
                # commit by another process in between would make the upgrade fail at once.
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            raw = conn.connection.driver_connection
            with Session(bind=conn) as session:
                yield raw, _in_session(session)


def _in_session(session: Session) -> StepCall:
    def call(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        value = fn(session, *args)
        session.flush()  # the ORM's writes reach the transaction before the step record
        return value

    return call

"""The kit's faults around a handler whose step writes through a SQLAlchemy session
(``db_step(on=SQLAlchemySteps(engine))``): guarded, it passes every fault, on both stores; the
dropped connection is the framework's own, cut by PostgreSQL's server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobguard import App, Context
from jobguard.contrib.sqlalchemy import SQLAlchemySteps, engine_url
from jobguard.faults import Faults
from jobguard.testing import TemporaryStore
from tests.support import pg

FAULTS = ("crash", "twice", "lease", "redeliver", "drop")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TemporaryStore]:
    where = "sqlite" if request.param == "sqlite" else pg.session_database()
    made = TemporaryStore.create(where, tmp_path)
    yield made
    made.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_guarded_sqlalchemy_handler_passes_every_fault(store: TemporaryStore, fault: str) -> None:
    engine = sa.create_engine(engine_url(store.url))
    payments = sa.Table(
        "payments",
        sa.MetaData(schema=store.schema),
        sa.Column("order_id", sa.Integer, nullable=False),
    )
    payments.create(engine)
    app = App(backend=store.backend)
    steps = SQLAlchemySteps(engine)

    def record(session: Session, order_id: int) -> int:
        session.execute(payments.insert().values(order_id=order_id))
        return order_id

    @app.task(name="pay", operation_key="pay:{order_id}", resource_key="order:{order_id}")
    def pay(ctx: Context, order_id: int) -> None:
        ctx.db_step("pay", record, order_id, on=steps)
        ctx.step("receipt", lambda: "sent")

    def effects() -> Any:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(payments)).scalar_one()

    faults = Faults(app, store.clock)
    try:
        if fault == "crash":
            faults.crash_after_step(pay, {"order_id": 7}, step=1, effects=effects)
        elif fault == "twice":
            faults.run_twice_concurrently(pay, {"order_id": 7}, effects=effects)
        elif fault == "lease":
            faults.lease_expires_mid_handler(pay, {"order_id": 7}, after_step=1, effects=effects)
        elif fault == "redeliver":
            faults.redeliver_after_completion(pay, {"order_id": 7}, effects=effects)
        else:
            faults.drop_connection_in_db_step(pay, {"order_id": 7}, step=1, effects=effects)
            [job] = app.jobs()
            assert job.attempts == 2  # the dropped step's transaction was retried
    finally:
        engine.dispose()
        app.close()


def test_an_app_on_another_store_is_refused(store: TemporaryStore, tmp_path: Path) -> None:
    """Its leases would never expire on the kit's clock: said at once, not as a timeout."""
    from jobguard.exceptions import ConfigurationError

    elsewhere = App(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        with pytest.raises(ConfigurationError, match=r"App\(backend=jobguard_store\.backend\)"):
            Faults(elsewhere, store.clock)
    finally:
        elsewhere.close()

"""A db_step proves its guard again as its step record is written, not only before its work.

On PostgreSQL another transaction can take a lock over while a step's function runs (this
holder's TTL ran out: the grant raises the fence). The step must then commit neither its record
nor its rows. On SQLite the step's write transaction excludes every other writer, so no grant can
happen in between; the same statement serves both stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobguard.backends.base import Backend
from jobguard.exceptions import StaleFenceError
from jobguard.testing import ControlledClock
from tests.contract.conftest import BACKENDS, business_table
from tests.contract.test_operation_port import deliver, locked, stored
from tests.support import pg
from tests.support.ports import begin_operation

KEY = "fulfill-order:42"
RESOURCE = "order:42"


@pytest.fixture
def pg_backend(tmp_path: Path, clock: ControlledClock) -> Iterator[Backend]:
    store = BACKENDS["postgres"](tmp_path, clock)
    yield store
    store.close()


def test_a_lock_taken_over_while_the_step_runs_refuses_the_step_and_rolls_its_rows_back(
    pg_backend: Backend, clock: ControlledClock
) -> None:
    backend = pg_backend
    invoices = business_table(backend, "invoices")
    guard = locked(backend, deliver(backend, visibility_timeout_s=60.0), RESOURCE, 5.0)
    assert begin_operation(backend, guard, KEY, RESOURCE) is not None

    def create_invoices(conn: Any) -> str:
        conn.execute(f"CREATE TABLE {invoices} (order_id INTEGER PRIMARY KEY)")
        return "created"

    backend.db_step(guard, KEY, "schema", create_invoices, ())
    taken: list[int] = []

    def invoice_while_the_lock_is_taken_over(conn: Any) -> str:
        conn.execute(f"INSERT INTO {invoices} (order_id) VALUES (42)")
        clock.advance(6.0)  # this holder's lock TTL runs out mid-step ...
        grant = backend.acquire_lock(RESOURCE, "another-worker", 30.0)  # ... and is granted
        assert grant is not None
        taken.append(grant.fence)
        return "invoiced"

    with pytest.raises(StaleFenceError):
        backend.db_step(guard, KEY, "invoice", invoice_while_the_lock_is_taken_over, ())
    assert guard.lock is not None
    assert taken == [guard.lock.fence + 1]
    assert "invoice" not in stored(backend, KEY).steps

    # The stale step's row rolled back with its refusal: no invoice in the business table.
    with psycopg.connect(pg.session_database()) as conn:
        assert conn.execute(f"SELECT count(*) FROM {invoices}").fetchone() == (0,)

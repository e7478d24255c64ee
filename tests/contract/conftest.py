"""The conformance suite runs every port test against every backend listed here (one place).

A backend is added by writing one factory below; every test in ``tests/contract/`` then runs
against it. Each test gets an isolated store and a :class:`ControlledClock` driving its time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobguard.backends.base import Backend
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.testing import ControlledClock
from tests.support import pg


def _sqlite(tmp_path: Path, clock: ControlledClock) -> Backend:
    return SQLiteBackend(str(tmp_path / "contract.db"), clock=clock)


def _postgres(tmp_path: Path, clock: ControlledClock) -> Backend:
    return PostgresBackend(pg.fresh_store_url(pg.session_database()), clock=clock)


BACKENDS: dict[str, Callable[[Path, ControlledClock], Backend]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}


@pytest.fixture
def clock() -> ControlledClock:
    """The store clock of the backend under test; advance it to expire leases and locks."""
    return ControlledClock()


@pytest.fixture(params=sorted(BACKENDS))
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ControlledClock
) -> Iterator[Backend]:
    """Each backend in :data:`BACKENDS`, fresh for each test."""
    store = BACKENDS[request.param](tmp_path, clock)
    yield store
    store.close()


def business_table(backend: Backend, name: str) -> str:
    """Where a test's own business table goes: beside the store, never shared between tests.

    A SQLite store is a file of its own; a PostgreSQL store is a schema of its own in the
    session's database, so the table is qualified with it.
    """
    schema = getattr(getattr(backend, "driver", None), "schema", None)
    return f'"{schema}".{name}' if schema else name

"""Fixtures of the end-to-end tests: an app on each backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App
from jobguard.backends import sqlite_path
from jobguard.backends.base import Backend
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.testing import ControlledClock

# 2026-03-29 00:59:00 UTC: one minute before Europe/Berlin springs forward (01:00 UTC).
SPRING = 1774745940.0


@pytest.fixture
def store_app(store_url: str) -> Iterator[App]:
    """An app on a fresh store of each backend (``store_url``)."""
    application = App(store_url)
    yield application
    application.close()


@pytest.fixture
def app(store_app: App) -> App:
    """The end-to-end tests' ``app``: on a fresh store of each backend, not only SQLite."""
    return store_app


@pytest.fixture
def clock() -> ControlledClock:
    """A store clock the test moves, from :data:`SPRING`."""
    return ControlledClock(SPRING)


@pytest.fixture
def timed_app(store_url: str, clock: ControlledClock) -> Iterator[App]:
    """An app on a fresh store of each backend whose clock the test moves."""
    if store_url.startswith("sqlite:"):
        backend: Backend = SQLiteBackend(sqlite_path(store_url), clock=clock)
    else:
        backend = PostgresBackend(store_url, clock=clock)
    application = App(backend=backend)
    yield application
    application.close()

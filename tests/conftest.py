"""Fixtures shared by every test: an isolated store per test, no JOBGUARD_* leaking in."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App

# The test kit's own tests run inner pytest sessions (pytester).
pytest_plugins = ["pytester"]


# Switches of the test run itself, not settings of jobguard: kept.
TEST_RUN_SWITCHES = {"JOBGUARD_UPDATE_SCREENSHOTS"}


@pytest.fixture(autouse=True)
def _scrub_jobguard_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("JOBGUARD_") and name not in TEST_RUN_SWITCHES:
            monkeypatch.delenv(name)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh SQLite file path in this test's temporary directory."""
    return tmp_path / "jobs.db"


BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store on each backend: a SQLite file, or a PostgreSQL schema of its own.

    Whatever the test kept beside it (event logs, pause markers) is removed afterwards.
    """
    from tests.support import pg, stores

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        url = pg.fresh_store_url(pg.session_database())
    yield url
    if request.param == "postgres":
        shutil.rmtree(stores.home_of(url), ignore_errors=True)


@pytest.fixture
def app(db_path: Path) -> Iterator[App]:
    """An app on a fresh SQLite store."""
    application = App(f"sqlite:///{db_path}")
    yield application
    application.close()


@pytest.fixture(scope="session", autouse=True)
def _postgres_session_database() -> Iterator[None]:
    """Drop the PostgreSQL database this session made (if any) when the session ends."""
    from tests.support import pg

    yield
    pg.drop_session_database()

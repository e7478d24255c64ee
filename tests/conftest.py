"""Fixtures shared by every test: an isolated store per test, no JOBGUARD_* leaking in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App


@pytest.fixture(autouse=True)
def _scrub_jobguard_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("JOBGUARD_"):
            monkeypatch.delenv(name)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh SQLite file path in this test's temporary directory."""
    return tmp_path / "jobs.db"


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

"""Fixtures of the end-to-end tests: an app on each backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App


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

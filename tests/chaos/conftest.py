"""Fixtures of the chaos tests: the app of the time-limit and cancel tests on each store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App
from tests.support import limits_app


@pytest.fixture
def lapp(store_url: str) -> Iterator[App]:
    """The app of ``tests.support.limits_app`` on a fresh store, opened (migrated)."""
    application = limits_app.make_app(store_url)
    _ = application.backend
    yield application
    application.close()

"""Fixtures of the end-to-end tests."""

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

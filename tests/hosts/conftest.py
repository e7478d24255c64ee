"""Fixtures of the host-queue tests: a Redis database of the test's own, flushed around it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redisdb import claimed_database


@pytest.fixture
def broker_url() -> Iterator[str]:
    """A Redis database no other running test uses, empty (the hosts' broker)."""
    with claimed_database() as url:
        yield url

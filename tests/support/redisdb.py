"""Redis for tests: a database of the test's own on the machine's real Redis, flushed around it.

Databases 0..15 exist on a default server; tests take turns on the upper ones, each claimed
with an expiring key in database 0, so parallel test sessions never share one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import redis

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
TEST_DBS = range(8, 16)
CLAIM_S = 900


@contextmanager
def claimed_database() -> Iterator[str]:
    """``redis://.../N`` on a database no other running test uses, empty."""
    admin = redis.Redis.from_url(f"{REDIS_URL}/0")
    token = f"{os.getpid()}"
    for db in TEST_DBS:
        if admin.set(f"jobguard-test-db:{db}", token, nx=True, ex=CLAIM_S):
            break
    else:
        admin.close()
        raise RuntimeError("every Redis database for tests is claimed by another test run")
    url = f"{REDIS_URL}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
        if admin.get(f"jobguard-test-db:{db}") == token.encode():
            admin.delete(f"jobguard-test-db:{db}")
        admin.close()

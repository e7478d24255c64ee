"""The dramatiq peer: a Redis broker, one actor inserting the benchmark's business row into
PostgreSQL (``JOBGUARD_BENCH_URL``). The Redis database is ``JOBGUARD_BENCH_REDIS``."""

from __future__ import annotations

import os
import threading
import time

import dramatiq
import psycopg
from dramatiq.brokers.redis import RedisBroker

from bench.pgdb import INSERT_EFFECT_PG

URL = os.environ.get("JOBGUARD_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JOBGUARD_BENCH_REDIS", "redis://127.0.0.1:6379/13")

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)
_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(URL, autocommit=True)
    return conn


@dramatiq.actor(queue_name="bench", max_retries=3)
def effect(n: int, t: float) -> None:
    """Insert the business row."""
    started = time.time()
    _connection().execute(INSERT_EFFECT_PG, (n, t, started, time.time()))

"""The dramatiq peer: a Redis broker, one actor inserting the benchmark's business row into
PostgreSQL (``JOBGUARD_BENCH_URL``). The Redis database is ``JOBGUARD_BENCH_REDIS``."""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.pgdb import insert_effect

URL = os.environ.get("JOBGUARD_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JOBGUARD_BENCH_REDIS", "redis://127.0.0.1:6379/13")

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=3)
def effect(n: int, t: float) -> None:
    """Insert the business row."""
    insert_effect(URL, n, t, time.time())

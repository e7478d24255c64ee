"""The host-queue bench's tasks: one row inserted into PostgreSQL per message, plain and guarded.

``JOBGUARD_BENCH_URL`` is the run's database (the effect table and the jobguard store's own
schema), ``JOBGUARD_BENCH_REDIS`` the broker. The guarded handlers write their row through
``ctx.db_step``, in the step's transaction.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
import redis
from celery import Celery
from dramatiq.brokers.redis import RedisBroker
from rq import Queue

import jobguard
from bench.pgdb import INSERT_EFFECT_PG, insert_effect
from jobguard.hosts.celery import CeleryGuard
from jobguard.hosts.dramatiq import DramatiqGuard
from jobguard.hosts.rq import RQGuard

URL = os.environ.get("JOBGUARD_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("JOBGUARD_BENCH_REDIS", "redis://127.0.0.1:6379/13")
STORE_URL = f"{URL}?schema=jobguard_bench"
INSERT_GUARDED = INSERT_EFFECT_PG.replace("bench_effects", "public.bench_effects")

store = jobguard.App(STORE_URL)
celery_app = Celery("bench", broker=REDIS_URL)
celery_app.conf.update(task_ignore_result=True, task_default_queue="bench")
broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)
rq_queue = Queue("bench", connection=redis.Redis.from_url(REDIS_URL))
celery_guard = CeleryGuard(celery_app, store)
dramatiq_guard = DramatiqGuard(broker, store)
rq_guard = RQGuard(store)
KEYS = {"operation_key": "bench:{n}"}


def write(conn: Any, n: int, enqueued_at: float, started_at: float) -> None:
    conn.execute(INSERT_GUARDED, (n, enqueued_at, started_at, time.time()))


def guarded(ctx: Any, n: int, t: float) -> None:
    ctx.db_step("effect", write, n, t, time.time())


def plain(n: int, t: float) -> None:
    insert_effect(URL, n, t, time.time())


@celery_app.task(name="bench.celery_plain", acks_late=True)
def celery_plain(n: int, t: float) -> None:
    """Plain Celery task."""
    plain(n, t)


@celery_guard.task(name="bench.celery_guarded", **KEYS)
def celery_guarded(ctx: Any, n: int, t: float) -> None:
    """Guarded Celery task."""
    guarded(ctx, n, t)


def rq_plain(n: int, t: float) -> None:
    """Plain RQ job."""
    plain(n, t)


@rq_guard.job(name="bench.rq_guarded", **KEYS)
def rq_guarded(ctx: Any, n: int, t: float) -> None:
    """Guarded RQ job."""
    guarded(ctx, n, t)


@dramatiq.actor(queue_name="bench", actor_name="bench.dramatiq_plain")
def dramatiq_plain(n: int, t: float) -> None:
    """Plain Dramatiq actor."""
    plain(n, t)


@dramatiq_guard.actor(name="bench.dramatiq_guarded", queue_name="bench", **KEYS)
def dramatiq_guarded(ctx: Any, n: int, t: float) -> None:
    """Guarded Dramatiq actor."""
    guarded(ctx, n, t)


def send(host: str, mode: str, n: int) -> None:
    """Send message ``n`` of ``host``'s ``mode`` (``plain`` or ``guarded``) task."""
    now = time.time()
    if host == "celery":
        (celery_plain if mode == "plain" else celery_guarded).delay(n=n, t=now)
    elif host == "rq":
        if mode == "plain":
            rq_queue.enqueue(rq_plain, n=n, t=now)
        else:
            rq_guarded.enqueue(rq_queue, n=n, t=now)
    else:
        (dramatiq_plain if mode == "plain" else dramatiq_guarded).send(n=n, t=now)

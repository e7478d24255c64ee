"""RQ jobs of the order workload, plain and guarded, as a careful user writes them.

Workers start with ``rq worker --with-scheduler``; the test sets the broker, the store and the
event log in the environment (:func:`tests.hosts.workload.worker_env`).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from rq import Queue

import jobguard
from jobguard.hosts.rq import RQGuard
from tests.hosts import workload

JOB_TIMEOUT_S = 120  # the queue's job timeout, which the guard records for the doctor

queue = Queue(
    "orders",
    connection=redis.Redis.from_url(os.environ["HOSTQ_BROKER"]),
    default_timeout=JOB_TIMEOUT_S,
)
store = jobguard.App(os.environ["HOSTQ_STORE"])
guard = RQGuard(store, replay_queue=queue)


def fulfil_plain(order_id: int) -> None:
    """The job as it is today."""
    workload.fulfil_plain(order_id)


@guard.job(**workload.GUARDED)
def fulfil(ctx: Any, order_id: int) -> None:
    """The same job, guarded."""
    workload.fulfil_guarded(ctx, order_id)


@guard.job(**workload.GUARDED_LIMITED)
def limited(ctx: Any, order_id: int) -> None:
    """A guarded job with a concurrency limit of one."""
    workload.fulfil_limited(ctx, order_id)


@guard.job(**workload.guarded_fragile())
def fragile(ctx: Any, order_id: int) -> None:
    """A guarded task that fails fatally until the warehouse is fixed."""
    workload.fulfil_fragile(ctx, order_id)

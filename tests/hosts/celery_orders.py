"""A Celery application as a careful user configures it, with the order task plain and guarded.

Workers start with ``celery -A tests.hosts.celery_orders worker``; the test sets the broker,
the store and the event log in the environment (:func:`tests.hosts.workload.worker_env`).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import jobguard
from jobguard.hosts.celery import CeleryGuard
from tests.hosts import workload

VISIBILITY_TIMEOUT_S = 2

celery_app = Celery("orders", broker=os.environ["HOSTQ_BROKER"])
celery_app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_default_queue="orders",
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        # Look for messages left unacked every second, as a user wanting fast recovery would.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


@celery_app.task(name="orders.fulfil_plain")
def fulfil_plain(order_id: int) -> None:
    """The task as it is today."""
    workload.fulfil_plain(order_id)


store = jobguard.App(os.environ["HOSTQ_STORE"])
guard = CeleryGuard(celery_app, store)


@guard.task(**workload.GUARDED)
def fulfil(ctx: Any, order_id: int) -> None:
    """The same task, guarded."""
    workload.fulfil_guarded(ctx, order_id)


@guard.task(**workload.GUARDED_LIMITED)
def limited(ctx: Any, order_id: int) -> None:
    """A guarded task with a concurrency limit of one."""
    workload.fulfil_limited(ctx, order_id)


@guard.task(**workload.guarded_fragile())
def fragile(ctx: Any, order_id: int) -> None:
    """A guarded task that fails fatally until the warehouse is fixed."""
    workload.fulfil_fragile(ctx, order_id)

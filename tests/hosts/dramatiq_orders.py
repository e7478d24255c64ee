"""Dramatiq actors of the order workload, plain and guarded, on a Redis broker.

Workers start with ``dramatiq tests.hosts.dramatiq_orders``; the test sets the broker, the store
and the event log in the environment (:func:`tests.hosts.workload.worker_env`).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import jobguard
from jobguard.hosts.dramatiq import DramatiqGuard
from tests.hosts import workload

broker = RedisBroker(
    url=os.environ["HOSTQ_BROKER"],
    # A killed worker's messages come back 2 s after its last heartbeat, looked for often.
    heartbeat_timeout=2000,
    maintenance_chance=100_000,
)
dramatiq.set_broker(broker)
TIME_LIMIT_MS = 60_000  # the order actor's time limit, which the guard records for the doctor
store = jobguard.App(os.environ["HOSTQ_STORE"])
guard = DramatiqGuard(broker, store)


@dramatiq.actor(broker=broker, queue_name="orders", actor_name="orders.fulfil_plain")
def fulfil_plain(order_id: int) -> None:
    """The actor as it is today."""
    workload.fulfil_plain(order_id)


@guard.actor(**workload.GUARDED, queue_name="orders", time_limit=TIME_LIMIT_MS)
def fulfil(ctx: Any, order_id: int) -> None:
    """The same actor, guarded."""
    workload.fulfil_guarded(ctx, order_id)


@guard.actor(**workload.GUARDED_LIMITED, queue_name="orders")
def limited(ctx: Any, order_id: int) -> None:
    """A guarded actor with a concurrency limit of one."""
    workload.fulfil_limited(ctx, order_id)


@guard.actor(**workload.guarded_fragile(), queue_name="orders")
def fragile(ctx: Any, order_id: int) -> None:
    """A guarded task that fails fatally until the warehouse is fixed."""
    workload.fulfil_fragile(ctx, order_id)

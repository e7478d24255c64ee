"""How each host's workers are started, sent an order and seen drained, for the host tests."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import redis
from rq import Retry

from tests.hosts.run import Host


def fresh(name: str) -> ModuleType:
    """The tasks module ``name`` made again from this test's environment (broker, store)."""
    module = sys.modules.get(name)
    if module is None:
        return importlib.import_module(name)
    module.guard.close()
    module.store.close()
    return importlib.reload(module)


def celery_host(broker_url: str, guarded: bool) -> Host:
    """Two prefork workers of ``tests.hosts.celery_orders`` (one process each runs tasks)."""
    celery_orders = fresh("tests.hosts.celery_orders")

    client = redis.Redis.from_url(broker_url)
    task = celery_orders.fulfil if guarded else celery_orders.fulfil_plain

    def drained() -> bool:
        return client.llen("orders") == 0 and client.hlen("unacked") == 0

    command = [
        *(sys.executable, "-m", "celery", "-A", "tests.hosts.celery_orders", "worker"),
        *("--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle"),
        *("--without-heartbeat", "--loglevel=INFO", "-Q", "orders"),
    ]
    return Host(
        "celery", command, "ready.", task.delay, drained,
        send_fragile=celery_orders.fragile.delay,
        send_limited=celery_orders.limited.delay,
        queued=lambda: client.llen("orders"),
        limit_s=celery_orders.VISIBILITY_TIMEOUT_S,
    )  # fmt: skip


def rq_host(broker_url: str, guarded: bool) -> Host:
    """Two forking RQ workers with their schedulers (a retry with an interval needs one)."""
    rq_orders = fresh("tests.hosts.rq_orders")

    client = redis.Redis.from_url(broker_url)

    def send(order_id: int) -> None:
        if guarded:
            rq_orders.fulfil.enqueue(rq_orders.queue, order_id)
        else:  # as a careful user does: RQ retries a job whose work-horse died
            rq_orders.queue.enqueue(rq_orders.fulfil_plain, order_id, retry=Retry(max=3))

    def drained() -> bool:
        queue = rq_orders.queue
        return (
            client.llen("rq:queue:orders") == 0
            and queue.started_job_registry.count == 0
            and queue.scheduled_job_registry.count == 0
        )

    # RQ's CLI with the jobs module imported first (RQ's way to preload libraries): each forked
    # work-horse inherits it instead of importing it, and its guard, again for every job.
    cli = "import tests.hosts.rq_orders; from rq.cli import main; main()"
    command = [sys.executable, "-c", cli, "worker", "--with-scheduler", "-u", broker_url, "orders"]
    return Host(
        "rq", command, "Listening on", send, drained,
        send_fragile=lambda order_id: rq_orders.fragile.enqueue(rq_orders.queue, order_id),
        send_limited=lambda order_id: rq_orders.limited.enqueue(rq_orders.queue, order_id),
        queued=lambda: client.llen("rq:queue:orders"),
        limit_s=rq_orders.JOB_TIMEOUT_S,
    )  # fmt: skip


def dramatiq_host(broker_url: str, guarded: bool) -> Host:
    """Two Dramatiq workers of one process and one thread each."""
    dramatiq_orders = fresh("tests.hosts.dramatiq_orders")

    client = redis.Redis.from_url(broker_url)
    actor = dramatiq_orders.fulfil if guarded else dramatiq_orders.fulfil_plain

    def drained() -> bool:
        # A message's body stays in its queue's .msgs hash until it is acked (delayed ones in
        # the delay queue's): nothing there, nothing pending.
        return client.hlen("dramatiq:orders.msgs") + client.hlen("dramatiq:orders.DQ.msgs") == 0

    command = [
        *(sys.executable, "-m", "dramatiq", "tests.hosts.dramatiq_orders"),
        *("--processes", "1", "--threads", "1", "--queues", "orders"),
    ]
    return Host(
        "dramatiq", command, "is ready for action", actor.send, drained,
        send_fragile=dramatiq_orders.fragile.send,
        send_limited=dramatiq_orders.limited.send,
        queued=lambda: client.hlen("dramatiq:orders.msgs"),
        limit_s=dramatiq_orders.TIME_LIMIT_MS / 1000,
    )  # fmt: skip


HOSTS = {"celery": celery_host, "rq": rq_host, "dramatiq": dramatiq_host}

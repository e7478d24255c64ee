"""Celery on Redis, configured carefully (acks_late, reject_on_worker_lost, 2 s visibility
timeout), runs the order workload with real workers, SIGKILLs and tasks longer than the
visibility timeout: plain, it cuts stock twice; guarded, never."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

from tests.hosts import workload
from tests.hosts.run import Host, run

pytestmark = pytest.mark.chaos


def celery_host(broker_url: str) -> Host:
    from tests.hosts import celery_orders

    client = redis.Redis.from_url(broker_url)

    def send_plain(order_id: int) -> None:
        celery_orders.fulfil_plain.delay(order_id)

    def drained() -> bool:
        return client.llen("orders") == 0 and client.hlen("unacked") == 0

    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.hosts.celery_orders",
        "worker",
        "--pool=prefork",
        "--concurrency=1",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=INFO",
        "-Q",
        "orders",
    ]
    return Host("celery", command, "ready.", send_plain, drained)


def test_plain_celery_task_cuts_stock_twice_under_redelivery_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = workload.Plan.make(orders=20, slow_every=5)
    env = workload.worker_env(store_url, tmp_path / "events.log", broker_url, plan.slow_every)
    for name in ("HOSTQ_STORE", "HOSTQ_LOG", "HOSTQ_BROKER", "HOSTQ_SLOW_EVERY"):
        monkeypatch.setenv(name, env[name])
    workload.create_tables(store_url)
    host = celery_host(broker_url)

    def every_order_invoiced() -> bool:
        return len(workload.effect_counts(store_url, workload.INVOICES)) == plan.orders

    outcome = run(
        host,
        store_url=store_url,
        tmp=tmp_path,
        env=env,
        plan=plan,
        workers=2,
        kills=3,
        done=every_order_invoiced,
        timeout_s=90,
    )
    print(outcome)
    assert outcome.finished
    assert outcome.kills == 3
    assert outcome.duplicated
    assert outcome.overlapping

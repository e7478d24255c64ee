"""Celery on Redis, configured carefully (acks_late, reject_on_worker_lost, 2 s visibility
timeout), runs the order workload with real prefork workers, SIGKILLs of the processes running
handlers and tasks longer than the visibility timeout: plain, it cuts stock twice and runs
orders in overlapping executions; guarded, never, and every order completes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

from tests.hosts import workload
from tests.hosts.run import Host, Outcome, run

pytestmark = pytest.mark.chaos

PLAN = workload.Plan.make(orders=20, slow_every=5)
KILLS = 3


def celery_host(broker_url: str, *, guarded: bool) -> Host:
    """Two prefork workers of ``tests.hosts.celery_orders`` (one process each runs tasks)."""
    from tests.hosts import celery_orders

    client = redis.Redis.from_url(broker_url)
    task = celery_orders.fulfil if guarded else celery_orders.fulfil_plain

    def drained() -> bool:
        return client.llen("orders") == 0 and client.hlen("unacked") == 0

    command = [
        *(sys.executable, "-m", "celery", "-A", "tests.hosts.celery_orders", "worker"),
        *("--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle"),
        *("--without-heartbeat", "--loglevel=INFO", "-Q", "orders"),
    ]
    return Host("celery", command, "ready.", task.delay, drained)


def run_orders(
    store_url: str, broker_url: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, guarded: bool
) -> Outcome:
    """The workload of :data:`PLAN` with :data:`KILLS` SIGKILLs, until it settled."""
    env = workload.worker_env(store_url, tmp / "events.log", broker_url, PLAN.slow_every)
    for name in ("HOSTQ_STORE", "HOSTQ_LOG", "HOSTQ_BROKER", "HOSTQ_SLOW_EVERY"):
        monkeypatch.setenv(name, env[name])  # the producer imports the same module
    workload.create_tables(store_url)
    host = celery_host(broker_url, guarded=guarded)

    def settled() -> bool:
        if not guarded:
            return len(workload.effect_counts(store_url, workload.INVOICES)) == PLAN.orders
        return workload.every_order_settled(store_url, "orders.fulfil", PLAN.orders) and (
            host.drained()
        )

    outcome = run(
        host, store_url=store_url, tmp=tmp, env=env, plan=PLAN, workers=2, kills=KILLS,
        done=settled, timeout_s=120,
    )  # fmt: skip
    print(outcome)
    assert outcome.finished
    assert outcome.kills == KILLS
    return outcome


def test_plain_celery_task_cuts_stock_twice_under_redelivery_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(store_url, broker_url, tmp_path, monkeypatch, guarded=False)
    assert outcome.duplicated
    assert outcome.overlapping


def test_guarded_celery_task_cuts_stock_once_under_redelivery_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(store_url, broker_url, tmp_path, monkeypatch, guarded=True)
    assert outcome.duplicated == set()
    assert outcome.overlapping == set()
    # Each kill costs an order one attempt, far from its max_attempts: every order completes.
    assert workload.dead_orders(store_url, "orders.fulfil") == set()
    assert len(workload.effect_counts(store_url, workload.INVOICES)) == PLAN.orders

"""RQ 2.x on Redis runs the order workload with real forking workers, SIGKILLs of the
work-horses running handlers, and each order sent 1-3 times: plain, it cuts stock twice and
runs orders in overlapping executions; guarded, never, and every order completes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis
from rq import Retry

from tests.hosts import workload
from tests.hosts.run import Host, assert_guarded, run_orders

pytestmark = pytest.mark.chaos

PLAN = workload.Plan.make(orders=20, slow_every=5)
KILLS = 3


def rq_host(broker_url: str, guarded: bool) -> Host:
    """Two forking RQ workers with their schedulers (a retry with an interval needs one)."""
    from tests.hosts import rq_orders

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

    rq = str(Path(sys.executable).with_name("rq"))
    command = [rq, "worker", "--with-scheduler", "-u", broker_url, "orders"]
    return Host("rq", command, "Listening on", send, drained)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_plain_rq_job_cuts_stock_twice_under_duplicates_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        rq_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=False,
    )  # fmt: skip
    # An order sent twice is fulfilled twice: the guarded run's zero can fail.
    assert outcome.duplicated


def test_guarded_rq_job_cuts_stock_once_under_duplicates_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        rq_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=True,
    )  # fmt: skip
    assert_guarded(outcome, store_url, PLAN)

"""Dramatiq 2.x on Redis runs the order workload with real worker processes, SIGKILLs of the
processes running handlers (Dramatiq then stops the whole worker; the test starts it again),
and each order sent 1-3 times: plain, it cuts stock twice; guarded, never, and every order
completes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

from tests.hosts import workload
from tests.hosts.run import Host, assert_guarded, run_orders

pytestmark = pytest.mark.chaos

PLAN = workload.Plan.make(orders=20, slow_every=5)
KILLS = 3


def dramatiq_host(broker_url: str, guarded: bool) -> Host:
    """Two Dramatiq workers of one process and one thread each."""
    from tests.hosts import dramatiq_orders

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
    return Host("dramatiq", command, "is ready for action", actor.send, drained)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_plain_dramatiq_actor_cuts_stock_twice_under_duplicates_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        dramatiq_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=False,
    )  # fmt: skip
    # An order sent twice is fulfilled twice: the guarded run's zero can fail.
    assert outcome.duplicated


def test_guarded_dramatiq_actor_cuts_stock_once_under_duplicates_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        dramatiq_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=True,
    )  # fmt: skip
    assert_guarded(outcome, store_url, PLAN)

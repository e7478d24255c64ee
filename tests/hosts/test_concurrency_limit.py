"""A guarded host task with a concurrency limit: its runs never overlap beyond the limit,
however many of the host's workers take its messages; a delivery that finds the limit reached
is handed back to the host uncharged and runs later (every host, its real workers)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from jobguard.models import Outcome
from tests.hosts import workload
from tests.hosts.hosts import HOSTS
from tests.hosts.run import attempts_of, start_worker, stop_workers, use_env
from tests.support.procs import wait_until

ORDERS = range(1, 5)


@pytest.mark.parametrize(
    ("host_name", "store_url"),
    [("celery", "postgres"), ("rq", "sqlite"), ("dramatiq", "postgres")],
    indirect=["store_url"],
)
def test_a_concurrency_limit_of_one_runs_a_guarded_tasks_orders_one_at_a_time(
    host_name: str, store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_env(store_url, broker_url, tmp_path, monkeypatch)
    workload.create_tables(store_url)
    host = HOSTS[host_name](broker_url, True)
    # Two workers, each running one task at a time: without the limit, two orders at once.
    workers = [start_worker(host, env, tmp_path / f"worker-{n}.out") for n in range(2)]
    try:
        for order in ORDERS:
            host.send_limited(order)
        wait_until(
            lambda: (
                workload.every_order_settled(store_url, workload.LIMITED, len(ORDERS))
                and host.drained()
            ),
            timeout_s=120,
            interval_s=0.1,
        )
    finally:
        stop_workers(workers)

    assert workload.effect_counts(store_url, workload.CUTS) == Counter(dict.fromkeys(ORDERS, 1))
    assert workload.dead_orders(store_url, workload.LIMITED) == set()
    runs = sorted(workload.handler_runs(tmp_path / "events.log"), key=lambda run: run.started)
    assert sorted(run.order for run in runs) == list(ORDERS)
    assert all(run.how == "ended" for run in runs)
    assert [(a.order, b.order) for a, b in itertools.pairwise(runs) if b.started < a.ended] == []
    # The limit did turn deliveries away: they waited, uncharged, for the slot.
    attempts = attempts_of(store_url)
    assert any(a.outcome == Outcome.DEFERRED for a in attempts)
    assert Counter(a.outcome for a in attempts)[Outcome.COMPLETED] == len(ORDERS)

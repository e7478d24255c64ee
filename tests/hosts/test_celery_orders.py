"""Celery on Redis, configured carefully (acks_late, reject_on_worker_lost, 2 s visibility
timeout), runs the order workload with real prefork workers, SIGKILLs of the processes running
handlers and tasks longer than the visibility timeout: plain, it cuts stock twice and runs
orders in overlapping executions; guarded, never, and every order completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts import workload
from tests.hosts.hosts import celery_host
from tests.hosts.run import assert_guarded, run_orders

PLAN, KILLS = workload.size()

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(workload.case_timeout_s(PLAN))]


@pytest.mark.parametrize("store_url", workload.plain_stores(), indirect=True)
def test_plain_celery_task_cuts_stock_twice_under_redelivery_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        celery_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=False,
    )  # fmt: skip
    # An order sent twice is fulfilled twice: the guarded run's zero can fail.
    assert outcome.duplicated


def test_guarded_celery_task_cuts_stock_once_under_redelivery_and_kills(
    store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_orders(
        celery_host, store_url=store_url, broker_url=broker_url, tmp=tmp_path,
        monkeypatch=monkeypatch, plan=PLAN, kills=KILLS, guarded=True,
    )  # fmt: skip
    assert_guarded(outcome, store_url, PLAN)

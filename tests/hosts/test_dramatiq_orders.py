"""Dramatiq 2.x on Redis runs the order workload with real worker processes, SIGKILLs of the
processes running handlers (Dramatiq then stops the whole worker; the test starts it again),
and each order sent 1-3 times: plain, it cuts stock twice; guarded, never, and every order
completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts import workload
from tests.hosts.hosts import dramatiq_host
from tests.hosts.run import assert_guarded, run_orders

PLAN, KILLS = workload.size()

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(workload.case_timeout_s(PLAN))]


@pytest.mark.parametrize("store_url", workload.plain_stores(), indirect=True)
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

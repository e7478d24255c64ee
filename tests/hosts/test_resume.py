"""A guarded task that is in flight nowhere, whose worker died holding its lock after its first
step, continues from that step once the lock's TTL has passed: the stock is cut once, never
again from the start (acceptance 2 of the host integrations)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from jobguard.models import Outcome
from tests.hosts import workload
from tests.hosts.hosts import HOSTS
from tests.hosts.run import attempts_of, start_worker, stop_workers, use_env
from tests.support.procs import wait_until

pytestmark = pytest.mark.chaos

ORDER = 7


@pytest.mark.parametrize(
    ("host_name", "store_url"),
    [("celery", "postgres"), ("rq", "sqlite"), ("dramatiq", "postgres")],
    indirect=["store_url"],
)
def test_task_whose_lock_owner_died_continues_from_its_last_step_after_the_lock_ttl(
    host_name: str, store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_env(store_url, broker_url, tmp_path, monkeypatch, slow_every=1)
    workload.create_tables(store_url)
    host = HOSTS[host_name](broker_url, True)
    first = start_worker(host, env, tmp_path / "first.out")
    host.send(ORDER)
    wait_until(lambda: workload.effect_counts(store_url, workload.CUTS)[ORDER] == 1, 60, 0.1)
    # The whole worker dies mid-task, and the broker forgets the message: in flight nowhere.
    for pid in workload.running_pids(tmp_path / "events.log"):  # RQ's work-horse: its own session
        os.kill(pid, signal.SIGKILL)
    os.killpg(first[0].pid, signal.SIGKILL)
    first[0].wait(timeout=30)
    redis.Redis.from_url(broker_url).flushdb()
    key = "fulfil-order:7"
    (killed,) = attempts_of(store_url, key)
    assert killed.outcome == Outcome.RUNNING
    assert killed.fence is not None

    second = start_worker(host, env, tmp_path / "second.out")
    try:
        host.send(ORDER)  # sent again, as the shop's webhook would
        wait_until(
            lambda: workload.every_order_settled(store_url, workload.TASK, 1) and host.drained(),
            60,
            0.1,
        )
    finally:
        stop_workers([first, second])

    assert workload.effect_counts(store_url, workload.CUTS)[ORDER] == 1
    assert workload.effect_counts(store_url, workload.INVOICES)[ORDER] == 1
    attempts = attempts_of(store_url, key)
    assert attempts[0].outcome == Outcome.LOST  # taken over once its lease expired
    (final,) = [a for a in attempts if a.outcome == Outcome.COMPLETED]
    assert (final.steps_skipped, final.steps_run) == (1, 1)  # from step 2, not the start
    # A new grant of the lock: only once the dead owner's TTL had passed (it was granted when
    # the killed delivery started, and renewed until the kill).
    assert final.fence is not None
    assert final.fence > killed.fence
    assert final.started_at >= killed.started_at + workload.GUARDED["lock_ttl_s"]
    assert all(a.host_delivery and a.host_delivery.startswith(f"{host_name}:") for a in attempts)

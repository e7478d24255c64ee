"""Producer-side dedup of a guarded host task (racing producers send one message; a producer
killed between its reservation and its send holds the key only until ``dedup_unsent_s``), and
a job buried in jobguard's dead letter queue sent back through the host by ``jobguard dlq
replay``."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from jobguard.models import JobStatus, Outcome
from tests.hosts import workload
from tests.hosts.hosts import HOSTS
from tests.hosts.run import start_worker, stop_workers, use_env
from tests.support import stores
from tests.support.procs import REPO_ROOT, entry_point

pytestmark = pytest.mark.chaos

MODULES = {
    "celery": "tests.hosts.celery_orders",
    "rq": "tests.hosts.rq_orders",
    "dramatiq": "tests.hosts.dramatiq_orders",
}
PRODUCERS = 8


@pytest.mark.parametrize("host_name", sorted(HOSTS))
def test_racing_producers_of_one_operation_send_one_message(
    host_name: str, store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_env(store_url, broker_url, tmp_path, monkeypatch)
    host = HOSTS[host_name](broker_url, True)
    start = threading.Barrier(PRODUCERS)
    errors: list[BaseException] = []

    def produce() -> None:
        start.wait()
        try:
            host.send_fragile(11)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce) for _ in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert host.queued() == 1
    host.send_fragile(12)  # another operation is not held back
    assert host.queued() == 2


def wait_for_store_time(store_url: str, at: float) -> None:
    """Until the store's clock (which decides the reservation's age) reads ``at`` or later."""
    backend = stores.open_backend(store_url)
    try:
        while backend.now() < at:
            time.sleep(0.1)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("host_name", "store_url"),
    [("celery", "sqlite"), ("rq", "postgres"), ("dramatiq", "sqlite")],
    indirect=["store_url"],
)
def test_a_producer_killed_before_sending_holds_the_dedup_key_only_until_dedup_unsent_s(
    host_name: str, store_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_env(store_url, broker_url, tmp_path, monkeypatch)
    workload.create_tables(store_url)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.hosts.killed_producer", host_name, "31"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    jobs = stores.table(store_url, "jobs")
    ((job_id, status, due),) = stores.query(
        store_url,
        f"SELECT id, status, available_at FROM {jobs} WHERE task = ?",
        (workload.FRAGILE,),
    )
    assert status == "queued"  # reserved, and the broker never heard of it
    host = HOSTS[host_name](broker_url, True)
    assert host.queued() == 0
    host.send_fragile(31)  # dedup_unsent_s=300: its message may still be on its way
    assert host.queued() == 0

    monkeypatch.setenv("HOSTQ_UNSENT_S", "1")
    wait_for_store_time(store_url, due + 1)
    host = HOSTS[host_name](broker_url, True)  # the tasks module again, with dedup_unsent_s=1
    host.send_fragile(31)  # nothing delivered it for 1 s: the key freed itself
    assert host.queued() == 1
    host.send_fragile(31)  # and the new message holds it again
    assert host.queued() == 1

    workload.warehouse_fixed().touch()
    worker = start_worker(host, env, tmp_path / "worker.out")
    try:
        wait = time.monotonic() + 60
        while stores.query(store_url, f"SELECT status FROM {jobs} WHERE id = ?", (job_id,)) != [
            ("completed",)
        ]:
            assert time.monotonic() < wait, "the resent task did not complete"
            time.sleep(0.2)
    finally:
        stop_workers([worker])
    assert stores.query(store_url, f"SELECT count(*) FROM {jobs}") == [(1,)]
    assert workload.effect_counts(store_url, workload.INVOICES)[31] == 1


def dlq_replay(store_url: str, env: dict[str, str], module: str, selection: list[str]) -> None:
    done = subprocess.run(
        [*entry_point(), "--app", f"{module}:store", "dlq", "replay", *selection],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["one", "bulk"])
@pytest.mark.parametrize("host_name", sorted(HOSTS))
def test_a_buried_task_replayed_from_the_dlq_goes_back_through_the_host_and_completes(
    host_name: str, how: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By its id, or in bulk by task (#17): the replayed job is sent to its host again."""
    store_url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = use_env(store_url, broker_url, tmp_path, monkeypatch)
    workload.create_tables(store_url)
    host = HOSTS[host_name](broker_url, True)
    worker = start_worker(host, env, tmp_path / "worker.out")
    try:
        host.send_fragile(21)
        wait = time.monotonic() + 60
        dead: list[tuple[int, str]] = []
        while not dead and time.monotonic() < wait:
            time.sleep(0.2)
            dead = stores.query(
                store_url, "SELECT id, status FROM jobs WHERE task = ? AND status = 'dead'",
                (workload.FRAGILE,),
            )  # fmt: skip
        assert dead, "the fatal task was not buried"
        job_id = dead[0][0]
        workload.warehouse_fixed().touch()
        selection = [str(job_id)] if how == "one" else ["--task", workload.FRAGILE, "--yes"]
        dlq_replay(store_url, env, MODULES[host_name], selection)
        backend = stores.open_backend(store_url)
        try:
            while backend.get_job(job_id).status != JobStatus.COMPLETED:
                assert time.monotonic() < wait + 60, "the replayed task did not complete"
                time.sleep(0.2)
            attempts = backend.attempts(job_id=job_id)
        finally:
            backend.close()
    finally:
        stop_workers([worker])
    assert [a.outcome for a in attempts] == [Outcome.DEAD, Outcome.COMPLETED]
    assert (attempts[-1].steps_skipped, attempts[-1].steps_run) == (1, 1)  # stock cut once
    assert workload.effect_counts(store_url, workload.CUTS)[21] == 1
    assert redis.Redis.from_url(broker_url).ping()

"""``jobguard doctor`` and ``app.diagnose()`` against a real store and real workers (G10.2-G10.5).

The overlap tests make the failure the doctor exists to find: two in-process workers with the
heartbeat switched off (``Worker(heartbeat=False)``, which exists to show this) and a visibility
timeout shorter than the job. The first delivery waits until the second one has started, so the
overlap happens exactly once and at a known place, with no timing assumption beyond the 1 s
lease expiring. Exit codes: 1 for a problem (overlap, timeout below the longest run), 0
otherwise, 2 for bad options, 3 for a missing store.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from jobguard import App, ConfigurationError, Context, Job, JobStatus, Outcome
from jobguard.testing import ControlledClock, drain
from jobguard.worker import Worker
from tests.support import stores
from tests.support.procs import wait_until

REFUSED = {Outcome.LEASE_REFUSED, Outcome.FENCE_REFUSED}


def doctor(url: str, *args: str) -> Result:
    """``jobguard --url URL doctor ARGS`` in-process."""
    from jobguard.cli.main import cli

    return CliRunner().invoke(cli, ["--url", url, "doctor", *args])


def doctor_json(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    result = doctor(url, "--json", *args)
    return result.exit_code, json.loads(result.output)


def run_stalled_overlap(app: App, job: Job) -> None:
    """Run ``job`` on two heartbeat-less workers until its first delivery was refused.

    The task's handler must make delivery 1 wait for ``second_started`` (set by delivery 2).
    """
    workers = [
        Worker(
            app,
            worker_id=name,
            heartbeat=False,
            concurrency=1,
            prefetch=0,
            install_signal_handlers=False,
        )
        for name in ("w1", "w2")
    ]
    threads = [threading.Thread(target=w.run, name=f"doctor-{w.worker_id}") for w in workers]
    threads[0].start()
    wait_until(lambda: bool(app.attempts(job_id=job.id)))  # w1 holds delivery 1
    threads[1].start()
    try:
        wait_until(
            lambda: (
                app.get_job(job.id).status == JobStatus.COMPLETED
                and app.attempts(job_id=job.id)[0].outcome in REFUSED
            ),
            timeout_s=15,
        )
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(timeout=10)


@pytest.fixture
def url(store_url: str) -> str:
    """A fresh store on each backend."""
    return store_url


@pytest.fixture
def stalled_app(url: str) -> Iterator[tuple[App, threading.Event]]:
    """An app whose tasks' first delivery blocks until a second delivery has started."""
    app = App(url)
    yield app, threading.Event()
    app.close()


def test_doctor_finds_exactly_the_overlap_of_a_stalled_delivery_and_advises_the_timeout(
    stalled_app: tuple[App, threading.Event], url: str
) -> None:
    """G10.2: one operation run by two workers at once is found, once, with both workers, lease
    tokens and fences, and its cause: the lease was shorter than the job. "No resource lock" is
    not offered: a lock renewed with that lease would have expired with it.
    G10.3: the 1 s visibility timeout is below the longest run, so the doctor advises raising it
    and exits 1."""
    app, second_started = stalled_app

    @app.task(name="sync", operation_key="sync:{n}", visibility_timeout_s=1.0)
    def sync(ctx: Context, n: int) -> None:
        if ctx.attempt == 1:
            assert second_started.wait(10)
            time.sleep(0.2)  # still running after the second delivery finished
        else:
            second_started.set()

    job = sync.enqueue(n=1)
    run_stalled_overlap(app, job)
    stale, fresh = app.attempts(job_id=job.id)
    assert (stale.worker_id, stale.outcome) == ("w1", Outcome.LEASE_REFUSED)
    assert (fresh.worker_id, fresh.outcome) == ("w2", Outcome.COMPLETED)

    code, report = doctor_json(url)

    assert code == 1
    [overlap] = report["overlaps"]
    assert (overlap["key"], overlap["operation_key"]) == ("sync:1", "sync:1")
    first, second = overlap["first"], overlap["second"]
    assert (first["attempt_id"], second["attempt_id"]) == (stale.id, fresh.id)
    assert (first["worker_id"], second["worker_id"]) == ("w1", "w2")
    assert (first["lease_token"], second["lease_token"]) == (stale.lease_token, fresh.lease_token)
    assert first["fence"] is None  # no resource lock, no fence
    assert second["fence"] is None
    assert (first["outcome"], second["outcome"]) == ("lease_refused", "completed")
    # The stale run ended after the fresh one (it slept on), so the overlap is the fresh run.
    assert stale.duration_s is not None
    assert fresh.ended_at is not None
    assert stale.started_at + stale.duration_s > fresh.ended_at
    assert fresh.duration_s is not None
    fresh_end = max(fresh.ended_at, fresh.started_at + fresh.duration_s)
    assert overlap["overlap_s"] == pytest.approx(fresh_end - fresh.started_at)
    assert overlap["causes"][0].startswith("lease shorter than the job")
    assert not any(cause.startswith("no resource lock") for cause in overlap["causes"])

    [durations] = report["durations"]
    assert durations["task"] == "sync"
    assert durations["runs"] == 2
    assert durations["max_s"] == pytest.approx(stale.duration_s)
    assert durations["visibility_timeout_s"] == 1.0
    [advice] = durations["advice"]
    assert (advice["severity"], advice["setting"]) == ("problem", "visibility_timeout_s")
    assert advice["recommended_s"] > stale.duration_s
    assert (
        f"raise visibility_timeout_s to at least {advice['recommended_s']:g}" in (advice["message"])
    )
    assert len(report["problems"]) == 2
    assert report["audit"]["operations_completed"] == 1
    assert report["audit"]["missing_records"] == []

    human = doctor(url)
    assert human.exit_code == 1
    assert "sync:1: two deliveries ran at once" in human.output
    assert stale.lease_token in human.output
    assert fresh.lease_token in human.output
    assert "likely cause: lease shorter than the job" in human.output
    assert "doctor: 2 problem(s) to fix" in human.output


def test_doctor_names_a_lock_ttl_shorter_than_the_job_with_both_fences(
    stalled_app: tuple[App, threading.Event], url: str
) -> None:
    """G10.2, G3.5: with a resource lock whose TTL is shorter than the job, the lock was granted
    again while the first delivery ran: the overlap names the lock TTL and fences 1 then 2, and
    G10.3 flags the lock TTL as well as the visibility timeout."""
    app, second_started = stalled_app

    @app.task(
        name="ship",
        operation_key="ship:{n}",
        resource_key="order:{n}",
        visibility_timeout_s=1.0,
        lock_ttl_s=1.0,
    )
    def ship(ctx: Context, n: int) -> None:
        if ctx.attempt == 1:
            assert second_started.wait(10)
            time.sleep(0.2)
        else:
            second_started.set()

    job = ship.enqueue(n=7)
    run_stalled_overlap(app, job)
    ran = [a for a in app.attempts(job_id=job.id) if a.outcome != Outcome.DEFERRED]
    stale, fresh = ran
    assert stale.outcome in REFUSED
    assert fresh.outcome == Outcome.COMPLETED
    assert (stale.fence, fresh.fence) == (1, 2)

    code, report = doctor_json(url)

    assert code == 1
    [overlap] = report["overlaps"]
    assert (overlap["first"]["attempt_id"], overlap["second"]["attempt_id"]) == (
        stale.id,
        fresh.id,
    )
    assert (overlap["first"]["fence"], overlap["second"]["fence"]) == (1, 2)
    causes = overlap["causes"]
    assert causes[0].startswith("lease shorter than the job")
    assert causes[1].startswith("lock TTL shorter than the job: lock_ttl_s=1 on 'order:7'")
    assert "fence 1 then 2" in causes[1]
    [durations] = report["durations"]
    assert durations["lock_ttl_s"] == 1.0
    assert {(a["severity"], a["setting"]) for a in durations["advice"]} == {
        ("problem", "visibility_timeout_s"),
        ("problem", "lock_ttl_s"),
    }


def test_doctor_on_a_healthy_store_reports_nothing_and_exits_0(url: str) -> None:
    """G10.2-G10.5 clean run: jobs that completed once each, well inside their timeouts, with
    their operation records: no overlap, no advice, no warning, exit 0."""
    app = App(url)

    @app.task(name="mail", operation_key="mail:{n}", resource_key="inbox:{n}")
    def mail(ctx: Context, n: int) -> None:
        ctx.set_external_ref(f"msg-{n}")

    try:
        mail.enqueue_many([{"n": n} for n in range(5)])
        assert drain(app)[JobStatus.COMPLETED] == 5
        diagnosis = app.diagnose()
    finally:
        app.close()
    assert diagnosis.problems == diagnosis.warnings == []
    assert diagnosis.attempts == 5

    code, report = doctor_json(url)

    assert code == 0
    assert report["problems"] == report["warnings"] == []
    assert report["overlaps"] == report["errors"] == []
    [durations] = report["durations"]
    assert (durations["task"], durations["runs"], durations["advice"]) == ("mail", 5, [])
    assert (durations["visibility_timeout_s"], durations["lock_ttl_s"]) == (30.0, 30.0)
    [retries] = report["retries"]
    assert (retries["runs"], retries["retries"], retries["spike"]) == (5, 0, False)
    audit = report["audit"]
    assert (audit["completed_jobs_with_key"], audit["operations_completed"]) == (5, 5)
    assert (audit["with_external_ref"], audit["without_external_ref"]) == (5, 0)
    assert audit["missing_records"] == audit["stuck_processing"] == []

    human = doctor(url)
    assert human.exit_code == 0
    assert "none: no operation ran on two deliveries at the same time" in human.output
    assert "every timeout leaves room above the slowest runs" in human.output
    assert "no error repeated" in human.output
    assert "no job has a concurrency limit" in human.output
    assert "doctor: no problems found" in human.output
    assert "warning" not in human.output


def test_doctor_shows_how_long_jobs_waited_for_the_slots_of_a_concurrency_key(url: str) -> None:
    """Three jobs of one concurrency key with a limit of one, on a worker with three threads:
    two find the slot held and wait for it, uncharged; the doctor counts those slot-busy
    deferrals per key and task, with the key's limit, and finds no problem in them."""
    app = App(url)

    @app.task(name="dock", concurrency_key="dock:{site}", concurrency_limit=1, backoff_base_s=0.05)
    def dock(ctx: Context, site: str, n: int) -> None:
        time.sleep(0.2)

    try:
        dock.enqueue_many([{"site": "north", "n": n} for n in range(3)])
        assert drain(app, concurrency=3)[JobStatus.COMPLETED] == 3
    finally:
        app.close()

    code, report = doctor_json(url)

    assert code == 0
    assert report["problems"] == []
    [use] = report["slots"]
    assert (use["concurrency_key"], use["limit"], use["task"], use["jobs"]) == (
        "dock:north",
        1,
        "dock",
        3,
    )
    assert use["deferrals"] >= 2
    assert use["wait_s"] > 0
    assert use["longest_holder"] == "dock"
    human = doctor(url)
    assert "Concurrency limits" in human.output
    assert "dock:north" in human.output


def test_doctor_reports_poison_and_a_retry_spike_as_warnings_with_exit_0(url: str) -> None:
    """G10.4: a task failing with the same stack trace again and again shows a retry spike and
    one repeating error with its count, jobs and example ids, marked as a poison candidate; these
    are warnings, so the exit code stays 0."""
    app = App(url)

    @app.task(name="import", backoff_base_s=0, max_attempts=5, poison_threshold=3)
    def import_feed(ctx: Context, n: int) -> None:
        if n == 1:  # one job's own bug: it stands out from the task's other jobs
            raise KeyError(f"feed {n} has no 'items'")

    try:
        jobs = import_feed.enqueue_many([{"n": n} for n in (1, 2, 3, 4)])
        assert drain(app)[JobStatus.DEAD] == 1
    finally:
        app.close()

    code, report = doctor_json(url)

    assert code == 0
    assert report["problems"] == []
    [retries] = report["retries"]
    assert (retries["runs"], retries["retries"], retries["dead"]) == (6, 2, 1)
    assert retries["spike"] is True
    [error] = report["errors"]
    assert (error["task"], error["error_type"], error["attempts"], error["jobs"]) == (
        "import",
        "KeyError",
        3,
        1,
    )
    assert error["job_ids"] == [jobs[0].id]
    assert (error["max_per_job"], error["poison"], error["dead"]) == (3, True, 1)
    assert "test_doctor.py" in error["where"]
    assert "in import_feed" in error["where"]
    assert any("retry spike" in warning for warning in report["warnings"])
    assert any("poison candidate KeyError" in warning for warning in report["warnings"])

    human = doctor(url, "--task", "import")
    assert human.exit_code == 0
    assert "SPIKE" in human.output
    assert "yes (3x on one job)" in human.output


def test_task_since_and_limit_narrow_what_the_doctor_reads(url: str) -> None:
    """``--task``, ``--since-s`` and ``--limit`` (store clock): only that task, only what was
    active in the window, only the most recent attempts; bad values are refused."""
    clock = ControlledClock()
    app = App(backend=stores.open_backend(url, clock=clock))

    @app.task(name="old")
    def old(ctx: Context) -> None:
        pass

    @app.task(name="new")
    def new(ctx: Context) -> None:
        pass

    try:
        old.enqueue()
        drain(app)
        clock.advance(100)
        new.enqueue()
        new.enqueue()
        drain(app)

        assert app.diagnose().attempts == 3
        recent = app.diagnose(since_s=50)
        assert recent.attempts == 2
        assert [d.task for d in recent.durations] == ["new"]
        only_old = app.diagnose(task="old")
        assert only_old.attempts == 1
        assert [r.task for r in only_old.retries] == ["old"]
        assert app.diagnose(limit=1).attempts == 1
        with pytest.raises(ConfigurationError, match="limit"):
            app.diagnose(limit=0)
        with pytest.raises(ConfigurationError, match="since_s"):
            app.diagnose(since_s=0)
    finally:
        app.close()

    _, report = doctor_json(url, "--task", "nothing-by-this-name")
    assert report["attempts"] == 0
    assert report["durations"] == report["retries"] == []
    assert doctor(url, "--limit", "0").exit_code == 2
    assert doctor(url, "--since-s", "0").exit_code == 2


def test_doctor_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    """Inspection commands never create an empty store: a missing file exits 3."""
    result = doctor(f"sqlite:///{tmp_path / 'missing.db'}")
    assert result.exit_code == 3
    assert not (tmp_path / "missing.db").exists()

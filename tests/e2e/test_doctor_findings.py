"""``jobguard doctor`` names the cause, against real worker processes on every backend.

Each test builds one situation with the tasks of ``tests.support.doctor_app`` run by worker
processes (``tests.support.run_worker``), then runs ``jobguard doctor --json`` and checks the
finding's kind, severity, task and keys, and the exit code (1 when a finding is a problem). The
healthy runs assert that nothing is a problem or a warning. Events that must happen in an order
are driven by marker files and by waiting on the store, not by sleeps.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobguard import App, Job, JobStatus, Outcome
from tests.support import doctor_app as d
from tests.support.procs import WorkerProcess, spawn_worker, wait_until, workers

APP = "tests.support.doctor_app"


@dataclass(frozen=True)
class Store:
    """The store of one test, and the directory of its marker files."""

    url: str
    markers: Path

    def marker(self, name: str) -> Path:
        """A marker file the handlers look for (see ``tests.support.doctor_app``)."""
        return self.markers / name


@pytest.fixture
def store(store_url: str) -> Store:
    """A fresh store for the test, on each backend."""
    markers = d.markers_of(store_url)
    markers.mkdir(parents=True, exist_ok=True)
    return Store(store_url, markers)


@pytest.fixture
def app(store: Store) -> Iterator[App]:
    """The doctor's app on the test's store: the producer side of every test."""
    application = d.make_app(store.url)
    yield application
    application.close()


def doctor(store: Store) -> tuple[int, dict[str, Any]]:
    """``jobguard --url URL doctor --json``: the exit code and the report."""
    from jobguard.cli.main import cli

    result = CliRunner().invoke(cli, ["--url", store.url, "doctor", "--json"])
    return result.exit_code, json.loads(result.output)


def of_kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The findings of one kind."""
    return [f for f in report["findings"] if f["kind"] == kind]


def severities(report: dict[str, Any]) -> set[str]:
    return {f["severity"] for f in report["findings"]}


def spawn(store: Store, **options: Any) -> WorkerProcess:
    """A worker process running the doctor's app on the test's store."""
    return spawn_worker(store.url, APP, **options)


def start(store: Store, **options: Any) -> WorkerProcess:
    """A worker process running the doctor's app, ready to fetch."""
    proc = spawn(store, **options)
    proc.wait_ready()
    return proc


def drain(store: Store, **options: Any) -> None:
    """Run a burst worker until nothing is ready or running."""
    proc = spawn(store, burst=True, **options)
    with workers(proc):
        assert proc.wait(timeout_s=60) == 0


def status(app: App, job_id: int) -> JobStatus:
    return app.get_job(job_id).status


def held_past_its_ttl(
    app: App, store: Store, enqueue_slow: Callable[[], Job], enqueue_quick: Callable[[], Job]
) -> tuple[Job, Job]:
    """A slow job holds its lock or slot past the TTL on a worker without heartbeat; a quick
    one, enqueued once the slow one runs, takes it over and writes; then the slow one writes
    with its stale fence. Returns both jobs once both completed."""
    slow = enqueue_slow()
    proc = start(store, concurrency=2, heartbeat=False)
    with workers(proc):
        wait_until(lambda: bool(app.attempts(job_id=slow.id)))
        quick = enqueue_quick()
        wait_until(
            lambda: (
                status(app, quick.id) == JobStatus.COMPLETED
                and status(app, slow.id) == JobStatus.COMPLETED
            ),
            timeout_s=30,
        )
    return slow, quick


def test_an_outage_is_named_as_one_and_a_mass_burial_is_a_problem(app: App, store: Store) -> None:
    """Many jobs failing with one signature while a dependency is down is an outage, named with
    every job it struck, a problem once it buried them; it is not a poison candidate. One job
    that always fails, next to it, is the poison candidate, named by id."""
    store.marker("down").touch()
    struck = app.tasks[d.RATES].enqueue_many([{"n": n} for n in range(6)])
    poison = app.tasks[d.PARSE].enqueue(n=1, bad=True)
    fine = app.tasks[d.PARSE].enqueue(n=2)

    proc = start(store, concurrency=3)
    with workers(proc):  # retries wait out their backoff, so no burst worker
        wait_until(
            lambda: (
                all(status(app, job.id) == JobStatus.DEAD for job in [*struck, poison])
                and status(app, fine.id) == JobStatus.COMPLETED
            ),
            timeout_s=30,
        )
    code, report = doctor(store)

    assert code == 1
    [outage] = of_kind(report, "outage")
    assert (outage["severity"], outage["task"]) == ("problem", d.RATES)
    assert outage["keys"]["job_ids"] == sorted(job.id for job in struck)
    assert outage["numbers"]["jobs"] == 6
    assert outage["numbers"]["dead_jobs"] == 6
    assert outage["numbers"]["failures"] == outage["numbers"]["retried"] + 6
    [poisoned] = of_kind(report, "poison")
    assert (poisoned["severity"], poisoned["task"]) == ("warning", d.PARSE)
    assert poisoned["keys"]["job_ids"] == [poison.id]
    assert f"job(s) {poison.id} failed the same way" in poisoned["summary"]
    [group] = [e for e in report["errors"] if e["task"] == d.RATES]
    assert (group["outage"], group["poison"]) == (True, False)
    # The shape a CI gate reads (docs/diagnostics.md, "Findings and --json").
    for finding in report["findings"]:
        assert set(finding) == {"kind", "severity", "task", "summary", "advice", "keys", "numbers"}
        assert set(finding["keys"]) == {
            "job_ids",
            "other_job_ids",
            "operation_keys",
            "resource_keys",
            "dedup_keys",
            "attempt_ids",
        }
        assert all(isinstance(v, int | float) for v in finding["numbers"].values())
    assert report["problems"] == [
        f"{f['summary']}; {f['advice']}" for f in report["findings"] if f["severity"] == "problem"
    ]


def test_a_crash_loop_names_the_job_present_at_every_crash_and_the_collateral(
    app: App, store: Store
) -> None:
    """A job whose delivery kills its worker is named as the crash loop's culprit, present at
    every crash; the jobs that died with it are collateral; it is a problem, and its stuck
    operation is not reported again as a separate warning."""
    culprit = app.tasks[d.CRASH].enqueue(n=1)
    others = app.tasks[d.WORK].enqueue_many([{"n": n} for n in range(12)])
    for _ in range(d.CRASH_MAX_ATTEMPTS):
        proc = start(store, concurrency=2)
        with workers(proc):
            assert proc.wait(timeout_s=30) == -signal.SIGKILL
    last = start(store, concurrency=2)
    with workers(last):
        wait_until(
            lambda: (
                status(app, culprit.id) == JobStatus.DEAD
                and all(status(app, job.id) == JobStatus.COMPLETED for job in others)
            ),
            timeout_s=30,
        )
    assert "never reported back" in (app.get_job(culprit.id).dead_reason or "")

    code, report = doctor(store)

    assert code == 1
    [loop] = of_kind(report, "crash_loop")
    assert (loop["severity"], loop["task"]) == ("problem", d.CRASH)
    assert loop["keys"]["job_ids"] == [culprit.id]
    assert loop["keys"]["operation_keys"] == ["crash:1"]
    collateral = loop["keys"]["other_job_ids"]
    assert collateral
    assert set(collateral) <= {job.id for job in others}
    assert loop["numbers"]["crashes"] == d.CRASH_MAX_ATTEMPTS
    assert loop["numbers"]["buried"] == 1
    assert of_kind(report, "stuck_processing") == []


def test_unstable_dedup_keys_and_operations_enqueued_as_several_jobs_are_named(
    app: App, store: Store
) -> None:
    """A dedup key with a timestamp or a fresh id lets one action be enqueued many times: with
    an operation key to absorb them it is a warning (and the operation is named with its jobs),
    without one it is a problem. Stable keys are not named."""
    notify, ping = app.tasks[d.NOTIFY], app.tasks[d.PING]
    repeated = [
        notify.options(dedup_key=f"notify:1:{time.time():.6f}").enqueue(user=1) for _ in range(3)
    ]
    stable = notify.options(dedup_key="notify:2").enqueue(user=2)
    pings = [ping.options(dedup_key=f"ping:7:{uuid.uuid4()}").enqueue(user=7) for _ in range(3)]

    drain(store)

    assert status(app, stable.id) == JobStatus.COMPLETED
    code, report = doctor(store)

    assert code == 1
    [split] = of_kind(report, "split_operation")
    assert (split["severity"], split["task"]) == ("warning", d.NOTIFY)
    assert split["keys"]["operation_keys"] == ["notify:1"]
    assert split["keys"]["job_ids"] == [job.id for job in repeated]
    unstable = {f["task"]: f for f in of_kind(report, "unstable_dedup_key")}
    assert set(unstable) == {d.NOTIFY, d.PING}
    assert unstable[d.NOTIFY]["severity"] == "warning"
    assert unstable[d.NOTIFY]["keys"]["job_ids"] == [job.id for job in repeated]
    assert "notify:1:<volatile>" in unstable[d.NOTIFY]["summary"]
    assert unstable[d.PING]["severity"] == "problem"
    assert unstable[d.PING]["keys"]["job_ids"] == [job.id for job in pings]
    assert len(unstable[d.PING]["keys"]["dedup_keys"]) == 3


def test_a_short_task_starved_behind_a_long_lock_holder_is_named_with_the_holder(
    app: App, store: Store
) -> None:
    """A short task sharing a resource key with a long one waits seconds for milliseconds of
    work through lock-busy deferrals: named per resource key and task, with the holder."""
    long_job = app.tasks[d.REPORT].enqueue(n=1, account="acme", hold_s=2.0)
    proc = start(store, concurrency=6)
    with workers(proc):
        wait_until(lambda: bool(app.attempts(job_id=long_job.id)))
        touches = app.tasks[d.TOUCH].enqueue_many([{"n": n, "account": "acme"} for n in range(5)])
        wait_until(
            lambda: all(status(app, job.id) == JobStatus.COMPLETED for job in touches),
            timeout_s=30,
        )

    code, report = doctor(store)

    assert code == 0, report["problems"]
    [starved] = of_kind(report, "starvation")
    assert (starved["severity"], starved["task"]) == ("warning", d.TOUCH)
    assert starved["keys"]["resource_keys"] == ["ledger:acme"]
    numbers = starved["numbers"]
    assert numbers["deferrals"] >= 5
    assert numbers["wait_s"] >= 10 * numbers["run_s"]
    assert numbers["longest_hold_s"] >= 2.0
    assert f"behind task {d.REPORT}" in starved["summary"]
    [use] = [u for u in report["resources"] if u["task"] == d.TOUCH]
    assert (use["resource_key"], use["longest_holder"], use["starved"]) == (
        "ledger:acme",
        d.REPORT,
        True,
    )


def test_operations_that_overlapped_under_one_resource_and_stale_fences_are_problems(
    app: App, store: Store
) -> None:
    """With a lock TTL below the real duration (and no heartbeat to renew it), another
    operation took the lock while the first still ran: the overlap is reported per resource
    key, the stale delivery's fence_refused is surfaced, and the lock TTL advice says the lock,
    not the job, went to another worker."""
    slow, _ = held_past_its_ttl(
        app,
        store,
        lambda: app.tasks[d.RESTOCK].enqueue(n=1, sku="kite"),
        lambda: app.tasks[d.SELL].enqueue(n=1, sku="kite"),
    )
    [stale] = [a for a in app.attempts(job_id=slow.id) if a.outcome == Outcome.FENCE_REFUSED]

    code, report = doctor(store)

    assert code == 1
    assert report["overlaps"] == []  # two operations, not one run twice
    [overlap] = of_kind(report, "resource_overlap")
    assert overlap["severity"] == "problem"
    assert overlap["keys"]["resource_keys"] == ["stock:kite"]
    assert overlap["keys"]["operation_keys"] == ["restock:1", "sell:1"]
    assert stale.id in overlap["keys"]["attempt_ids"]
    assert "lock TTL shorter than the job" in overlap["summary"]
    [refused] = of_kind(report, "fence_refused")
    assert (refused["severity"], refused["task"]) == ("problem", d.RESTOCK)
    assert refused["keys"]["attempt_ids"] == [stale.id]
    assert "effects outside db_step" in refused["advice"]
    [ttl] = [f for f in of_kind(report, "lock_ttl") if f["task"] == d.RESTOCK]
    assert ttl["severity"] == "problem"
    assert "the lock, not the job, passes to another worker" in ttl["summary"]
    assert "2 missed renewals" in ttl["summary"]


def test_more_runs_at_once_than_a_concurrency_limit_is_a_problem(app: App, store: Store) -> None:
    """With a slot TTL below the real duration (and no heartbeat to renew it), a second job of
    a concurrency key with a limit of one took the slot while the first still ran: the doctor
    reports two runs at once where the limit is one, with both attempts, and the stale one's
    fence_refused."""
    slow, quick = held_past_its_ttl(
        app,
        store,
        lambda: app.tasks[d.LOAD].enqueue(n=1, site="north", waits=True),
        lambda: app.tasks[d.LOAD].enqueue(n=2, site="north", waits=False),
    )
    [stale] = [a for a in app.attempts(job_id=slow.id) if a.outcome == Outcome.FENCE_REFUSED]
    [taker] = [a for a in app.attempts(job_id=quick.id) if a.outcome == Outcome.COMPLETED]

    code, report = doctor(store)

    assert code == 1
    [overrun] = of_kind(report, "slot_overrun")
    assert (overrun["severity"], overrun["task"]) == ("problem", d.LOAD)
    assert overrun["keys"]["attempt_ids"] == [stale.id, taker.id]
    assert overrun["keys"]["operation_keys"] == ["load:1", "load:2"]
    assert (overrun["numbers"]["limit"], overrun["numbers"]["runs"]) == (1, 2)
    assert "concurrency key dock:north: 2 deliveries ran at once" in overrun["summary"]
    [run_on] = report["slot_overruns"]
    assert run_on["concurrency_key"] == "dock:north"
    [refused] = of_kind(report, "fence_refused")
    assert refused["keys"]["attempt_ids"] == [stale.id]
    from jobguard.cli.main import cli

    human = CliRunner().invoke(cli, ["--url", store.url, "doctor"]).output
    assert "dock:north: 2 ran at once" in human
    assert "limit 1" in human


def test_completions_that_did_less_than_usual_are_warnings(app: App, store: Store) -> None:
    """Completions that went through fewer steps than the task usually does, and operations
    completed without the external reference most of the task's have, are warnings naming the
    jobs and the most recent operations in numeric order; the exit code stays 0."""
    ship = app.tasks[d.SHIP]
    normal = ship.enqueue_many([{"order": n} for n in range(1, 9)])
    short = ship.enqueue_many([{"order": 9, "skip": True}, {"order": 10, "skip": True}])

    drain(store)

    assert all(status(app, job.id) == JobStatus.COMPLETED for job in [*normal, *short])
    code, report = doctor(store)

    assert code == 0, report["problems"]
    assert report["problems"] == []
    [less] = of_kind(report, "short_completion")
    assert (less["severity"], less["task"]) == ("warning", d.SHIP)
    assert less["keys"]["job_ids"] == [job.id for job in short]
    assert (less["numbers"]["usual_steps"], less["numbers"]["fewest_steps"]) == (3, 1)
    [missing] = of_kind(report, "missing_external_ref")
    assert missing["severity"] == "warning"
    assert missing["keys"]["operation_keys"] == ["ship:9", "ship:10"]
    assert len(report["warnings"]) == 2


def test_a_long_task_kept_alive_by_its_heartbeat_is_healthy(app: App, store: Store) -> None:
    """A long task on its own queue, runs longer than its 1 s lease and lock TTL, renewed by the
    heartbeat with no delivery lost: no problem, no warning, exit 0; only hints."""
    jobs = app.tasks[d.EXPORT].enqueue_many([{"n": n, "run_s": 2.0} for n in range(2)])

    drain(store, queues=[d.EXPORT_QUEUE], concurrency=2)

    assert all(status(app, job.id) == JobStatus.COMPLETED for job in jobs)
    assert all(len(app.attempts(job_id=job.id)) == 1 for job in jobs)
    code, report = doctor(store)

    assert report["problems"] == report["warnings"] == []
    assert code == 0, report["problems"]
    assert severities(report) == {"hint"}
    kinds = {f["kind"] for f in report["findings"]}
    assert kinds == {"visibility_timeout", "lock_ttl"}


def test_a_healthy_run_with_retries_deferrals_and_killed_workers_has_no_finding(
    app: App, store: Store
) -> None:
    """Fast jobs, guarded jobs contending for three resource locks with a few transient retries,
    and two workers SIGKILLed mid-run whose jobs their leases recovered: no problem, no
    warning, exit 0."""
    fast = app.tasks[d.FAST].enqueue_many([{"n": n} for n in range(10)])
    guarded = app.tasks[d.GUARDED]

    def enqueue(numbers: range, flaky: bool) -> list[Any]:
        return [
            guarded.options(dedup_key=f"guarded:{n}").enqueue(n=n, account=n % 3, flaky=flaky)
            for n in numbers
        ]

    jobs = enqueue(range(22), flaky=False)
    first = [start(store, concurrency=4) for _ in range(2)]

    def in_its_sleep(n: int) -> bool:
        """Job ``n`` is between its two steps: 0.15 s of sleep with its lock held."""
        operation = app.operation(f"guarded:{n}")
        return operation is not None and set(operation.steps) == {"debit"}

    with workers(*first):
        # Both workers took work and a guarded job is in the middle of its run (a delivery
        # merely running may be a fast job about to finish): kill both at once, so no job is
        # in two crashes (that would be a crash loop).
        wait_until(
            lambda: (
                len({a.worker_id for a in app.attempts(limit=500)}) == 2
                and any(in_its_sleep(n) for n in range(22))
            )
        )
        for proc in first:
            proc.signal(signal.SIGKILL)
        for proc in first:
            assert proc.wait() == -signal.SIGKILL
    # The two flaky jobs come after the kill: a worker killed after a handler failed and before
    # its retry was written would turn that retry into a lost delivery, and the count below
    # would depend on timing.
    jobs += enqueue(range(22, 24), flaky=True)
    last = start(store, concurrency=4)
    with workers(last):
        wait_until(
            lambda: all(status(app, job.id) == JobStatus.COMPLETED for job in [*fast, *jobs]),
            timeout_s=40,
        )
    attempts = app.attempts(limit=1000)
    assert any(a.outcome == Outcome.LOST for a in attempts)
    assert sum(a.outcome == Outcome.RETRY for a in attempts) == 2
    assert any(a.outcome == Outcome.DEFERRED for a in attempts)

    code, report = doctor(store)

    assert report["problems"] == report["warnings"] == []
    assert code == 0, report["problems"]
    assert [f for f in report["findings"] if f["severity"] != "hint"] == []

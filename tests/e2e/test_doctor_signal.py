"""``jobguard doctor`` keeps to signal: what jobguard did by design is not reported as a fault.

Schedule ticks carry jobguard's own dedup keys, late duplicates absorbed by an operation record
are one line with advice that fits the jobs, and an outage whose buried jobs were all replayed
and completed no longer fails the gate. Each runs on both backends, through ``jobguard doctor
--json``.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner

from jobguard import App, Context, JobStatus, Outcome
from jobguard.scheduler import Scheduler
from jobguard.testing import ControlledClock, drain
from tests.e2e.test_doctor_findings import Store, start, status
from tests.support import doctor_app as d
from tests.support import signal_app as s
from tests.support.procs import spawn_worker, wait_until, workers

SIGNAL_APP = "tests.support.signal_app"


def doctor(url: str) -> tuple[int, dict[str, Any]]:
    """``jobguard --url URL doctor --json``: the exit code and the report."""
    from jobguard.cli.main import cli

    result = CliRunner().invoke(cli, ["--url", url, "doctor", "--json"])
    return result.exit_code, json.loads(result.output)


def of_kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


@pytest.fixture
def store(store_url: str) -> Store:
    """A fresh store of each backend, with the directory of its marker files."""
    d.markers_of(store_url).mkdir(parents=True, exist_ok=True)
    return Store(store_url, d.markers_of(store_url))


@pytest.fixture
def tasks(store: Store) -> Iterator[App]:
    """The doctor's app (``tests.support.doctor_app``): the producer side."""
    application = d.make_app(store.url)
    yield application
    application.close()


@pytest.fixture
def signal_tasks(store: Store) -> Iterator[App]:
    """The signal tests' own app (``tests.support.signal_app``): the producer side."""
    application = s.make_app(store.url)
    yield application
    application.close()


def drain_processes(store: Store, queues: list[str] | None = None) -> None:
    """Run a burst worker process of the signal app until nothing is ready or running."""
    proc = spawn_worker(store.url, SIGNAL_APP, burst=True, queues=queues)
    with workers(proc):
        assert proc.wait(timeout_s=60) == 0


def test_schedule_ticks_are_not_an_unstable_dedup_key(
    timed_app: App, clock: ControlledClock, store_url: str
) -> None:
    """Every tick's dedup key is ``schedule:NAME@TICK``: a time in the key, by design, one job
    per tick. The doctor does not name it as an unstable key."""

    @timed_app.periodic(every=60, missed=100, name="tidy")
    def tidy(ctx: Context, tick: datetime) -> None:
        pass

    runner = Scheduler(timed_app, install_signal_handlers=False)
    runner.run_pending()
    stored = []
    for _ in range(4):
        clock.advance(60)
        stored += runner.run_pending()
    drain(timed_app)
    assert len({job.dedup_key for job in stored}) == 4

    code, report = doctor(store_url)

    assert of_kind(report, "unstable_dedup_key") == []
    assert report["warnings"] == report["problems"] == []
    assert code == 0


# -- with real worker processes (tests.support.doctor_app) ---------------------------------------


def test_an_outage_whose_buried_jobs_were_replayed_and_completed_is_resolved(
    tasks: App, store: Store
) -> None:
    """An outage that buried six jobs is a problem (exit 1) until every one was replayed and
    completed; then it is a resolved hint and the doctor exits 0, so it can gate cron or CI.
    While some are still buried it stays a problem naming them."""
    store.marker("down").touch()
    struck = tasks.tasks[d.RATES].enqueue_many([{"n": n} for n in range(6)])
    proc = start(store, concurrency=3)
    with workers(proc):
        wait_until(lambda: all(status(tasks, j.id) == JobStatus.DEAD for j in struck), timeout_s=30)
        code, report = doctor(store.url)
        assert code == 1
        [outage] = of_kind(report, "outage")
        assert outage["severity"] == "problem"

        store.marker("down").unlink()  # the rates service is back
        for job in struck[:4]:
            tasks.dlq.replay(job.id)
        wait_until(lambda: all(status(tasks, j.id) == JobStatus.COMPLETED for j in struck[:4]))
        code, report = doctor(store.url)
        assert code == 1
        [outage] = of_kind(report, "outage")
        assert outage["severity"] == "problem"
        assert outage["keys"]["other_job_ids"] == [j.id for j in struck[4:]]
        assert "2 jobs still buried" in outage["summary"]

        for job in struck[4:]:
            tasks.dlq.replay(job.id)
        wait_until(lambda: all(status(tasks, j.id) == JobStatus.COMPLETED for j in struck))

    code, report = doctor(store.url)

    assert report["problems"] == []
    assert code == 0
    [outage] = of_kind(report, "outage")
    assert outage["severity"] == "hint"
    assert outage["keys"]["job_ids"] == [j.id for j in struck]
    assert "resolved: all 6 buried jobs were replayed and completed" in outage["summary"]
    assert outage["numbers"]["still_dead_jobs"] == 0


def test_late_duplicates_absorbed_by_the_operation_record_are_one_line_that_fits(
    tasks: App, store: Store
) -> None:
    """A webhook delivered again after its job completed: the dedup key (no window) no longer
    held it, the operation record acked it without running it. Twelve of them are one hint for
    the task, naming what was missing (a dedup window), not a dedup key the jobs already had.
    Jobs without a dedup key are told to get one; the gate stays green."""
    notify = tasks.tasks[d.NOTIFY]
    first = [notify.options(dedup_key=f"hook:{n}").enqueue(user=n) for n in range(12)]
    bare = [notify.enqueue(user=n) for n in range(100, 103)]
    drain(tasks)
    again = [notify.options(dedup_key=f"hook:{n}").enqueue(user=n) for n in range(12)]
    bare_again = [notify.enqueue(user=n) for n in range(100, 103)]
    assert not any(job.deduplicated for job in again)
    drain(tasks)

    code, report = doctor(store.url)

    assert code == 0, report["problems"]
    assert report["warnings"] == []
    assert of_kind(report, "split_operation") == []
    keyed, unkeyed = sorted(of_kind(report, "late_duplicate"), key=lambda f: -f["numbers"]["jobs"])
    assert (keyed["severity"], keyed["task"]) == ("hint", d.NOTIFY)
    assert keyed["keys"]["job_ids"] == sorted(job.id for job in [*first, *again])
    numbers = keyed["numbers"]
    assert (numbers["operations"], numbers["jobs"], numbers["extra_jobs"]) == (12, 24, 12)
    assert keyed["numbers"]["latest_after_s"] > 0
    assert "dedup_window_s" in keyed["advice"]
    assert "give it a dedup_key" not in keyed["advice"]
    assert unkeyed["keys"]["job_ids"] == sorted(job.id for job in [*bare, *bare_again])
    assert "dedup_key" in unkeyed["advice"]
    assert len(report["hints"]) == 2


def test_completions_that_swallowed_an_error_are_short_even_when_most_did(
    signal_tasks: App, store: Store
) -> None:
    """While the mail service is down, the handler swallows the send's error and returns: those
    jobs complete having sent nothing. Six of ten did, four sent their mail: the task has no
    external reference to compare, and the short ones are the majority, yet they are named as
    short completions beside the full runs their siblings made."""
    mail = signal_tasks.tasks[s.MAIL]
    sent = mail.enqueue_many([{"user": n} for n in range(4)])
    drain_processes(store)
    store.marker("mailer-down").touch()
    swallowed = mail.enqueue_many([{"user": n} for n in range(4, 10)])
    drain_processes(store)
    assert all(status(signal_tasks, job.id) == JobStatus.COMPLETED for job in [*sent, *swallowed])

    code, report = doctor(store.url)

    assert code == 0, report["problems"]
    [short] = of_kind(report, "short_completion")
    assert (short["severity"], short["task"]) == ("warning", s.MAIL)
    assert short["keys"]["job_ids"] == [job.id for job in swallowed]
    assert (short["numbers"]["usual_steps"], short["numbers"]["fewest_steps"]) == (2, 1)
    assert of_kind(report, "missing_external_ref") == []


def run_until_settled(tasks: App, store: Store, queues: list[str] | None = None) -> None:
    """A worker process of the signal app until every job completed or was buried (the jobs of
    killed workers come back once their leases expire)."""
    proc = spawn_worker(store.url, SIGNAL_APP, queues=queues, concurrency=4)
    with workers(proc):
        proc.wait_ready()
        wait_until(
            lambda: (
                tasks.counts()[JobStatus.QUEUED] == 0 and tasks.counts()[JobStatus.RUNNING] == 0
            ),
            timeout_s=30,
        )


def kill_while_running(tasks: App, store: Store, queue: str, running: int) -> str:
    """Start a worker on ``queue``; SIGKILL it once ``running`` of its deliveries run."""
    proc = spawn_worker(store.url, SIGNAL_APP, queues=[queue], concurrency=running)
    proc.wait_ready()
    worker_id = f"w{proc.pid}"
    with workers(proc):
        wait_until(
            lambda: (
                sum(
                    a.outcome == Outcome.RUNNING and a.worker_id == worker_id
                    for a in tasks.attempts(limit=500)
                )
                >= running
            )
        )
        proc.signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    return worker_id


def test_worker_deaths_are_reported_with_what_they_took_down_and_what_recovered(
    signal_tasks: App, store: Store
) -> None:
    """Two worker processes SIGKILLed mid-run: the doctor says two workers died, which
    deliveries and jobs died with them, that the jobs allowed another delivery recovered, and
    that the one allowed a single delivery was buried (a warning naming it)."""
    steps = signal_tasks.tasks[s.STEPS]
    first = [steps.options(queue="one").enqueue(n=n) for n in range(3)]
    fragile = signal_tasks.tasks[s.FRAGILE].options(queue="one").enqueue(n=9)
    second = [steps.options(queue="two").enqueue(n=n) for n in range(10, 12)]
    dead_ids = [
        kill_while_running(signal_tasks, store, "one", 4),
        kill_while_running(signal_tasks, store, "two", 2),
    ]
    run_until_settled(signal_tasks, store, queues=["one", "two"])
    recovered = [*first, *second]
    assert all(status(signal_tasks, j.id) == JobStatus.COMPLETED for j in recovered)
    assert status(signal_tasks, fragile.id) == JobStatus.DEAD

    code, report = doctor(store.url)

    assert code == 0, report["problems"]
    [deaths] = of_kind(report, "worker_deaths")
    assert (deaths["severity"], deaths["task"]) == ("warning", None)
    assert deaths["numbers"] == {
        "workers": 2,
        "lost_deliveries": 6,
        "jobs": 6,
        "recovered": 5,
        "pending": 0,
        "buried": 1,
    }
    assert deaths["keys"]["job_ids"] == sorted(j.id for j in [*recovered, fragile])
    assert deaths["keys"]["other_job_ids"] == [fragile.id]
    assert all(worker in deaths["summary"] for worker in dead_ids)
    assert "2 worker processes died" in deaths["summary"]
    assert f"buried: job {fragile.id}" in deaths["summary"]


def test_worker_deaths_whose_jobs_all_recovered_are_a_hint(signal_tasks: App, store: Store) -> None:
    jobs = signal_tasks.tasks[s.STEPS].enqueue_many([{"n": n} for n in range(2)])
    kill_while_running(signal_tasks, store, "default", 2)
    run_until_settled(signal_tasks, store)
    assert all(status(signal_tasks, j.id) == JobStatus.COMPLETED for j in jobs)

    code, report = doctor(store.url)

    assert code == 0
    [deaths] = of_kind(report, "worker_deaths")
    assert deaths["severity"] == "hint"
    assert "1 worker process died" in deaths["summary"]
    assert "all 2 recovered" in deaths["summary"]


def test_a_frozen_worker_is_a_stall_not_a_slow_handler(signal_tasks: App, store: Store) -> None:
    """A worker SIGSTOPped past its lease while its handler runs, then SIGCONTed: the job ran
    again elsewhere and the frozen delivery's late write was refused. The doctor names a stall
    of that worker (its heartbeat did not run), not a slow job, and does not advise a longer
    visibility timeout for it."""
    job = signal_tasks.tasks[s.FROZEN].enqueue(n=1)
    frozen = spawn_worker(store.url, SIGNAL_APP, concurrency=1)
    with contextlib.ExitStack() as stack:  # every worker started is killed and reaped
        stack.enter_context(workers(frozen))
        frozen.wait_ready()
        wait_until(lambda: bool(getattr(signal_tasks.operation("frozen:1"), "steps", {})))
        frozen.pause_between_writes(store.url)
        rescuer = spawn_worker(store.url, SIGNAL_APP, concurrency=1)  # only once it is frozen
        stack.enter_context(workers(rescuer))
        rescuer.wait_ready()
        wait_until(lambda: status(signal_tasks, job.id) == JobStatus.COMPLETED, timeout_s=30)
        frozen.signal(signal.SIGCONT)
        wait_until(
            lambda: signal_tasks.attempts(job_id=job.id)[0].outcome == Outcome.LEASE_REFUSED,
            timeout_s=30,
        )
    stale = signal_tasks.attempts(job_id=job.id)[0]

    code, report = doctor(store.url)

    [stall] = of_kind(report, "stall")
    assert (stall["severity"], stall["task"]) == ("warning", s.FROZEN)
    assert stall["keys"]["job_ids"] == [job.id]
    assert stall["keys"]["attempt_ids"] == [stale.id]
    assert stall["numbers"]["stalled_s"] >= 2.0 / 3  # at least one heartbeat beat missed
    assert stale.worker_id in stall["summary"]
    assert "not a slow handler" in stall["advice"]
    assert [f for f in of_kind(report, "visibility_timeout") if f["severity"] != "hint"] == []
    [overlap] = report["overlaps"]
    assert overlap["causes"][0].startswith("a stall")
    assert code == 1  # the overlap itself stays a problem: the work ran twice at once

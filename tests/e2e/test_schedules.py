"""Periodic tasks in one process on a real store: declaring, enqueueing, running, showing (#10).

Time is a :class:`ControlledClock` driving the store, so every tick is placed exactly; the tests
that enqueue and run ticks do so on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result

from jobguard import App, ConfigurationError, Context, JobStatus, Outcome
from jobguard.cli.main import cli
from jobguard.scheduler import Scheduler
from jobguard.testing import ControlledClock, drain
from tests.e2e.conftest import SPRING


def scheduler(app: App) -> Scheduler:
    return Scheduler(app, install_signal_handlers=False)


# -- declaring ----------------------------------------------------------------------------------


def handler(ctx: Context, tick: datetime) -> None:
    """A periodic handler that does nothing."""


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"cron": "*/5 * * * * * *"}, "invalid cron expression '*/5 * * * * * *'"),
        ({"cron": "0 25 * * *"}, "Bad hour"),
        ({"cron": "0 3 * * *", "timezone": "Europe/Berln"}, "unknown timezone 'Europe/Berln'"),
        ({}, "exactly one of cron= and every="),
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron= and every="),
        ({"every": 60, "timezone": "Europe/Berlin"}, "timezone applies to cron= only"),
        ({"every": timedelta(milliseconds=500)}, "whole number of seconds"),
        ({"every": 60, "missed": "catch-up"}, "missed must be 'skip', 'last' or a number"),
        ({"every": 60, "grace_s": -1}, "grace_s must be >= 0"),
        ({"every": 60, "operation_key": "report"}, "must contain {tick}"),
        ({"every": 60, "queue": "no spaces"}, "is not a plain identifier"),
        ({"every": 60, "queu": "reports"}, "unknown option(s) queu; besides its own"),
    ],
)
def test_bad_schedules_fail_at_declaration_with_the_reason(
    app: App, options: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(reason)):
        app.periodic(**options)(handler)
    assert app.schedules == {}
    assert app.tasks == {}


def test_a_handler_that_cannot_take_the_tick_is_refused(app: App) -> None:
    def no_tick(ctx: Context) -> None: ...

    with pytest.raises(ConfigurationError, match=r"must take \(ctx, tick\)"):
        app.periodic(every=60)(no_tick)


def test_a_schedule_is_a_task_with_tick_keys(app: App) -> None:
    schedule = app.periodic(cron="0 3 * * *", timezone="Europe/Berlin", name="nightly")(handler)
    assert app.schedules == {"nightly": schedule}
    assert app.tasks["nightly"] is schedule.task
    spec = schedule.tick_spec(1_800_000_000, now=1_800_000_000.5)
    assert json.loads(spec.payload) == {"tick": "2027-01-15T08:00:00Z"}
    assert spec.dedup_key == "schedule:nightly@2027-01-15T08:00:00Z"
    assert spec.operation_key == "schedule:nightly@2027-01-15T08:00:00Z"
    assert spec.dedup_window_s == 86400.0
    assert spec.delay_s == 0.0


def test_fire_times_are_listed_in_the_schedules_time_zone(app: App) -> None:
    schedule = app.periodic(cron="30 2 * * *", timezone="Europe/Berlin")(handler)
    after = datetime.fromtimestamp(SPRING, tz=UTC)
    assert [t.isoformat() for t in schedule.next_fire_times(after, 2)] == [
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that day
        "2026-03-30T02:30:00+02:00",
    ]


# -- enqueueing and running ---------------------------------------------------------------------


def test_the_handler_receives_the_scheduled_time_across_spring_forward(
    timed_app: App, clock: ControlledClock
) -> None:
    seen: list[datetime] = []

    @timed_app.periodic(cron="*/30 * * * *", timezone="Europe/Berlin", missed=10)
    def half_hourly(ctx: Context, tick: datetime) -> None:
        seen.append(tick)

    scheduler(timed_app).run_pending()  # first sight at 01:59 CET: nothing owed
    clock.advance(3 * 3600)  # to 05:59 CEST: six half-hours later, real time
    jobs = scheduler(timed_app).run_pending()
    assert len(jobs) == 6
    drain(timed_app)
    assert [t.isoformat() for t in seen] == [
        "2026-03-29T03:00:00+02:00",  # 02:00 and 02:30 CET never happen
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
        "2026-03-29T04:30:00+02:00",
        "2026-03-29T05:00:00+02:00",
        "2026-03-29T05:30:00+02:00",
    ]
    assert all(t.tzinfo == ZoneInfo("Europe/Berlin") for t in seen)


def test_two_schedulers_racing_enqueue_each_tick_once(
    timed_app: App, clock: ControlledClock
) -> None:
    timed_app.periodic(every=60, missed=100)(handler)
    first, second = scheduler(timed_app), scheduler(timed_app)
    first.run_pending()
    stored = []
    for _ in range(5):
        clock.advance(60)
        stored += second.run_pending() + first.run_pending()
    assert len(stored) == 5
    assert len({job.dedup_key for job in stored}) == 5


def test_a_lost_race_is_read_again_not_written(timed_app: App, clock: ControlledClock) -> None:
    """A scheduler whose cursor went stale writes nothing: the store refuses the old cursor."""
    schedule = timed_app.periodic(every=60, missed=100)(handler)
    scheduler(timed_app).run_pending()
    clock.advance(60)
    state = timed_app.backend.schedule_states()[0]
    now = timed_app.backend.now()
    tick = state.cursor + 60
    spec = [(tick, schedule.tick_spec(tick, now))]
    queued = timed_app.counts()[JobStatus.QUEUED]
    assert timed_app.backend.advance_schedule(schedule.name, state.cursor, tick, spec) is not None
    assert timed_app.backend.advance_schedule(schedule.name, state.cursor, tick, spec) is None
    assert timed_app.backend.advance_schedule(schedule.name, None, tick, spec) is None
    assert timed_app.counts()[JobStatus.QUEUED] == queued + 1


def test_a_tick_that_ran_does_not_run_again(timed_app: App, clock: ControlledClock) -> None:
    """Enqueued again by hand after its dedup window, the tick is acked as already processed."""
    runs: list[datetime] = []

    @timed_app.periodic(every=60, grace_s=60, dedup_window_s=0)
    def report(ctx: Context, tick: datetime) -> None:
        runs.append(tick)

    (job,) = scheduler(timed_app).run_pending()
    drain(timed_app)
    again = report.task.enqueue(tick=json.loads(job.payload)["tick"])
    assert again.id != job.id
    drain(timed_app)
    assert len(runs) == 1
    assert [a.outcome for a in timed_app.attempts(job_id=again.id)] == [Outcome.ALREADY_PROCESSED]


def test_jitter_delays_each_tick_within_bounds(timed_app: App, clock: ControlledClock) -> None:
    timed_app.periodic(every=60, missed=100, jitter_s=30)(handler)
    jobs = scheduler(timed_app).run_pending()
    for _ in range(9):
        clock.advance(60)  # each tick enqueued the moment it falls
        jobs += scheduler(timed_app).run_pending()
    offsets = [job.run_at - json_tick(job.payload) for job in jobs]
    assert len(offsets) == 10
    assert all(0 <= offset < 30 for offset in offsets)
    assert len(set(offsets)) > 1


def json_tick(payload: str) -> float:
    tick = json.loads(payload)["tick"]
    return datetime.strptime(tick, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_a_worker_with_schedule_enqueues_and_runs_the_due_tick(
    timed_app: App, clock: ControlledClock
) -> None:
    runs: list[datetime] = []

    @timed_app.periodic(every=60, grace_s=60)
    def minutely(ctx: Context, tick: datetime) -> None:
        runs.append(tick)

    stats = timed_app.worker(schedule=True, install_signal_handlers=False).run(burst=True)
    assert stats.outcomes == {Outcome.COMPLETED: 1}
    assert runs == [datetime(2026, 3, 29, 0, 59, tzinfo=UTC)]


def test_an_async_handler_receives_its_tick_and_a_generator_is_refused(
    timed_app: App, clock: ControlledClock
) -> None:
    runs: list[datetime] = []

    @timed_app.periodic(every=60, grace_s=60, name="async-minutely")
    async def minutely(ctx: Context, tick: datetime) -> None:
        runs.append(tick)

    def generator(ctx: Context, tick: datetime) -> Iterator[None]:
        yield None

    with pytest.raises(ConfigurationError, match="generator function"):
        timed_app.periodic(every=60)(generator)
    scheduler(timed_app).run_pending()
    drain(timed_app)
    assert runs == [datetime(2026, 3, 29, 0, 59, tzinfo=UTC)]


def test_a_scheduler_needs_a_schedule(app: App) -> None:
    with pytest.raises(ConfigurationError, match="declares no schedule"):
        Scheduler(app)
    app.periodic(every=60, name="one")(handler)
    with pytest.raises(ConfigurationError, match=r"unknown schedule\(s\) \['two'\]"):
        Scheduler(app, ["two"])


# -- the command line ---------------------------------------------------------------------------

APP_SOURCE = """
from jobguard import App

app = App("sqlite:///{db}")


@app.periodic(cron="0 3 * * *", timezone="Europe/Berlin", name="nightly", missed=3)
def nightly(ctx, tick):
    pass


@app.periodic(every=1, name="beat", grace_s=3600)
def beat(ctx, tick):
    pass
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An app module with two schedules, importable by ``--app``."""
    name = f"sched_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(db=tmp_path / "s.db"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:app"
    import sys

    imported = sys.modules.pop(name, None)
    if imported is not None:
        imported.app.close()


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="jobguard")


def test_schedules_lists_next_fire_times_and_the_last_tick(module: str) -> None:
    before = json.loads(run("--app", module, "schedules", "--json").stdout)
    assert [s["name"] for s in before] == ["nightly", "beat"]
    assert before[0]["cron"] == "0 3 * * *"
    assert before[0]["timezone"] == "Europe/Berlin"
    assert before[0]["missed"] == "catch up 3"
    assert len(before[0]["next"]) == 3
    assert all(t.endswith(("+01:00", "+02:00")) and "T03:00:00" in t for t in before[0]["next"])
    assert before[1]["last_tick"] is None

    once = run("--app", module, "scheduler", "--once", "--schedules", "beat")
    assert once.exit_code == 0, once.stderr
    assert "scheduler stopped: enqueued 1 in 1 passes" in once.stderr

    after = json.loads(run("--app", module, "schedules", "--json", "--next", "1").stdout)
    assert after[1]["last_job"] == {"id": 1, "status": "queued"}
    assert after[1]["last_tick"] == after[1]["cursor"]
    assert len(after[1]["next"]) == 1
    text = run("--app", module, "schedules")
    assert text.exit_code == 0
    assert "every 1s UTC" in text.stdout
    assert "1 (queued)" in text.stdout


def test_worker_schedule_runs_the_ticks(module: str) -> None:
    result = run("--app", module, "worker", "--schedule", "--burst")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(run("--app", module, "schedules", "--json").stdout)
    assert shown[1]["last_job"]["status"] == "completed"  # beat's tick: on time, so it ran


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scheduler", "--schedules", "nope"], "unknown schedule(s) ['nope']"),
        (["scheduler", "--poll-interval-s", "0"], "--poll-interval-s"),
        (["schedules", "--next", "0"], "--next"),
    ],
)
def test_bad_scheduler_arguments_exit_2_with_one_line(
    module: str, args: list[str], message: str
) -> None:
    result = run("--app", module, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

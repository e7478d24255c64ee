"""``jobguard scheduler`` (enqueue the ticks of periodic tasks) and ``jobguard schedules``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from jobguard.app import App
from jobguard.cli.jobs_cmd import console, emit_json, table
from jobguard.cli.signals import stop_on_signals
from jobguard.cli.state import CliState
from jobguard.core.schedules import Cron
from jobguard.exceptions import JobGuardError, NotFoundError
from jobguard.models import ScheduleState
from jobguard.process import ignore_stop_signals
from jobguard.schedule import Schedule
from jobguard.scheduler import Scheduler


def _names(value: str) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] or None


@click.command()
@click.option(
    "--schedules",
    "names",
    default="",
    help="Comma-separated schedule names (default: every schedule the app declares).",
)
@click.option(
    "--poll-interval-s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Longest sleep between passes, even when the next tick is further away.",
)
@click.option("--once", is_flag=True, help="Enqueue the ticks due now, then exit.")
@click.option("--scheduler-id", default=None, help="Name in the logs (default host:pid:rand).")
@click.pass_obj
def scheduler(
    state: CliState, names: str, poll_interval_s: float, once: bool, scheduler_id: str | None
) -> None:
    """Enqueue each tick of the app's periodic tasks as one job, until SIGTERM/SIGINT.

    Run as many as you like, on any hosts: every tick still becomes exactly one job.
    """
    app = state.app_with_tasks()
    runner = Scheduler(
        app, _names(names), poll_interval_s=poll_interval_s, scheduler_id=scheduler_id
    )
    # A graceful stop from now on: run() installs its own handlers, but only while it runs.
    stop_on_signals(runner.stop)
    # Open the store before saying so, as a worker does: from the line on, it runs on that
    # store, and a file deleted or replaced under it is noticed.
    app.backend.check_usable()  # a read-only file: one error line, before the line below
    listed = ", ".join(s.name for s in runner.schedules)
    click.echo(f"scheduler {runner.scheduler_id} for {listed}", err=True)
    stats = runner.run(once=once)
    ignore_stop_signals()  # stopped and exiting: a late signal must not kill it
    click.echo(f"scheduler stopped: enqueued {stats.enqueued} in {stats.passes} passes", err=True)
    if runner.failure is not None:
        # Its store cannot be used (file deleted or replaced, or read-only): exit 3 with the
        # same error line as a worker's.
        raise runner.failure
    if once and runner.failures:
        # The others were enqueued; exit 1 so that cron or CI sees the broken schedule.
        raise JobGuardError(
            "; ".join(f"schedule {name!r} failed: {why}" for name, why in runner.failures.items())
        )


def _iso(tick: int | None, schedule: Schedule) -> str | None:
    return None if tick is None else schedule.tick_time(tick).isoformat()


def _describe(app: App, schedule: Schedule, stored: ScheduleState | None, count: int) -> Any:
    """One schedule as plain data (the ``--json`` form; the table shows the same)."""
    trigger = schedule.trigger
    now = datetime.fromtimestamp(app.backend.now(), tz=UTC)
    last_job: dict[str, Any] | None = None
    if stored is not None and stored.last_job_id is not None:
        try:
            status: str | None = app.get_job(stored.last_job_id).status.value
        except NotFoundError:
            status = None  # pruned by retention
        last_job = {"id": stored.last_job_id, "status": status}
    return {
        "name": schedule.name,
        "cron": trigger.expression if isinstance(trigger, Cron) else None,
        "timezone": trigger.timezone if isinstance(trigger, Cron) else "UTC",
        "every_s": None if isinstance(trigger, Cron) else trigger.seconds,
        "missed": schedule.missed.describe(),
        "grace_s": schedule.grace_s,
        "jitter_s": schedule.jitter_s,
        "queue": schedule.task.queue,
        "next": [moment.isoformat() for moment in schedule.next_fire_times(now, count)],
        "last_tick": _iso(stored.last_tick if stored else None, schedule),
        "last_job": last_job,
        "cursor": _iso(stored.cursor if stored else None, schedule),
    }


@click.command()
@click.option(
    "--next",
    "count",
    default=3,
    show_default=True,
    type=click.IntRange(1, 100),
    help="How many upcoming fire times to list per schedule.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as a JSON list.")
@click.pass_obj
def schedules(state: CliState, count: int, as_json: bool) -> None:
    """List each periodic task: when it fires next and the last tick enqueued, with its job."""
    app = state.app_with_tasks()
    stored = {s.name: s for s in app.backend.schedule_states()}
    found = [_describe(app, s, stored.get(s.name), count) for s in app.schedules.values()]
    if as_json:
        emit_json(found)
        return
    rows = []
    for item in found:
        when = f"cron '{item['cron']}'" if item["cron"] else f"every {item['every_s']}s"
        job = item["last_job"]
        rows.append(
            [
                item["name"],
                f"{when} {item['timezone']}",
                item["missed"],
                "\n".join(item["next"]),
                item["last_tick"],
                f"{job['id']} ({job['status'] or 'pruned'})" if job else None,
            ]
        )
    console().print(
        table(
            f"schedules ({len(found)})",
            ["name", "when", "missed", "next", "last tick enqueued", "its job"],
            rows,
        )
    )

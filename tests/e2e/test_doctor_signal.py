"""``jobguard doctor`` keeps to signal: what jobguard did by design is not reported as a fault.

Schedule ticks carry jobguard's own dedup keys, late duplicates absorbed by an operation record
are one line with advice that fits the jobs, and an outage whose buried jobs were all replayed
and completed no longer fails the gate. Each runs on both backends, through ``jobguard doctor
--json``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from click.testing import CliRunner

from jobguard import App, Context
from jobguard.scheduler import Scheduler
from jobguard.testing import ControlledClock, drain


def doctor(url: str) -> tuple[int, dict[str, Any]]:
    """``jobguard --url URL doctor --json``: the exit code and the report."""
    from jobguard.cli.main import cli

    result = CliRunner().invoke(cli, ["--url", url, "doctor", "--json"])
    return result.exit_code, json.loads(result.output)


def of_kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


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

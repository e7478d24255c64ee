"""One careless schedule must not silence the others (#18).

Every number a schedule takes is refused at declaration unless it is a finite number of seconds
of the right type, so nothing bad reaches a scheduler pass; and whatever still makes one
schedule fail in a pass (a value set on it afterwards, a bug) is reported under its name while
the schedules declared after it are enqueued as usual.
"""

from __future__ import annotations

import math
import re
import subprocess
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, ConfigurationError, Context
from jobguard.scheduler import Scheduler
from tests.e2e.test_cli import run_process


def handler(ctx: Context, tick: datetime) -> None:
    """A periodic handler that does nothing."""


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"jitter_s": math.inf}, "jitter_s must be a finite number of seconds"),
        ({"jitter_s": 1e300}, "jitter_s must be >= 0 and at most"),
        ({"jitter_s": "5"}, "jitter_s must be a number of seconds, not '5'"),
        ({"jitter_s": True}, "jitter_s must be a number of seconds, not True"),
        ({"dedup_window_s": math.nan}, "dedup_window_s must be a finite number of seconds"),
        ({"grace_s": math.nan, "missed": "skip"}, "grace_s must be a finite number of seconds"),
        ({"grace_s": -1}, "grace_s must be >= 0"),
        ({"every": 10**12}, "every must be > 0 and at most"),
        ({"every": math.nan}, "every must be a finite number of seconds"),
        ({"every": "60"}, "every must be a number of seconds, not '60'"),
        ({"every": 0}, "every must be > 0"),
        ({"every": timedelta(days=365 * 100)}, "every must be > 0 and at most"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_bad_schedule_numbers_are_refused_at_declaration(
    app: App, options: dict[str, Any], reason: str
) -> None:
    """inf, 1e300, NaN, text and ``bool`` for jitter_s, dedup_window_s, grace_s and every:
    a ``ConfigurationError`` naming the schedule and the option, and nothing is registered."""
    options.setdefault("every", 60)
    with pytest.raises(ConfigurationError, match=re.escape(reason)) as raised:
        app.periodic(name="careless", **options)(handler)
    if "every" not in reason:
        assert "periodic task 'careless'" in str(raised.value)
    assert app.schedules == {}
    assert app.tasks == {}


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, -1, "1", True])
def test_a_bad_poll_interval_is_refused(app: App, value: Any) -> None:
    app.periodic(every=60, name="beat")(handler)
    with pytest.raises(ConfigurationError, match="poll_interval_s must be"):
        Scheduler(app, poll_interval_s=value, install_signal_handlers=False)


def test_a_schedule_failing_in_a_pass_does_not_stop_the_others(store_app: App) -> None:
    """A schedule made unusable after declaration (its jitter set to inf by hand) fails in every
    pass with its name and reason; the schedules around it are enqueued all the same."""
    app = store_app
    for name in ("first", "broken", "last"):
        app.periodic(every=1, name=name, grace_s=3600)(handler)
    app.schedules["broken"].jitter_s = math.inf
    runner = Scheduler(app, install_signal_handlers=False)
    stored = runner.run_pending()
    assert sorted(job.task for job in stored) == ["first", "last"]
    assert list(runner.failures) == ["broken"]
    assert "delay_s must be a finite number" in runner.failures["broken"]
    assert runner.stats.failed == 1
    runner.run(once=True)
    assert runner.stats.failed == 2


SCHEDULED_APP = """
import math
from jobguard import App

app = App({url!r})


@app.periodic(every=1, name="first", grace_s=3600)
def first(ctx, tick):
    pass


@app.periodic(every=1, name="broken", grace_s=3600)
def broken(ctx, tick):
    pass


broken.jitter_s = math.inf  # set after declaration: only the scheduler pass finds it


@app.periodic(every=1, name="last", grace_s=3600)
def last(ctx, tick):
    pass
"""

CARELESS_APP = """
from jobguard import App

app = App({url!r})


@app.periodic(every=1, name="beat", jitter_s={jitter})
def beat(ctx, tick):
    pass
"""


def jobguard(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_process(list(args), tmp_path)


def test_scheduler_once_enqueues_the_others_and_exits_1_naming_the_broken_one(
    store_url: str, tmp_path: Path
) -> None:
    """``jobguard scheduler --once`` (a real process): the good schedules' ticks are enqueued,
    the broken one is named on one ``error:`` line, and the exit code is 1, not 0."""
    module = f"sched_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(SCHEDULED_APP.format(url=store_url))
    if store_url.startswith("postgresql"):
        assert jobguard(tmp_path, "--url", store_url, "migrate").returncode == 0
    result = jobguard(tmp_path, "--app", f"{module}:app", "scheduler", "--once")
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "schedule 'broken'" in errors[0]
    assert "Traceback" not in result.stderr
    app = App(store_url)
    try:
        assert sorted(job.task for job in app.jobs()) == ["first", "last"]
    finally:
        app.close()


@pytest.mark.parametrize("jitter", ["float('inf')", "1e300", "float('nan')", "'5'"])
def test_a_module_declaring_a_bad_schedule_exits_2_with_one_line(
    tmp_path: Path, jitter: str
) -> None:
    """``--app`` naming a module with a bad schedule: ``scheduler --once`` and ``schedules``
    exit 2 with one line naming jitter_s, before touching any store."""
    module = f"sched_{uuid.uuid4().hex[:10]}"
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    (tmp_path / f"{module}.py").write_text(CARELESS_APP.format(url=url, jitter=jitter))
    for command in (["scheduler", "--once"], ["schedules"]):
        result = jobguard(tmp_path, "--app", f"{module}:app", *command)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        assert "jitter_s" in lines[0]
    assert not (tmp_path / "jobs.db").exists()


def test_scheduler_poll_interval_nan_exits_2_with_one_line(tmp_path: Path) -> None:
    module = f"sched_{uuid.uuid4().hex[:10]}"
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    (tmp_path / f"{module}.py").write_text(CARELESS_APP.format(url=url, jitter="0"))
    result = jobguard(tmp_path, "--app", f"{module}:app", "scheduler", "--poll-interval-s", "nan")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "poll_interval_s" in lines[0]

"""Concurrency limit options: checked where they are given, naming what is wrong (#17, G13).

A limit that is not a whole number from 1 to 1000, a key without a limit, a limit without a key
and a key template that cannot be rendered are refused by the line that gives them, and a
refused enqueue stores nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, ConfigurationError, Context, KeyTemplateError
from jobguard.models import JobStatus

BAD_LIMITS = [0, -1, 1001, 1.5, math.nan, math.inf, True, "3", 2**70]


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'limits.db'}")


def handler(ctx: Context, account: int = 0) -> None:
    """A task body; never run here."""


@pytest.mark.parametrize("bad", BAD_LIMITS)
def test_a_task_limit_that_is_not_a_whole_number_from_1_to_1000_is_refused(
    app: App, bad: Any
) -> None:
    with pytest.raises(ConfigurationError, match=r"task 't': concurrency_limit must be"):
        app.task(name="t", concurrency_key="account:{account}", concurrency_limit=bad)(handler)
    assert "t" not in app.tasks


@pytest.mark.parametrize("bad", BAD_LIMITS)
def test_a_per_call_limit_that_is_not_a_whole_number_from_1_to_1000_is_refused(
    app: App, bad: Any
) -> None:
    task = app.task(name="t", concurrency_key="account:{account}", concurrency_limit=3)(handler)
    with pytest.raises(ConfigurationError, match=r"concurrency_limit must be"):
        task.options(concurrency_limit=bad)


def test_a_key_without_a_limit_is_refused_when_the_task_is_defined(app: App) -> None:
    with pytest.raises(ConfigurationError, match="concurrency_key needs a concurrency_limit"):
        app.task(name="t", concurrency_key="account:{account}")(handler)


def test_a_key_template_naming_no_argument_is_refused_when_the_task_is_defined(app: App) -> None:
    with pytest.raises(ConfigurationError, match=r"names 'customer'"):
        app.task(name="t", concurrency_key="account:{customer}", concurrency_limit=3)(handler)


def test_a_refused_enqueue_stores_nothing(app: App) -> None:
    """A limit without a key, a per-call key without any limit, a key from a float or an empty
    literal key: each refused at the enqueue, naming it, with nothing stored."""
    limited = app.task(name="limited", concurrency_limit=3)(handler)
    plain = app.task(name="plain")(handler)
    keyed = app.task(name="keyed", concurrency_key="account:{account}", concurrency_limit=3)(
        handler
    )
    with pytest.raises(ConfigurationError, match="concurrency_key 'x' needs a concurrency_limit"):
        plain.options(concurrency_key="x").enqueue()
    with pytest.raises(ConfigurationError, match="concurrency_limit needs a concurrency_key"):
        plain.options(concurrency_limit=2).enqueue()
    with pytest.raises(ConfigurationError, match="concurrency_limit needs a concurrency_key"):
        limited.enqueue()
    with pytest.raises(KeyTemplateError, match="argument 'account' is a float"):
        keyed.enqueue(account=1.5)
    with pytest.raises(KeyTemplateError, match="concurrency_key must be non-empty text"):
        keyed.options(concurrency_key=" ").enqueue(account=1)
    assert sum(app.counts().values()) == 0


def test_per_call_options_win_and_are_stored_with_the_job(app: App) -> None:
    """The key and limit in force are the job's own: a per-call key and limit replace the
    task's, and a task's limit serves a per-call key."""
    keyed = app.task(name="keyed", concurrency_key="account:{account}", concurrency_limit=3)(
        handler
    )
    limited = app.task(name="limited", concurrency_limit=10)(handler)
    default = app.get_job(keyed.enqueue(account=7).id)
    override = app.get_job(keyed.options(concurrency_key="vip", concurrency_limit=1).enqueue().id)
    exports = app.get_job(limited.options(concurrency_key="exports").enqueue().id)
    assert (default.concurrency_key, default.concurrency_limit) == ("account:7", 3)
    assert (override.concurrency_key, override.concurrency_limit) == ("vip", 1)
    assert (exports.concurrency_key, exports.concurrency_limit) == ("exports", 10)
    assert default.lock_ttl_s == 30.0  # the slot's length, as a lock's
    assert app.counts()[JobStatus.QUEUED] == 3

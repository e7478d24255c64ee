"""Every number is checked where it is given, with a message naming it and its range (G13).

NaN, infinity, negatives, ``True`` for an int, text for a number and 2**70 are refused by the
line that gives them (App, ``app.task``, ``task.options``, ``Retry``, ``Worker``, ``App.lock``),
never later as a store error, a job that never runs or a dead heartbeat. No store is opened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, ConfigurationError, Context, Retry, Worker
from jobguard.core import checks

HOSTILE_SECONDS = [math.nan, math.inf, -math.inf, -1.0, True, "5", None, 2**70, 1e300]
HOSTILE_INTS = [math.nan, 1.5, True, "3", 2**70, -(2**70)]


@pytest.fixture
def offline_app(tmp_path: Path) -> App:
    """An app whose store these tests never open."""
    return App(f"sqlite:///{tmp_path / 'never-opened.db'}")


def handler(ctx: Context, n: int = 0) -> None:
    """A task body; never run here."""


def _task_option(name: str) -> Callable[[App, Any], object]:
    return lambda app, value: app.task(name="t", **{name: value})(handler)


def _call_option(name: str) -> Callable[[App, Any], object]:
    return lambda app, value: app.task(name="t")(handler).options(**{name: value})


SECONDS_OPTIONS: dict[str, Callable[[App, Any], object]] = {
    "visibility_timeout_s": _task_option("visibility_timeout_s"),
    "backoff_base_s": _task_option("backoff_base_s"),
    "backoff_cap_s": _task_option("backoff_cap_s"),
    "lock_ttl_s": _task_option("lock_ttl_s"),
    "max_defer_s": _task_option("max_defer_s"),
    "dedup_window_s": _task_option("dedup_window_s"),
    "delay_s": _call_option("delay_s"),
    "queue_visibility_timeouts_s": lambda app, v: App(
        app.url, queue_visibility_timeouts_s={"q": v}
    ),
    "Retry(delay_s=...)": lambda app, v: Retry(delay_s=v),
    "grace_s": lambda app, v: Worker(app, ["default"], grace_s=v),
    "poll_interval_s": lambda app, v: Worker(app, ["default"], poll_interval_s=v),
    "ttl_s": lambda app, v: app.lock("r", ttl_s=v).__enter__(),
    "older_than_s": lambda app, v: app.prune(v),
}
INT_OPTIONS: dict[str, Callable[[App, Any], object]] = {
    "max_attempts": _task_option("max_attempts"),
    "poison_threshold": _task_option("poison_threshold"),
    "priority": _task_option("priority"),
    "priority ": _call_option("priority"),  # per call (the trailing space keeps the key unique)
    "max_payload_bytes": lambda app, v: App(app.url, max_payload_bytes=v),
    "concurrency": lambda app, v: Worker(app, ["default"], concurrency=v),
    "prefetch": lambda app, v: Worker(app, ["default"], prefetch=v),
    "limit": lambda app, v: app.jobs(limit=v),
}


# None means "the default" for these two, so it is no hostile value there.
NONE_IS_DEFAULT = {"visibility_timeout_s", "Retry(delay_s=...)"}


@pytest.mark.parametrize(
    ("option", "value"),
    [
        (option, value)
        for option in sorted(SECONDS_OPTIONS)
        for value in HOSTILE_SECONDS
        if not (value is None and option in NONE_IS_DEFAULT)
    ],
    ids=repr,
)
def test_a_duration_that_cannot_work_is_refused_where_it_is_given(
    offline_app: App, option: str, value: Any
) -> None:
    """Durations: finite seconds, not negative, at most ten years; the message names them."""
    with pytest.raises(ConfigurationError) as refused:
        SECONDS_OPTIONS[option](offline_app, value)
    message = str(refused.value)
    assert option.split("(", maxsplit=1)[0] in message
    assert "seconds" in message
    assert not Path(offline_app.url.removeprefix("sqlite:///")).exists()


@pytest.mark.parametrize("value", HOSTILE_INTS, ids=repr)
@pytest.mark.parametrize("option", sorted(INT_OPTIONS))
def test_a_count_or_priority_that_cannot_work_is_refused_with_its_range(
    offline_app: App, option: str, value: Any
) -> None:
    """Whole numbers in range only: ``True``, ``1.5``, ``"3"`` and ``2**70`` are refused."""
    with pytest.raises(ConfigurationError) as refused:
        INT_OPTIONS[option](offline_app, value)
    message = str(refused.value)
    assert option.strip() in message
    assert " to " in message
    assert not Path(offline_app.url.removeprefix("sqlite:///")).exists()


def test_priority_bounds_are_those_of_a_32_bit_column(offline_app: App) -> None:
    """The extremes are accepted; one past them is not."""
    task = offline_app.task(name="t")(handler)
    assert task.options(priority=checks.MAX_PRIORITY).call_options.priority == 2**31 - 1
    assert task.options(priority=checks.MIN_PRIORITY).call_options.priority == -(2**31)
    with pytest.raises(ConfigurationError, match=r"priority must be from -2147483648 to"):
        task.options(priority=2**31)


def test_an_unknown_enqueue_option_is_named(offline_app: App) -> None:
    """``app.enqueue(..., dealy_s=5)`` says which option does not exist, not a TypeError."""
    offline_app.task(name="t")(handler)
    with pytest.raises(ConfigurationError, match=r"unknown enqueue option\(s\) dealy_s"):
        offline_app.enqueue("t", {}, dealy_s=5)


@pytest.mark.parametrize("bad", [ValueError("x"), "ValueError", (int,)])
def test_fatal_and_transient_must_be_exception_classes(offline_app: App, bad: Any) -> None:
    """``fatal=ValueError("x")`` would never match anything; refuse it at registration."""
    for option in ("fatal", "transient"):
        with pytest.raises(ConfigurationError, match=f"{option} must be a tuple of exception"):
            offline_app.task(name=f"t-{option}", **{option: bad})(handler)

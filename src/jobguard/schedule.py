"""Periodic tasks: a handler, when it fires, and what happens to ticks nobody enqueued in time.

Each tick becomes one job of the schedule's task, with the dedup key and the operation key
``schedule:NAME@TICK`` (the tick as ISO-8601 UTC text): the store's cursor keeps a tick from being
enqueued twice, the dedup key holds it for ``dedup_window_s`` more, and the operation record
keeps a tick that ran from running again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jobguard.core import checks
from jobguard.core.keys import template_fields
from jobguard.core.schedules import (
    Missed,
    Trigger,
    jitter_offset_s,
    next_ticks,
    parse_tick_text,
    tick_key,
    tick_text,
)
from jobguard.exceptions import ConfigurationError, Fatal
from jobguard.models import JobSpec
from jobguard.task import CallOptions, Task

TICK_ARGUMENT = "tick"


def check_tick_handler(name: str, fn: Callable[..., Any]) -> None:
    """A periodic handler is called as ``fn(ctx, tick)``; refuse one that cannot be."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ConfigurationError(
            f"periodic task {name!r}: the handler must take (ctx, tick), "
            "tick being the scheduled time"
        ) from None
    except ValueError:
        return  # no signature to inspect (a builtin): trust it


def check_operation_template(name: str, template: str) -> None:
    """Every tick needs its own operation: a template must use ``{tick}``."""
    if TICK_ARGUMENT not in template_fields(template):
        raise ConfigurationError(
            f"periodic task {name!r}: operation_key {template!r} must contain {{tick}}, "
            "or every tick after the first would count as already done"
        )


class Schedule:
    """A declared periodic task; created by :meth:`jobguard.App.periodic`.

    Call it as ``schedule(ctx, tick)`` to run the handler inline (no queue, no guard).
    """

    def __init__(
        self,
        task: Task,
        fn: Callable[..., Any],
        *,
        trigger: Trigger,
        missed: Missed,
        grace_s: float,
        jitter_s: float,
        dedup_window_s: float,
    ) -> None:
        try:
            grace_s = checks.seconds("grace_s", grace_s)
            jitter_s = checks.seconds("jitter_s", jitter_s)
            dedup_window_s = checks.seconds("dedup_window_s", dedup_window_s)
        except ConfigurationError as exc:
            raise ConfigurationError(f"periodic task {task.name!r}: {exc}") from None
        self.task = task
        self.fn = fn
        self.trigger = trigger
        self.missed = missed
        self.grace_s = float(grace_s)
        self.jitter_s = float(jitter_s)
        self.dedup_window_s = float(dedup_window_s)
        self.__doc__ = fn.__doc__

    @property
    def name(self) -> str:
        """The schedule's name: its task's registered name."""
        return self.task.name

    def __call__(self, ctx: Any, tick: datetime) -> Any:
        """Run the handler directly with a tick of your choice."""
        return self.fn(ctx, tick)

    def __repr__(self) -> str:
        return f"<Schedule {self.name} {self.trigger.describe()} missed={self.missed.describe()}>"

    def tick_time(self, tick: int) -> datetime:
        """A tick as the aware datetime its handler receives (in the schedule's time zone)."""
        return datetime.fromtimestamp(tick, tz=self.trigger.tz)

    def next_fire_times(self, after: datetime, count: int = 3) -> list[datetime]:
        """The next ``count`` scheduled times strictly after ``after`` (an aware datetime)."""
        if after.tzinfo is None:
            raise ConfigurationError("after must be an aware datetime")
        return [self.tick_time(t) for t in next_ticks(self.trigger, after.timestamp(), count)]

    def tick_spec(self, tick: int, now: float) -> JobSpec:
        """The job of one tick, to run at the tick (plus its jitter) on the store clock ``now``."""
        run_at = tick + jitter_offset_s(self.name, tick, self.jitter_s)
        return self.task.build_spec(
            {TICK_ARGUMENT: tick_text(tick)},
            CallOptions(
                dedup_key=tick_key(self.name, tick),
                dedup_window_s=self.dedup_window_s,
                delay_s=max(0.0, run_at - now),
            ),
        )


def tick_runner(fn: Callable[..., Any], trigger: Trigger) -> Callable[..., Any]:
    """The task handler of a schedule: turns the stored tick text back into a datetime."""

    def run_tick(ctx: Any, tick: str) -> Any:
        try:
            moment = datetime.fromtimestamp(parse_tick_text(tick), tz=trigger.tz)
        except ValueError as exc:
            raise Fatal(str(exc)) from exc  # a hand-made job with a bad tick: no retry helps
        return fn(ctx, moment)

    run_tick.__module__ = fn.__module__
    run_tick.__qualname__ = getattr(fn, "__qualname__", run_tick.__qualname__)
    run_tick.__name__ = getattr(fn, "__name__", run_tick.__name__)
    run_tick.__doc__ = fn.__doc__
    return run_tick

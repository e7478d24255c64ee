"""Which time limits a worker can enforce (#17).

A soft limit (``soft_time_limit_s``) tells the run to stop: ``ctx`` reports it, its next step
raises, an ``async def`` handler is cancelled, and the worker gives the run up one heartbeat
later if it did not end. Every worker enforces it. A hard limit (``time_limit_s``) stops a run
that never cooperates: only a worker whose handlers run in child processes can kill one, so a
thread-mode worker refuses to start with a task that has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobguard.exceptions import ConfigurationError

if TYPE_CHECKING:
    from jobguard.task import Task


def refuse_hard_limits(tasks: Iterable[Task]) -> None:
    """Raise a ConfigurationError naming the tasks with a hard time limit (thread mode)."""
    limited = sorted(
        f"{task.name!r} (time_limit_s={task.time_limit_s:g})"
        for task in tasks
        if task.time_limit_s is not None
    )
    if limited:
        raise ConfigurationError(
            f"task {', '.join(limited)} has a hard time limit, which a thread-mode worker "
            "cannot enforce (a thread cannot be stopped): run it on a process-mode worker "
            "(jobguard worker --processes N), or give it soft_time_limit_s only"
        )

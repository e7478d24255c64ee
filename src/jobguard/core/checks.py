"""Checks of the numbers users give jobguard: durations, counts, priorities (guarantee G13).

Every option is checked where it is given, so a bad value fails at that line with a message
naming the option and its allowed range, instead of surfacing later as a store error, a job
that never runs or a dead heartbeat. ``bool`` is refused where a number is expected (``True``
is an ``int`` to Python, never what the caller meant), and so are text, NaN and infinity.
"""

from __future__ import annotations

import math
from typing import Any

from jobguard.exceptions import ConfigurationError

# Ten years: longer than any lease, lock, delay or window that means something, and far inside
# what every store's timestamp arithmetic and ``threading.Event.wait`` accept.
MAX_DURATION_S = 10 * 365 * 24 * 3600.0
# Priorities are stored in a 32-bit signed integer column on every backend.
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1
# Counts (attempts, thresholds, limits, sizes) stay within a 32-bit signed integer too.
MAX_COUNT = 2**31 - 1
# Largest job or attempt id a command may name (a 64-bit signed integer column).
MAX_ID = 2**63 - 1
# Most slots one concurrency key may have: a begin looks at each of a key's slots.
MAX_CONCURRENCY = 1000


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, not {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds (0 to {MAX_DURATION_S:g}), not {value!r}"
        )
    return number


def seconds(name: str, value: Any, *, positive: bool = False) -> float:
    """A duration in seconds: finite, ``>= 0`` (``> 0`` if ``positive``), at most ten years."""
    number = _number(name, value)
    low_ok = number > 0 if positive else number >= 0
    if not low_ok or number > MAX_DURATION_S:
        bound = "> 0" if positive else ">= 0"
        raise ConfigurationError(
            f"{name} must be {bound} and at most {MAX_DURATION_S:g} seconds (ten years), "
            f"not {value!r}"
        )
    return number


def optional_seconds(name: str, value: Any, *, positive: bool = False) -> float | None:
    """:func:`seconds`, or ``None`` left as is."""
    return None if value is None else seconds(name, value, positive=positive)


def integer(name: str, value: Any, low: int, high: int) -> int:
    """A whole number in ``[low, high]``; ``bool``, ``float`` and text are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an integer from {low} to {high}, not {value!r}")
    if not low <= value <= high:
        raise ConfigurationError(f"{name} must be from {low} to {high}, not {value}")
    return int(value)


def priority(name: str, value: Any) -> int:
    """A job priority: an integer that fits a 32-bit signed column."""
    return integer(name, value, MIN_PRIORITY, MAX_PRIORITY)


def count(name: str, value: Any, low: int = 1) -> int:
    """A count of things (attempts, jobs, bytes) from ``low`` up to ``2**31 - 1``."""
    return integer(name, value, low, MAX_COUNT)


def concurrency_limit(name: str, value: Any) -> int:
    """How many runs of one concurrency key may hold a slot at once: 1 to 1000."""
    return integer(name, value, 1, MAX_CONCURRENCY)


def job_id(value: Any) -> int:
    """A job id: a positive integer that fits the store's 64-bit id column."""
    return integer("job id", value, 1, MAX_ID)


def text_problem(value: Any) -> str | None:
    """What keeps ``value`` from being stored as text on every backend, or ``None``.

    PostgreSQL cannot store a NUL character (SQLite can) nor lone surrogates: refused where
    they are given, such text would otherwise come back from the store as an outage.
    """
    if not isinstance(value, str) or not value.strip():
        return f"must be non-empty text, not {value!r}"
    if "\x00" in value:
        return f"must not contain a NUL character (\\x00): {value!r}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode text: {exc.reason}"
    return None


def text(name: str, value: Any) -> str:
    """Non-empty text that every backend stores as given (see :func:`text_problem`)."""
    problem = text_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{name} {problem}")
    return str(value)


def optional_text(name: str, value: Any) -> str | None:
    """:func:`text`, or ``None`` left as is."""
    return None if value is None else text(name, value)


def exception_classes(name: str, value: Any) -> tuple[type[BaseException], ...]:
    """A tuple of exception classes (``fatal=``, ``transient=``)."""
    items = tuple(value) if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(
                f"{name} must be a tuple of exception classes, but it holds {item!r}"
            )
    return items


MAX_ACTOR_CHARS = 200


def actor(value: Any) -> str:
    """Who an operator action is by (the audit trail's actor): 1 to 200 printable characters."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_ACTOR_CHARS
        or not value.isprintable()
    ):
        raise ConfigurationError(
            f"actor must be 1 to {MAX_ACTOR_CHARS} printable characters, got {value!r:.60}"
        )
    return value

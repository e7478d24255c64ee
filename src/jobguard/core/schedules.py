"""When periodic ticks fall, and which of them a scheduler enqueues (pure, no I/O).

A tick is a whole second since the Unix epoch (UTC). Cron expressions are evaluated by
``cronsim`` in an IANA time zone from ``zoneinfo``, so daylight-saving changes follow the
zone's rules: a time of day that does not exist on a spring-forward day fires once, right after
the gap; a time of day that happens twice on a fall-back day fires once, the first time (as
Debian's cron does). Expressions whose minute or hour field starts with ``*`` count real time, so
``*/5 * * * *`` fires every five minutes through both changes. Interval ticks are multiples of
the interval since the epoch, in UTC, so every process computes the same ones.

Which ticks are due is decided from the cursor a store keeps per schedule (the newest tick
already decided) and the store's clock; see :func:`plan_ticks`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobguard.core import checks
from jobguard.exceptions import ConfigurationError

SKIP = "skip"
LAST = "last"
MAX_CATCH_UP = 10_000
# More than any daylight-saving shift (at most two hours anywhere).
WALL_CLOCK_MARGIN_S = 3 * 3600


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name``; ``ValueError`` naming what is wrong."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"timezone must be an IANA name like 'Europe/Berlin', got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r} (an IANA name like 'Europe/Berlin')") from exc


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression (5 fields, or 6 with seconds first) read in an IANA time zone."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        tz = zone(self.timezone)
        if not isinstance(self.expression, str):
            raise ValueError(f"cron expression must be text, got {self.expression!r}")
        try:
            probe = CronSim(self.expression, datetime(2000, 1, 1, tzinfo=tz))
            next(probe)
        except CronSimError as exc:
            raise ValueError(f"invalid cron expression {self.expression!r}: {exc}") from exc
        except StopIteration:
            raise ValueError(f"cron expression {self.expression!r} never fires") from None

    @property
    def tz(self) -> tzinfo:
        """The time zone the expression is read in."""
        return ZoneInfo(self.timezone)

    @property
    def wall_clock(self) -> bool:
        """Whether cronsim reads it on the local wall clock (fixed times of day, as cron does).

        That is a 5-field expression whose minute and hour fields do not start with ``*``, in a
        zone other than UTC; the others count real time.
        """
        fields = self.expression.split()
        return (
            self.timezone != "UTC"
            and len(fields) == 5
            and not fields[0].startswith("*")
            and not fields[1].startswith("*")
        )

    def describe(self) -> str:
        """``cron '*/5 * * * *' Europe/Berlin``."""
        return f"cron '{self.expression}' {self.timezone}"


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval of whole seconds; ticks are its multiples since the epoch (UTC)."""

    seconds: int

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int):
            raise ValueError(f"interval must be a whole number of seconds, got {self.seconds!r}")
        if not 1 <= self.seconds <= checks.MAX_DURATION_S:
            raise ValueError(
                f"interval must be from 1 second to {checks.MAX_DURATION_S:g} (ten years), "
                f"got {self.seconds}"
            )

    @property
    def tz(self) -> tzinfo:
        """Interval ticks are handed over in UTC."""
        return UTC

    def describe(self) -> str:
        """``every 300s``."""
        return f"every {self.seconds}s"


Trigger = Cron | Every


def interval_seconds(every: float | timedelta) -> int:
    """A whole number of seconds from ``every`` (seconds or a ``timedelta``); ``ValueError``.

    At most ten years (:data:`~jobguard.core.checks.MAX_DURATION_S`): every tick must stay a
    date that can be written down.
    """
    seconds: object = every.total_seconds() if isinstance(every, timedelta) else every
    try:
        number = checks.seconds("every", seconds, positive=True)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    if number != int(number):
        raise ValueError(f"every must be a whole number of seconds, got {number}")
    return int(number)


@dataclass(frozen=True, slots=True)
class Missed:
    """What to do with ticks no scheduler enqueued in time: at most ``limit`` of the newest.

    ``limit == 0`` is ``skip`` (only an on-time tick runs), ``1`` is ``last`` (the newest due
    tick runs, on time or not), ``N`` catches up the newest ``N`` due ticks.
    """

    limit: int

    @classmethod
    def parse(cls, value: str | int) -> Missed:
        """``"skip"``, ``"last"`` or a positive int N (catch up at most N); ``ValueError``."""
        if value == SKIP:
            return cls(0)
        if value == LAST:
            return cls(1)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CATCH_UP:
            return cls(value)
        raise ValueError(
            f"missed must be 'skip', 'last' or a number of ticks to catch up "
            f"(1 to {MAX_CATCH_UP}), got {value!r}"
        )

    def describe(self) -> str:
        """``skip``, ``last`` or ``catch up 5``."""
        if self.limit == 0:
            return SKIP
        return LAST if self.limit == 1 else f"catch up {self.limit}"


def _cron_after(trigger: Cron, after: int) -> CronSim:
    return CronSim(trigger.expression, datetime.fromtimestamp(after, tz=trigger.tz))


def next_tick(trigger: Trigger, after: float) -> int | None:
    """The first tick strictly after ``after`` (epoch seconds); ``None`` if it never fires."""
    start = math.floor(after)
    if isinstance(trigger, Every):
        return (start // trigger.seconds + 1) * trigger.seconds
    # cronsim reads fixed times of day on the local wall clock; after a fall-back the wall
    # clock repeats, so skip anything not strictly later in real time.
    for moment in _cron_after(trigger, start):
        tick = int(moment.timestamp())
        if tick > start:
            return tick
    return None


def next_ticks(trigger: Trigger, after: float, count: int) -> list[int]:
    """The first ``count`` ticks strictly after ``after``, ascending."""
    found: list[int] = []
    cursor: float = after
    while len(found) < count:
        tick = next_tick(trigger, cursor)
        if tick is None:
            break
        found.append(tick)
        cursor = tick
    return found


def ticks_back(trigger: Trigger, until: float, after: int, limit: int) -> list[int]:
    """Up to ``limit`` ticks ``t`` with ``after < t <= until``, newest first."""
    if limit <= 0:
        return []
    newest = math.floor(until)
    if isinstance(trigger, Every):
        first = newest // trigger.seconds * trigger.seconds
        ticks = range(first, after, -trigger.seconds)
        return list(ticks[:limit])
    # Walking back on the wall clock visits ticks in wall-clock order, which after a fall-back
    # is not real-time order: start a margin later and stop a margin past the oldest tick kept.
    margin = WALL_CLOCK_MARGIN_S if trigger.wall_clock else 0
    start = datetime.fromtimestamp(newest + margin + 1, tz=trigger.tz)
    found: set[int] = set()
    for moment in CronSim(trigger.expression, start, reverse=True):
        tick = int(moment.timestamp())
        if after < tick <= newest:
            found.add(tick)
        if tick <= after - margin or (
            len(found) >= limit and tick < sorted(found)[-limit] - margin
        ):
            break
    return sorted(found, reverse=True)[:limit]


@dataclass(frozen=True, slots=True)
class Plan:
    """A scheduler's decision: enqueue ``ticks`` (ascending) and move the cursor to ``cursor``."""

    ticks: tuple[int, ...]
    cursor: int


def plan_ticks(
    trigger: Trigger, missed: Missed, grace_s: float, cursor: int | None, now: float
) -> Plan | None:
    """Which ticks to enqueue now; ``None`` when no tick is due (nothing to write).

    The due ticks are those after ``cursor`` (the newest tick already decided) and at or before
    ``now``. The newest of them is *on time* if it is at most ``grace_s`` old; every other due
    tick was missed. ``missed`` keeps at most ``limit`` of the newest due ticks, and the on-time
    tick always runs. The cursor moves to the newest due tick either way, so a tick is decided
    once. A schedule with no cursor yet (first seen) owes nothing from before: only an on-time
    tick runs.
    """
    floor_after = cursor if cursor is not None else -(2**62)
    keep = max(missed.limit, 1) if cursor is not None else 1
    due = ticks_back(trigger, now, floor_after, keep)
    if not due:
        return None
    newest = due[0]
    if cursor is not None and missed.limit > 0:
        return Plan(ticks=tuple(reversed(due)), cursor=newest)
    on_time = now - newest <= grace_s
    return Plan(ticks=(newest,) if on_time else (), cursor=newest)


def tick_text(tick: int) -> str:
    """A tick as stable ISO-8601 UTC text, ``2026-03-29T01:00:00Z`` (keys and payloads)."""
    return datetime.fromtimestamp(tick, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


TICK_KEY_PREFIX = "schedule:"


def tick_key(name: str, tick: int) -> str:
    """The dedup key (and default operation key) of one tick: ``schedule:NAME@TICK``."""
    return f"{TICK_KEY_PREFIX}{name}@{tick_text(tick)}"


def is_tick_key(key: str, name: str) -> bool:
    """Whether ``key`` is the key :func:`tick_key` gives a tick of the schedule ``name``."""
    prefix = f"{TICK_KEY_PREFIX}{name}@"
    if not key.startswith(prefix):
        return False
    try:
        parse_tick_text(key[len(prefix) :])
    except ValueError:
        return False
    return True


def parse_tick_text(text: str) -> int:
    """The tick of :func:`tick_text` output; ``ValueError`` for anything else."""
    try:
        moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a tick (YYYY-MM-DDTHH:MM:SSZ): {text!r}") from exc
    return int(moment.timestamp())


def jitter_offset_s(name: str, tick: int, jitter_s: float) -> float:
    """A delay in ``[0, jitter_s)`` that every scheduler computes alike for one tick."""
    if jitter_s <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{name}@{tick}".encode(), digest_size=8).digest()
    return jitter_s * int.from_bytes(digest, "big") / 2**64

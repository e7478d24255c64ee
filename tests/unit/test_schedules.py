"""Tick arithmetic and the missed-tick decision (core/schedules.py): examples, DST, properties."""

from __future__ import annotations

import itertools
import math
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobguard.core.schedules import (
    Cron,
    Every,
    Missed,
    Trigger,
    interval_seconds,
    jitter_offset_s,
    next_tick,
    next_ticks,
    parse_tick_text,
    plan_ticks,
    tick_text,
    ticks_back,
)

BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str) -> int:
    """Epoch seconds of an ISO time with offset."""
    return int(datetime.fromisoformat(text).timestamp())


def local(ticks: list[int], tz: ZoneInfo = BERLIN) -> list[str]:
    return [datetime.fromtimestamp(t, tz=tz).isoformat() for t in ticks]


# -- declaration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "timezone", "reason"),
    [
        ("61 * * * *", "UTC", "invalid cron expression '61 * * * *': Bad minute"),
        ("* * *", "UTC", "Wrong number of fields"),
        ("0 0 30 2 *", "UTC", "Bad day-of-month"),
        ("*/5 * * * *", "Europe/Berlln", "unknown timezone 'Europe/Berlln'"),
        ("*/5 * * * *", "", "timezone must be an IANA name"),
    ],
)
def test_a_bad_cron_or_time_zone_is_refused_with_the_reason(
    expression: str, timezone: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        Cron(expression, timezone)


@pytest.mark.parametrize(
    ("every", "seconds"),
    [(5, 5), (60.0, 60), (timedelta(minutes=5), 300), (timedelta(days=1), 86400)],
)
def test_an_interval_is_whole_seconds(every: float | timedelta, seconds: int) -> None:
    assert Every(interval_seconds(every)).seconds == seconds


@pytest.mark.parametrize("every", [0.5, timedelta(milliseconds=1500), float("nan"), True, "5"])
def test_an_interval_that_is_not_whole_seconds_is_refused(every: object) -> None:
    with pytest.raises(ValueError, match="every must be"):
        interval_seconds(every)  # type: ignore[arg-type]


def test_an_interval_below_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="from 1 second to"):
        Every(0)


@pytest.mark.parametrize(
    ("value", "limit", "shown"), [("skip", 0, "skip"), ("last", 1, "last"), (5, 5, "catch up 5")]
)
def test_missed_policies_parse(value: str | int, limit: int, shown: str) -> None:
    policy = Missed.parse(value)
    assert policy.limit == limit
    assert policy.describe() == shown


@pytest.mark.parametrize("value", ["all", 0, -1, 10_001, True, 2.5])
def test_a_bad_missed_policy_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="missed must be 'skip', 'last' or a number"):
        Missed.parse(value)  # type: ignore[arg-type]


def test_tick_text_is_iso_utc_and_reads_back() -> None:
    tick = at("2026-03-29T03:00:00+02:00")
    assert tick_text(tick) == "2026-03-29T01:00:00Z"
    assert parse_tick_text(tick_text(tick)) == tick
    with pytest.raises(ValueError, match="not a tick"):
        parse_tick_text("2026-03-29 01:00")


def test_jitter_is_the_same_everywhere_and_within_bounds() -> None:
    offsets = {jitter_offset_s("report", t, 30.0) for t in range(1000)}
    assert all(0 <= offset < 30.0 for offset in offsets)
    assert len(offsets) > 900  # spread, not one value
    assert jitter_offset_s("report", 7, 30.0) == jitter_offset_s("report", 7, 30.0)
    assert jitter_offset_s("report", 7, 0.0) == 0.0


# -- fire times and daylight saving ------------------------------------------------------------


def test_interval_ticks_are_multiples_since_the_epoch() -> None:
    every = Every(300)
    assert next_tick(every, 1_000_000_000) == 1_000_000_200
    assert next_tick(every, 1_000_000_200) == 1_000_000_500  # strictly after
    assert ticks_back(every, 1_000_000_500.9, 1_000_000_000, 10) == [
        1_000_000_500,
        1_000_000_200,
    ]


def test_a_fixed_time_skipped_by_spring_forward_fires_once_right_after_the_gap() -> None:
    """Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist."""
    daily = Cron("30 2 * * *", "Europe/Berlin")
    ticks = next_ticks(daily, at("2026-03-27T12:00:00+01:00"), 3)
    assert local(ticks) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_a_fixed_time_repeated_by_fall_back_fires_once() -> None:
    """Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice."""
    daily = Cron("30 2 * * *", "Europe/Berlin")
    ticks = next_ticks(daily, at("2026-10-24T12:00:00+02:00"), 2)
    assert local(ticks) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    # Asked from inside the repeated hour (the second 02:10), it does not fire again that day.
    second_pass = at("2026-10-25T02:10:00+01:00")
    assert local([next_tick(daily, second_pass) or 0]) == ["2026-10-26T02:30:00+01:00"]


def test_a_fixed_time_before_the_repeated_hour_is_found_from_inside_it() -> None:
    """02:30 CEST fell before 02:14 CET (an hour later in real time), though not on the wall."""
    daily = Cron("30 2 * * *", "Europe/Berlin")
    found = ticks_back(daily, at("2026-10-25T02:14:00+01:00"), at("2026-10-25T00:00:00+02:00"), 5)
    assert local(found) == ["2026-10-25T02:30:00+02:00"]


@pytest.mark.parametrize(
    ("start", "gap_hour"),
    [("2026-03-29T00:00:00+01:00", "spring"), ("2026-10-25T00:00:00+02:00", "fall")],
)
def test_a_repeating_expression_counts_real_time_through_both_changes(
    start: str, gap_hour: str
) -> None:
    """``*/30`` fires every 30 real minutes: none lost in spring, none doubled in autumn."""
    half_hourly = Cron("*/30 * * * *", "Europe/Berlin")
    ticks = next_ticks(half_hourly, at(start), 10)
    assert all(b - a == 1800 for a, b in itertools.pairwise(ticks))
    labels = [moment[11:16] for moment in local(ticks)]
    if gap_hour == "spring":
        assert "02:00" not in labels
        assert "02:30" not in labels
    else:
        assert labels.count("02:00") == 2
        assert labels.count("02:30") == 2


# -- the decision -------------------------------------------------------------------------------


EVERY_S = Every(1)
T0 = 1_800_000_000


@pytest.mark.parametrize(
    ("missed", "now", "expected"),
    [
        # Schedulers down after T0 was decided; T1..T10 fell while none ran.
        ("skip", T0 + 10.5, ()),  # the newest (T10) is 0.5 s late: past the 0.2 s grace
        ("last", T0 + 10.5, (T0 + 10,)),
        (3, T0 + 10.5, (T0 + 8, T0 + 9, T0 + 10)),
        (20, T0 + 10.5, tuple(range(T0 + 1, T0 + 11))),
        # Back just in time for T10: it is on time under every policy.
        ("skip", T0 + 10.1, (T0 + 10,)),
        ("last", T0 + 10.1, (T0 + 10,)),
    ],
)
def test_the_gap_follows_the_policy(
    missed: str | int, now: float, expected: tuple[int, ...]
) -> None:
    plan = plan_ticks(EVERY_S, Missed.parse(missed), 0.2, T0, now)
    assert plan is not None
    assert plan.ticks == expected
    assert plan.cursor == T0 + 10  # every due tick is decided, run or not


def test_nothing_is_due_before_the_next_tick() -> None:
    assert plan_ticks(EVERY_S, Missed.parse("last"), 60, T0, T0 + 0.99) is None


def test_a_schedule_seen_first_owes_nothing_from_before() -> None:
    first = plan_ticks(EVERY_S, Missed.parse(100), 0.2, None, T0 + 0.1)
    assert first is not None
    assert first.ticks == (T0,)
    assert first.cursor == T0
    late = plan_ticks(EVERY_S, Missed.parse(100), 0.2, None, T0 + 0.5)
    assert late is not None
    assert late.ticks == ()
    assert late.cursor == T0


# -- properties ---------------------------------------------------------------------------------

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Around the 2026 changes of the zones above, plus ordinary days.
AROUND = [
    at("2026-03-08T00:00:00+00:00"),
    at("2026-03-29T00:00:00+00:00"),
    at("2026-04-05T00:00:00+00:00"),
    at("2026-10-04T00:00:00+00:00"),
    at("2026-10-25T00:00:00+00:00"),
    at("2026-11-01T00:00:00+00:00"),
]

minute_field = st.sampled_from(["*", "*/7", "*/15", "0", "30", "5,35", "10-20/5"])
hour_field = st.sampled_from(["*", "*/2", "1", "2", "3", "1-3", "0,2,4"])
crons = st.builds(
    lambda minute, hour, zone: Cron(f"{minute} {hour} * * *", zone),
    minute_field,
    hour_field,
    st.sampled_from(ZONES),
)
triggers: st.SearchStrategy[Trigger] = st.one_of(
    crons, st.builds(Every, st.sampled_from([1, 7, 60, 300, 3600, 86400]))
)
instants = st.builds(
    lambda base, offset: base + offset,
    st.sampled_from(AROUND),
    st.floats(min_value=0, max_value=3 * 86400, allow_nan=False),
)


@settings(max_examples=150, deadline=None)
@given(triggers, instants)
def test_next_tick_is_the_first_tick_strictly_after(trigger: Trigger, after: float) -> None:
    tick = next_tick(trigger, after)
    assert tick is not None
    assert tick > after
    assert ticks_back(trigger, tick - 1, int(after), 1) == []  # nothing in between


@settings(max_examples=300, deadline=None)
@given(
    triggers,
    instants,
    st.floats(min_value=0, max_value=2 * 86400),
    st.integers(min_value=1, max_value=12),
)
def test_walking_forward_and_back_find_the_same_ticks(
    trigger: Trigger, after: float, span_s: float, limit: int
) -> None:
    """Any window, across daylight-saving changes: the newest ``limit`` ticks found walking back
    are those found walking forward (cronsim's own reverse walk misses some after a fall-back)."""
    until = after + span_s
    forward: list[int] = []
    tick = next_tick(trigger, after)
    while tick is not None and tick <= until and len(forward) < 500:
        forward.append(tick)
        tick = next_tick(trigger, tick)
    back = ticks_back(trigger, until, int(after), limit)
    if len(forward) < 500:
        assert back == sorted(forward, reverse=True)[:limit]
    assert len(set(forward)) == len(forward)
    assert forward == sorted(forward)


@settings(max_examples=150, deadline=None)
@given(
    triggers,
    st.one_of(st.none(), instants.map(int)),
    instants,
    st.sampled_from(["skip", "last", 1, 3, 50]),
    st.floats(min_value=0, max_value=120),
)
def test_a_plan_enqueues_only_due_ticks_and_decides_them_once(
    trigger: Trigger,
    cursor: int | None,
    now: float,
    missed: str | int,
    grace_s: float,
) -> None:
    policy = Missed.parse(missed)
    plan = plan_ticks(trigger, policy, grace_s, cursor, now)
    if plan is None:
        newest = ticks_back(trigger, now, cursor if cursor is not None else -(2**62), 1)
        assert newest == []
        return
    assert all((cursor is None or t > cursor) and t <= now for t in plan.ticks)
    assert list(plan.ticks) == sorted(set(plan.ticks))
    assert len(plan.ticks) <= max(policy.limit, 1)
    assert plan.cursor <= now
    assert cursor is None or plan.cursor > cursor
    assert not plan.ticks or plan.ticks[-1] == plan.cursor  # the newest due tick, if any runs
    assert plan_ticks(trigger, policy, grace_s, plan.cursor, now) is None


@settings(max_examples=100, deadline=None)
@example(  # the repeated hour: 02:30 CEST must be found from 02:14 CET, one hour later
    trigger=Cron("30 2 * * *", "Europe/Berlin"),
    start=at("2026-10-25T02:00:00+02:00"),
    steps=[1.0, 1.0, 1.0, 896.0, 900.0, 900.0, 900.0],
)
@given(
    triggers,
    st.sampled_from(AROUND),
    st.lists(st.floats(min_value=0.001, max_value=900), min_size=1, max_size=40),
)
def test_passes_at_least_once_per_tick_enqueue_every_tick_exactly_once(
    trigger: Trigger, start: int, steps: list[float]
) -> None:
    """With enough catch-up, whatever the pass times, the enqueued ticks are exactly the ticks."""
    policy = Missed.parse(10_000)
    cursor: int | None = start
    now = float(start)
    enqueued: list[int] = []
    for step in steps:
        now += step
        plan = plan_ticks(trigger, policy, 0.0, cursor, now)
        if plan is not None:
            enqueued.extend(plan.ticks)
            cursor = plan.cursor
    # Every tick since the start: no pass is 10,000 ticks late, though all of them together may be.
    expected = sorted(ticks_back(trigger, now, start, math.ceil(now - start) + 1))
    assert enqueued == expected

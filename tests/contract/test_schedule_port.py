"""Conformance tests of the schedule port: the per-schedule cursor and its compare-and-set (#10).

Runs against every backend in ``conftest.BACKENDS``.
"""

from __future__ import annotations

import threading

from jobguard.backends.base import Backend
from jobguard.models import JobSpec, JobStatus, ScheduleState
from jobguard.testing import ControlledClock


def tick_spec(tick: int) -> JobSpec:
    """The job of one tick, keyed as the scheduler keys it."""
    key = f"schedule:report@{tick}"
    return JobSpec(
        task="report",
        queue="default",
        payload=f'{{"tick":"{tick}"}}',
        max_attempts=3,
        visibility_timeout_s=30.0,
        operation_key=key,
        dedup_key=key,
        dedup_window_s=86400.0,
    )


def test_a_new_schedule_has_no_state(backend: Backend) -> None:
    assert backend.schedule_states() == []


def test_the_first_advance_creates_the_cursor_and_enqueues(
    backend: Backend, clock: ControlledClock
) -> None:
    jobs = backend.advance_schedule("report", None, 100, [(100, tick_spec(100))])
    assert jobs is not None
    assert [job.status for job in jobs] == [JobStatus.QUEUED]
    assert backend.schedule_states() == [
        ScheduleState(
            name="report", cursor=100, last_tick=100, last_job_id=jobs[0].id, updated_at=clock()
        )
    ]


def test_a_cursor_moves_only_from_the_value_read(backend: Backend) -> None:
    """Compare-and-set: a stale ``expected`` (or a second first advance) writes nothing."""
    assert backend.advance_schedule("report", None, 100, []) == []
    assert backend.advance_schedule("report", None, 160, [(160, tick_spec(160))]) is None
    assert backend.advance_schedule("report", 40, 160, [(160, tick_spec(160))]) is None
    assert backend.find_jobs() == []
    moved = backend.advance_schedule("report", 100, 160, [(160, tick_spec(160))])
    assert moved is not None
    assert backend.advance_schedule("report", 100, 220, [(220, tick_spec(220))]) is None
    (state,) = backend.schedule_states()
    assert (state.cursor, state.last_tick, state.last_job_id) == (160, 160, moved[0].id)


def test_a_cursor_moved_past_skipped_ticks_keeps_the_last_enqueued_tick(backend: Backend) -> None:
    """A policy that runs nothing still moves the cursor; the newest enqueued tick stays."""
    backend.advance_schedule("report", None, 100, [(100, tick_spec(100))])
    assert backend.advance_schedule("report", 100, 400, []) == []
    (state,) = backend.schedule_states()
    assert (state.cursor, state.last_tick) == (400, 100)


def test_several_ticks_in_one_advance_are_all_or_nothing(backend: Backend) -> None:
    jobs = backend.advance_schedule(
        "report", None, 300, [(tick, tick_spec(tick)) for tick in (100, 200, 300)]
    )
    assert jobs is not None
    assert len({job.id for job in jobs}) == 3
    (state,) = backend.schedule_states()
    assert (state.last_tick, state.last_job_id) == (300, jobs[-1].id)


def test_an_enqueued_tick_is_deduplicated_if_written_again(backend: Backend) -> None:
    """Behind the cursor, the tick's dedup key holds: a reset cursor cannot make a second job."""
    (first,) = backend.advance_schedule("report", None, 100, [(100, tick_spec(100))]) or []
    (again,) = backend.advance_schedule("other", None, 100, [(100, tick_spec(100))]) or []
    assert again.deduplicated
    assert again.id == first.id


def test_concurrent_advances_from_one_cursor_let_exactly_one_through(backend: Backend) -> None:
    backend.advance_schedule("report", None, 100, [])
    results: list[object] = []
    barrier = threading.Barrier(8)

    def race(tick: int) -> None:
        barrier.wait()
        results.append(backend.advance_schedule("report", 100, tick, [(tick, tick_spec(tick))]))

    threads = [threading.Thread(target=race, args=(200 + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(result is not None for result in results) == 1
    assert len(backend.find_jobs()) == 1

"""Unit tests of the job state machine in ``jobguard.core.states`` (G1, G8)."""

from __future__ import annotations

import pytest

from jobguard.core.states import TRANSITIONS, Event, InvalidTransition, is_final, next_status
from jobguard.models import JobStatus

Q, R, C, D = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.DEAD


@pytest.mark.parametrize(
    ("current", "event", "after"),
    [
        (Q, Event.FETCH, R),
        (R, Event.FETCH, R),  # an expired lease is taken again
        (R, Event.FINISH, C),
        (R, Event.RETRY, Q),
        (R, Event.DEFER, Q),
        (R, Event.RELEASE, Q),
        (R, Event.BURY, D),
        (D, Event.REPLAY, Q),
        (Q, Event.RETRY_NOW, Q),  # only while its run time is ahead
    ],
)
def test_each_allowed_transition_leads_where_the_table_says(
    current: JobStatus, event: Event, after: JobStatus
) -> None:
    """G1, G2, G8: the lifecycle of a job, one row per allowed move."""
    assert next_status(current, event) == after


def test_the_table_has_exactly_the_documented_transitions() -> None:
    """G1.2: nothing else is allowed (a new edge must be added here on purpose)."""
    assert len(TRANSITIONS) == 9


@pytest.mark.parametrize(
    ("current", "event"),
    [
        (Q, Event.FINISH),  # acked without a delivery: the early-ack anti-pattern (G1.2)
        (Q, Event.RETRY),
        (Q, Event.RELEASE),
        (C, Event.FETCH),  # a completed job is never delivered again
        (C, Event.REPLAY),  # only dead jobs are replayed
        (C, Event.BURY),
        (Q, Event.BURY),  # a queued job is never buried: it is delivered, then settled
        (D, Event.FETCH),
        (D, Event.FINISH),
        (R, Event.REPLAY),
        (R, Event.RETRY_NOW),  # retry-now only hurries a job that waits
        (C, Event.RETRY_NOW),
        (D, Event.RETRY_NOW),  # a dead job is replayed instead
    ],
)
def test_a_transition_that_is_not_in_the_table_is_refused(current: JobStatus, event: Event) -> None:
    """G1.2, G8.3: illegal moves raise instead of silently changing state."""
    with pytest.raises(InvalidTransition, match=event.value):
        next_status(current, event)


def test_completed_has_no_way_out_and_dead_only_by_replay() -> None:
    """G8.3: completed is final; dead leaves only through a deliberate replay."""
    assert [e for (s, e) in TRANSITIONS if s == C] == []
    assert [e for (s, e) in TRANSITIONS if s == D] == [Event.REPLAY]
    assert is_final(C)
    assert is_final(D)
    assert not is_final(Q)
    assert not is_final(R)


def test_every_state_is_reachable_from_queued_and_every_event_is_used() -> None:
    """The table has no dead entries: each state and each event takes part."""
    reached = {Q}
    frontier = [Q]
    while frontier:
        state = frontier.pop()
        for (source, _event), target in TRANSITIONS.items():
            if source == state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(JobStatus)
    assert {event for (_s, event) in TRANSITIONS} == set(Event)

"""Conformance tests of the bulk DLQ selection's bounds (#17): a preview's cutoff keeps jobs
buried after it out of the count and the action, and the held count matches what a replay
leaves dead. Burial times come from the controlled store clock."""

from __future__ import annotations

from dataclasses import replace

from jobguard.backends.base import Backend
from jobguard.core.selection import DeadFilter
from jobguard.models import DeadCode
from jobguard.testing import ControlledClock
from tests.contract.test_queue_port import make_spec
from tests.contract.test_retry_now_port import CLOSING, ERROR
from tests.support.ports import bury, fetch_one, guard_of


def buried(backend: Backend, dedup_key: str | None = None) -> int:
    """Enqueue one job and bury it now (store clock); its id."""
    backend.enqueue(make_spec(dedup_key=dedup_key))
    guard = guard_of(fetch_one(backend))
    bury(backend, guard, CLOSING, code=DeadCode.EXHAUSTED, reason="spent", error=ERROR)
    return guard.job_id


def test_a_cutoff_selects_only_jobs_buried_before_it_for_count_replay_and_purge(
    backend: Backend, clock: ControlledClock
) -> None:
    shown = [buried(backend), buried(backend)]
    clock.advance(1.0)
    previewed = replace(DeadFilter(), cutoff=clock())
    assert backend.count_dead(previewed) == 2
    later = buried(backend)  # at the cutoff: after the preview read the clock
    clock.advance(1.0)
    latest = buried(backend)
    assert backend.count_dead(previewed) == 2
    assert [job.id for job in backend.select_dead(previewed, 10)] == shown

    batch = backend.replay_dead(previewed, 10)
    assert (batch.replayed, batch.held, batch.gone) == (shown, [], 0)
    assert {job.id for job in backend.dead_jobs(10)} == {later, latest}
    # The earlier of until and cutoff bounds the selection.
    assert backend.count_dead(replace(previewed, until=clock() + 5.0)) == 0
    assert backend.purge_dead(replace(DeadFilter(), cutoff=clock()), 10)[0] == 1
    assert [job.id for job in backend.dead_jobs(10)] == [latest]


def test_the_held_count_is_what_a_replay_in_id_order_leaves_dead(backend: Backend) -> None:
    first, second = buried(backend, "twice"), buried(backend, "twice")  # dead: key not held
    behind_live = buried(backend, "live")
    free, own = buried(backend), buried(backend, "own")
    holder = backend.enqueue(make_spec(queue="other", dedup_key="live"))
    everything = DeadFilter()
    assert backend.count_dead(everything) == 5
    assert backend.count_dead_held(everything) == 2  # the second "twice", and behind_live
    assert backend.count_dead_held(DeadFilter(queue="other")) == 0

    batch = backend.replay_dead(everything, 10)

    assert batch.replayed == [first, free, own]
    assert sorted(batch.held) == [(second, first), (behind_live, holder.id)]
    assert backend.count_dead_held(everything) == 2  # both still held, now by live jobs

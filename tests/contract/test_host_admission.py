"""QueuePort.admit_host_delivery: a host queue's delivery against its operation's shadow job.

The store carries out :func:`jobguard.core.hosts.admission` in one transaction: a new job leased
to the first delivery, a live lease holding off the others (nothing written), a job due later
handing deliveries back until then, an expired lease taken over (its attempt closed as lost, or
the job buried when its attempts are spent), a dead job acked, a completed one followed by a
new job for a late duplicate; each lease with an attempt naming the host's delivery.

QueuePort.reserve_host_job: a deduplicated send carries out :func:`jobguard.core.hosts.reservation`
the same way: a new job, the live one holding the key, or a live one left due with no delivery
for ``unsent_s`` taken over by the send.
"""

from __future__ import annotations

import json
from dataclasses import replace

from jobguard.backends.base import Backend, Closing, DeliveryRules, ErrorInfo, HostAdmission
from jobguard.core.hosts import Admit
from jobguard.models import DeadCode, Job, JobSpec, JobStatus, Outcome
from jobguard.testing import ControlledClock
from tests.support.ports import bury, finish, guard_of, retry

LEASE_S = 10.0
RULES = DeliveryRules(LEASE_S, max_attempts=2, lock_ttl_s=LEASE_S)


def spec(order: int = 1) -> JobSpec:
    return JobSpec(
        task="shop.fulfil",
        queue="host-celery",
        payload=f'{{"order_id":{order}}}',
        max_attempts=2,
        visibility_timeout_s=LEASE_S,
        operation_key=f"fulfil-order:{order}",
        resource_key=f"order:{order}",
        lock_ttl_s=LEASE_S,
        dedup_key=f"host:celery:shop.fulfil:fulfil-order:{order}",
    )


def admit(backend: Backend, delivery: str, order: int = 1) -> HostAdmission:
    return backend.admit_host_delivery(spec(order), "celery:host:1", RULES, delivery)


def test_the_first_delivery_gets_a_new_job_leased_and_a_live_lease_holds_off_the_next(
    backend: Backend, clock: ControlledClock
) -> None:
    first = admit(backend, "celery:t1#0")
    assert first.admit == Admit.INSERT
    assert first.prepared is not None
    assert first.prepared.delivery.attempt == 1
    # Begun in the admission's transaction, as a fetch begins: the lock and the claim held.
    begun = first.prepared.begun
    assert begun is not None
    assert begun.grant is not None
    assert begun.operation is not None
    clock.advance(4)
    second = admit(backend, "celery:t1#0")  # a visibility-timeout copy of the same message
    assert second.admit == Admit.HELD
    assert second.job_id == first.job_id
    assert abs(second.wait_s - (LEASE_S - 4)) < 0.01
    (attempt,) = backend.attempts(job_id=first.job_id)
    assert attempt.host_delivery == "celery:t1#0"
    assert admit(backend, "celery:t2#0", order=2).admit == Admit.INSERT  # another operation


def test_an_expired_lease_is_taken_over_and_a_spent_one_buries_the_job(
    backend: Backend, clock: ControlledClock
) -> None:
    first = admit(backend, "celery:t1#0")
    clock.advance(LEASE_S + 1)
    taken = admit(backend, "celery:t1#1")
    assert taken.admit == Admit.LEASE
    assert taken.prepared is not None
    assert taken.prepared.delivery.attempt == 2
    outcomes = [a.outcome for a in backend.attempts(job_id=first.job_id)]
    assert outcomes == [Outcome.LOST, Outcome.RUNNING]
    clock.advance(LEASE_S + 1)
    assert admit(backend, "celery:t1#2").admit == Admit.DEAD  # two attempts allowed, both lost
    job = backend.get_job(first.job_id)
    assert (job.status, job.dead_code) == (JobStatus.DEAD, DeadCode.LOST)
    assert admit(backend, "celery:t1#3").admit == Admit.DEAD  # and it stays acked as dead


def test_a_job_due_later_hands_deliveries_back_until_its_time(
    backend: Backend, clock: ControlledClock
) -> None:
    first = admit(backend, "celery:t1#0")
    assert first.prepared is not None
    error = ErrorInfo("OSError", "the warehouse timed out")
    retry(backend, guard_of(first.prepared.delivery), Closing(0.1), delay_s=30, error=error)
    early = admit(backend, "celery:t1#1")
    assert early.admit == Admit.EARLY
    assert abs(early.wait_s - 30) < 0.01
    clock.advance(30)
    due = admit(backend, "celery:t1#1")
    assert due.admit == Admit.LEASE
    assert due.job_id == first.job_id


def test_a_completed_job_gives_a_late_duplicate_a_job_of_its_own(
    backend: Backend, clock: ControlledClock
) -> None:
    first = admit(backend, "celery:t1#0")
    assert first.prepared is not None
    finish(backend, guard_of(first.prepared.delivery), Closing(0.1))
    late = admit(backend, "celery:t1#0")
    assert late.admit == Admit.INSERT
    assert late.job_id != first.job_id  # its pipeline acks it as already processed


def test_a_buried_job_acks_its_deliveries_until_it_is_replayed(
    backend: Backend, clock: ControlledClock
) -> None:
    first = admit(backend, "celery:t1#0")
    assert first.prepared is not None
    guard = guard_of(first.prepared.delivery)
    error = ErrorInfo("Fatal", "no such customer")
    bury(
        backend, guard, Closing(0.1), code=DeadCode.FATAL, reason="fatal", error=error,
        operation_key="fulfil-order:1",
    )  # fmt: skip
    assert admit(backend, "celery:t1#1").admit == Admit.DEAD
    backend.replay(first.job_id)
    replayed = admit(backend, "celery:replay#0")
    assert replayed.admit == Admit.LEASE
    assert replayed.job_id == first.job_id


def reserve(backend: Backend, message: str, unsent_s: float = 30.0, order: int = 1) -> Job:
    """A deduplicated send of ``order`` whose host message would be ``message``."""
    headers = json.dumps({"jobguard.host_id": message})
    return backend.reserve_host_job(replace(spec(order), headers=headers), unsent_s)


def test_a_send_reserves_the_operation_and_holds_off_the_next_while_a_delivery_may_come(
    backend: Backend, clock: ControlledClock
) -> None:
    first = reserve(backend, "m1")
    assert not first.deduplicated
    assert first.status == JobStatus.QUEUED
    clock.advance(29)
    held = reserve(backend, "m2")  # the first message may still be on its way
    assert held.deduplicated
    assert (held.id, held.headers) == (first.id, first.headers)
    assert not reserve(backend, "m3", order=2).deduplicated  # another operation


def test_a_reservation_no_delivery_took_within_unsent_s_is_taken_over_by_the_next_send(
    backend: Backend, clock: ControlledClock
) -> None:
    """Its producer died between storing it and sending its message: the key frees itself."""
    first = reserve(backend, "m1")
    clock.advance(30)
    retaken = reserve(backend, "m2")
    assert not retaken.deduplicated  # this send sends again
    assert retaken.id == first.id
    assert json.loads(retaken.headers or "{}") == {"jobguard.host_id": "m2"}
    clock.advance(29)
    again = reserve(backend, "m3")  # due from the retake on: held again
    assert again.deduplicated
    assert again.headers == retaken.headers
    # The new message's delivery leases the same job.
    assert admit(backend, "celery:m2#0").job_id == first.id


def test_a_running_job_is_held_while_its_lease_lives_and_retaken_once_long_expired(
    backend: Backend, clock: ControlledClock
) -> None:
    """A delivery that died with the host's message lost (in flight nowhere) frees the key
    ``unsent_s`` after its lease expired; a live lease never does."""
    reserve(backend, "m1")
    assert admit(backend, "celery:m1#0").admit == Admit.LEASE
    clock.advance(LEASE_S + 29)
    assert reserve(backend, "m2").deduplicated  # expired, but a delivery may still come
    clock.advance(1)
    retaken = reserve(backend, "m3")
    assert not retaken.deduplicated
    assert admit(backend, "celery:m3#0").admit == Admit.LEASE  # the lost attempt closed
    outcomes = [a.outcome for a in backend.attempts(job_id=retaken.id)]
    assert outcomes == [Outcome.LOST, Outcome.RUNNING]


def test_a_completed_job_does_not_hold_the_key(backend: Backend, clock: ControlledClock) -> None:
    first = reserve(backend, "m1")
    admitted = admit(backend, "celery:m1#0")
    assert admitted.admit == Admit.LEASE  # the reserved job, not a new one
    assert admitted.prepared is not None
    finish(backend, guard_of(admitted.prepared.delivery), Closing(0.1))
    second = reserve(backend, "m2")
    assert not second.deduplicated
    assert second.id != first.id

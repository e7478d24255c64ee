"""QueuePort.admit_host_delivery: a host queue's delivery against its operation's shadow job.

The store carries out :func:`jobguard.core.hosts.admission` in one transaction: a new job leased
to the first delivery, a live lease holding off the others (nothing written), a job due later
handing deliveries back until then, an expired lease taken over (its attempt closed as lost, or
the job buried when its attempts are spent), a dead job acked, a completed one followed by a
new job for a late duplicate; each lease with an attempt naming the host's delivery.
"""

from __future__ import annotations

from jobguard.backends.base import Backend, Closing, DeliveryRules, ErrorInfo, HostAdmission
from jobguard.core.hosts import Admit
from jobguard.models import DeadCode, JobSpec, JobStatus, Outcome
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

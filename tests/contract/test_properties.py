"""Property-based tests: the real backends against the pure reference models in ``core/``.

Two hypothesis state machines drive a real store (a fresh file per example) with a
:class:`ControlledClock` through random interleavings:

* locks (G3.5): acquire, renew, release and clock advances keep at
  most one live owner and strictly increasing fences, and every answer matches
  :mod:`jobguard.core.fencing`;
* jobs (G2.4 and G8.2): enqueue, fetch, finish, retry, defer, release, bury, replay, expiry
  and writes with stale lease tokens keep every job in the state that
  :data:`jobguard.core.states.TRANSITIONS` predicts, and a stale token never changes anything.

Examples are derandomized so the suite is deterministic; raise ``max_examples`` locally to search
harder.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobguard.backends.base import Backend, Closing, Ending, ErrorInfo
from jobguard.core import fencing
from jobguard.core.states import Event, next_status
from jobguard.exceptions import LeaseLostError, NotFoundError
from jobguard.models import DeadCode, Delivery, Guard, JobSpec, JobStatus, LockGrant, Outcome
from jobguard.testing import ControlledClock
from tests.contract.conftest import BACKENDS
from tests.support.ports import (
    bury,
    burying,
    defer,
    deferring,
    fetch,
    finish,
    release,
    releasing,
    retry,
    retrying,
    success,
)

MACHINE_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,  # every step commits to a real file; its latency is not the property
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Halves and small integers keep ``now + ttl`` exact in binary floating point, so expiry lands
# exactly on the boundary often (``expires_at == now`` means expired in both model and store).
STEPS_S = st.sampled_from([0.5, 1.0, 2.0, 5.0])


class StoreMachine(RuleBasedStateMachine):
    """A state machine that owns one fresh store of the backend kind named by ``backend_name``."""

    backend_name: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="jobguard-prop-"))
        self.clock = ControlledClock()
        self.backend: Backend = BACKENDS[self.backend_name](self.directory, self.clock)

    def teardown(self) -> None:
        """Close the store and delete its files."""
        self.backend.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def on_backend(machine: type[StoreMachine], backend_name: str) -> type[StoreMachine]:
    """The state machine bound to one backend of ``BACKENDS``."""
    return type(
        f"{machine.__name__}On{backend_name.title()}", (machine,), {"backend_name": backend_name}
    )


# -- locks and fences ---------------------------------------------------------------------------

RESOURCES = st.sampled_from(["order:1", "order:2"])
OWNERS = st.sampled_from(["alice", "bob", "carol"])
TTLS_S = st.sampled_from([1.0, 2.0, 5.0])


class LockMachine(StoreMachine):
    """Acquire / renew / release / expiry against :mod:`jobguard.core.fencing`."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, fencing.LockState] = {}
        self.grants: dict[tuple[str, str], LockGrant] = {}
        # What each owner believes: the expiry of the lock it was granted or last renewed.
        self.believed_until: dict[str, dict[str, float]] = {}
        self.fences: dict[str, list[int]] = {}

    def _state(self, resource: str) -> fencing.LockState:
        return self.model.get(resource, fencing.LockState())

    @rule(resource=RESOURCES, owner=OWNERS, ttl_s=TTLS_S)
    def acquire(self, resource: str, owner: str, ttl_s: float) -> None:
        """Grant iff the model grants; the fence is the model's next one and beats every other."""
        now = self.clock()
        expected, granted = fencing.acquire(self._state(resource), owner, ttl_s, now)
        got = self.backend.acquire_lock(resource, owner, ttl_s)
        assert (got is not None) == granted, (resource, owner, self._state(resource), now)
        if got is None:
            return
        assert got == LockGrant(resource, owner, expected.fence, expected.expires_at)
        issued = self.fences.setdefault(resource, [])
        assert all(got.fence > fence for fence in issued)
        issued.append(got.fence)
        self.model[resource] = expected
        self.grants[(resource, owner)] = got
        self.believed_until.setdefault(resource, {})[owner] = got.expires_at

    @rule(resource=RESOURCES, owner=OWNERS, ttl_s=TTLS_S)
    def renew(self, resource: str, owner: str, ttl_s: float) -> None:
        """Only the current owner extends the lock."""
        now = self.clock()
        expected, renewed = fencing.renew(self._state(resource), owner, ttl_s, now)
        grant = self.grants.get((resource, owner), LockGrant(resource, owner, 0, 0.0))
        assert self.backend.renew_lock(grant, ttl_s) is renewed
        self.model[resource] = expected
        if renewed:
            self.believed_until.setdefault(resource, {})[owner] = now + ttl_s

    @rule(resource=RESOURCES, owner=OWNERS)
    def release(self, resource: str, owner: str) -> None:
        """Only the current owner frees the lock; the fence counter stays."""
        expected, released = fencing.release(self._state(resource), owner)
        grant = self.grants.get((resource, owner), LockGrant(resource, owner, 0, 0.0))
        assert self.backend.release_lock(grant) is released
        self.model[resource] = expected
        if released:
            self.believed_until.get(resource, {}).pop(owner, None)

    @rule(step_s=STEPS_S)
    def advance(self, step_s: float) -> None:
        """Time passes; leases run out."""
        self.clock.advance(step_s)

    @invariant()
    def at_most_one_live_owner(self) -> None:
        """Invariant 5: never two owners whose grants are unexpired at the same time."""
        now = self.clock()
        for resource, holders in self.believed_until.items():
            live = [owner for owner, until in holders.items() if until > now]
            assert len(live) <= 1, (resource, live)

    @invariant()
    def fences_agree_with_the_model(self) -> None:
        """G3.5: the store's last issued fence is the model's, per resource."""
        for resource, state in self.model.items():
            assert self.backend.lock_fence(resource) == state.fence


@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
def test_any_interleaving_of_lock_operations_keeps_one_owner_and_increasing_fences(
    backend_name: str,
) -> None:
    """G3.2, G3.5: the store agrees with core.fencing."""
    run_state_machine_as_test(on_backend(LockMachine, backend_name), settings=MACHINE_SETTINGS)


# -- job transitions ----------------------------------------------------------------------------

VISIBILITY_TIMEOUT_S = 1.0
CLOSING = Closing(duration_s=0.1)
ERROR = ErrorInfo(type="RuntimeError", message="boom")
DELAYS_S = st.sampled_from([0.0, 1.0, 4.0])
PICK = st.integers(min_value=0, max_value=1_000)
KINDS = st.sampled_from(["current", "superseded", "settled"])
# The writes that end a delivery, all of which one settle may mix.
SETTLING = (Event.FINISH, Event.RETRY, Event.DEFER, Event.BURY, Event.RELEASE)


@dataclass
class ModelJob:
    """What the reference model expects of one stored job."""

    status: JobStatus
    attempts: int
    max_attempts: int
    available_at: float
    lease_token: str | None = None


class JobMachine(StoreMachine):
    """Job transitions driven through the queue port and checked against TRANSITIONS.

    Settling writes pick a current delivery, a superseded one (its job re-leased to another) or
    a settled one (its job acked, requeued or buried since), so every refusal path is exercised.
    """

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, ModelJob] = {}
        self.issued: list[Delivery] = []

    def _snapshot(self, job_id: int) -> tuple[Any, ...]:
        return self.backend.get_job(job_id), self.backend.attempts(job_id=job_id)

    def _is_current(self, delivery: Delivery) -> bool:
        return self.model[delivery.job_id].lease_token == delivery.lease_token

    @initialize()
    def some_jobs(self) -> None:
        """Start with a few jobs so that early steps already lease and settle."""
        for max_attempts in (1, 2, 3):
            self.enqueue(max_attempts, 0.0)

    @rule(max_attempts=st.integers(1, 3), delay_s=DELAYS_S)
    def enqueue(self, max_attempts: int, delay_s: float) -> None:
        """A new job is queued, uncharged."""
        spec = JobSpec(
            task="tests.prop",
            queue="default",
            payload="{}",
            max_attempts=max_attempts,
            visibility_timeout_s=VISIBILITY_TIMEOUT_S,
            delay_s=delay_s,
        )
        job = self.backend.enqueue(spec)
        assert job.id not in self.model
        self.model[job.id] = ModelJob(JobStatus.QUEUED, 0, max_attempts, self.clock() + delay_s)

    @rule()
    def fetch(self) -> None:
        """Every due job is leased, except spent expired ones, which are buried (G8.2)."""
        now = self.clock()
        due = {
            job_id
            for job_id, job in self.model.items()
            if job.status in (JobStatus.QUEUED, JobStatus.RUNNING) and job.available_at <= now
        }
        spent = {
            job_id
            for job_id in due
            if self.model[job_id].status == JobStatus.RUNNING
            and self.model[job_id].attempts >= self.model[job_id].max_attempts
        }
        found = fetch(self.backend, ["default"], 100, "w-prop")
        assert {d.job_id for d in found} == due - spent
        for job_id in spent:
            job = self.model[job_id]
            job.status = next_status(job.status, Event.BURY)
            job.lease_token = None
        for delivery in found:
            job = self.model[delivery.job_id]
            job.status = next_status(job.status, Event.FETCH)
            job.attempts += 1
            job.available_at = now + VISIBILITY_TIMEOUT_S
            job.lease_token = delivery.lease_token
            assert delivery.attempt == job.attempts
        self.issued.extend(found)

    @rule(pick=PICK)
    def retry_now(self, pick: int) -> None:
        """An operator hurries one job: only a queued one whose run time is ahead moves, and
        only its run time; any other is left exactly as it was."""
        job_id = sorted(self.model)[pick % len(self.model)]
        job, now = self.model[job_id], self.clock()
        before = self._snapshot(job_id)
        moved = self.backend.retry_now(job_id)
        if job.status == JobStatus.QUEUED and job.available_at > now:
            assert moved is not None
            assert (moved.status, moved.attempts, moved.run_at) == (job.status, job.attempts, now)
            job.status = next_status(job.status, Event.RETRY_NOW)
            job.available_at = now
        else:
            assert moved is None
            assert self._snapshot(job_id) == before

    def _write(self, event: Event, guard: Guard, delay_s: float) -> int | None:
        """Carry out one settling write; ``release`` returns how many leases it released."""
        backend = self.backend
        if event is Event.RELEASE:
            return release(backend, [guard])
        if event is Event.FINISH:
            finish(backend, guard, CLOSING)
        elif event is Event.RETRY:
            retry(backend, guard, CLOSING, delay_s=delay_s, error=ERROR)
        elif event is Event.DEFER:
            defer(backend, guard, CLOSING, delay_s=delay_s, reason="busy")
        else:
            bury(backend, guard, CLOSING, code=DeadCode.FATAL, reason="fatal", error=ERROR)
        return None

    def _kind(self, delivery: Delivery) -> str:
        job = self.model[delivery.job_id]
        if job.lease_token == delivery.lease_token:
            return "current"
        # Stale: another delivery holds the job now, or the job has moved on without one.
        return "superseded" if job.status == JobStatus.RUNNING else "settled"

    def _settle(self, event: Event, kind: str, pick: int, delay_s: float) -> None:
        """Apply a settling write with a current lease, or check a stale one changes nothing."""
        # Prefer the drawn kind; fall back to any delivery so that no step is wasted.
        candidates = [d for d in self.issued if self._kind(d) == kind] or self.issued
        delivery = candidates[pick % len(candidates)]
        kind = self._kind(delivery)
        guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)
        job = self.model[delivery.job_id]
        if kind != "current":
            before = self._snapshot(delivery.job_id)
            if event is Event.RELEASE:
                assert self._write(event, guard, delay_s) == 0  # stale guards are skipped
            else:
                with pytest.raises(LeaseLostError):
                    self._write(event, guard, delay_s)
            assert self._snapshot(delivery.job_id) == before
            return
        if event is Event.RETRY and job.attempts >= job.max_attempts:
            event = Event.BURY  # as the pipeline decides: a spent job is buried, not retried
        result = self._write(event, guard, delay_s)
        if event is Event.RELEASE:
            assert result == 1
        self._apply(job, event, delay_s)

    def _apply(self, job: ModelJob, event: Event, delay_s: float) -> None:
        """What a settling write of a current delivery does to the model of its job."""
        job.status = next_status(job.status, event)
        job.lease_token = None
        if event in (Event.DEFER, Event.RELEASE):
            job.attempts -= 1  # handed back: not the job's fault
        if event in (Event.RETRY, Event.DEFER):
            job.available_at = self.clock() + delay_s
        elif event is Event.RELEASE:
            job.available_at = self.clock()

    @staticmethod
    def _ending(event: Event, guard: Guard, delay_s: float) -> Ending:
        """The ending a worker settles for ``event`` (as the pipeline builds it)."""
        if event is Event.FINISH:
            return success(guard, CLOSING)
        if event is Event.RETRY:
            return retrying(guard, CLOSING, delay_s=delay_s, error=ERROR)
        if event is Event.DEFER:
            return deferring(guard, CLOSING, delay_s=delay_s, reason="busy")
        if event is Event.RELEASE:
            return releasing(guard)
        return burying(guard, CLOSING, code=DeadCode.FATAL, reason="fatal", error=ERROR)

    def _superseded(self) -> list[Delivery]:
        return [d for d in self.issued if self._kind(d) == "superseded"]

    @precondition(lambda self: self._superseded())
    @rule(event=st.sampled_from([Event.FINISH, Event.RETRY, Event.DEFER, Event.BURY]))
    def every_superseded_lease_is_refused(self, event: Event) -> None:
        """Invariant 2: the most dangerous stale writers (a paused worker whose job now runs
        elsewhere) are refused, one and all, and change nothing."""
        for delivery in self._superseded():
            guard = Guard(delivery.job_id, delivery.lease_token, delivery.attempt_id)
            before = self._snapshot(delivery.job_id)
            with pytest.raises(LeaseLostError):
                self._write(event, guard, 1.0)
            assert self._snapshot(delivery.job_id) == before

    @precondition(lambda self: len(self.issued) >= 2)
    @rule(
        picks=st.lists(PICK, min_size=2, max_size=5, unique=True),
        events=st.lists(st.sampled_from(list(SETTLING)), min_size=5, max_size=5),
        delay_s=DELAYS_S,
    )
    def settle_a_batch(self, picks: list[int], events: list[Event], delay_s: float) -> None:
        """One settle mixing successes, retries, deferrals, burials and releases of current and
        stale leases (the worker's settler): each item is written or refused on its own, and a
        refused one changes nothing."""
        chosen = list(
            {id(d): d for d in (self.issued[p % len(self.issued)] for p in picks)}.values()
        )
        kinds = [self._kind(d) for d in chosen]
        moved_jobs = {d.job_id for d, k in zip(chosen, kinds, strict=True) if k == "current"}
        before = {d.job_id: self._snapshot(d.job_id) for d in chosen}
        decided: list[Event] = []
        for delivery, kind, drawn in zip(chosen, kinds, events, strict=False):
            job = self.model[delivery.job_id]
            spent = kind == "current" and job.attempts >= job.max_attempts
            # As the pipeline decides: a spent job is buried, not retried.
            decided.append(Event.BURY if drawn is Event.RETRY and spent else drawn)
        endings = [
            self._ending(event, Guard(d.job_id, d.lease_token, d.attempt_id), delay_s)
            for d, event in zip(chosen, decided, strict=True)
        ]
        refusals = self.backend.settle(endings)
        for delivery, kind, event, refusal in zip(chosen, kinds, decided, refusals, strict=True):
            if kind != "current":
                assert isinstance(refusal, LeaseLostError)
                if delivery.job_id not in moved_jobs:
                    assert self._snapshot(delivery.job_id) == before[delivery.job_id]
                continue
            assert refusal is None
            self._apply(self.model[delivery.job_id], event, delay_s)

    # One rule per event, so each gets its own share of the steps.

    @precondition(lambda self: self.issued)
    @rule(kind=KINDS, pick=PICK)
    def finish(self, kind: str, pick: int) -> None:
        """Ack."""
        self._settle(Event.FINISH, kind, pick, 0.0)

    @precondition(lambda self: self.issued)
    @rule(kind=KINDS, pick=PICK, delay_s=DELAYS_S)
    def retry(self, kind: str, pick: int, delay_s: float) -> None:
        """Retry later; the attempt stays charged."""
        self._settle(Event.RETRY, kind, pick, delay_s)

    @precondition(lambda self: self.issued)
    @rule(kind=KINDS, pick=PICK, delay_s=DELAYS_S)
    def defer(self, kind: str, pick: int, delay_s: float) -> None:
        """Resource busy: retry later with the attempt handed back."""
        self._settle(Event.DEFER, kind, pick, delay_s)

    @precondition(lambda self: self.issued)
    @rule(kind=KINDS, pick=PICK)
    def release(self, kind: str, pick: int) -> None:
        """Graceful shutdown: hand the lease back, due at once."""
        self._settle(Event.RELEASE, kind, pick, 0.0)

    @precondition(lambda self: self.issued)
    @rule(kind=KINDS, pick=PICK)
    def bury(self, kind: str, pick: int) -> None:
        """To the dead letter queue."""
        self._settle(Event.BURY, kind, pick, 0.0)

    @precondition(lambda self: self.model)
    @rule(pick=PICK)
    def replay(self, pick: int) -> None:
        """Only a dead job is replayed, with its attempts reset (G8.3)."""
        job_id = sorted(self.model)[pick % len(self.model)]
        job = self.model[job_id]
        if job.status != JobStatus.DEAD:
            before = self._snapshot(job_id)
            with pytest.raises(NotFoundError):
                self.backend.replay(job_id)
            assert self._snapshot(job_id) == before
            return
        assert self.backend.replay(job_id).status == JobStatus.QUEUED
        job.status = next_status(job.status, Event.REPLAY)
        job.attempts = 0
        job.available_at = self.clock()

    @rule(step_s=STEPS_S)
    def advance(self, step_s: float) -> None:
        """Time passes; leases expire."""
        self.clock.advance(step_s)

    @invariant()
    def store_follows_the_transition_table(self) -> None:
        """Every job's state and charged attempts are what TRANSITIONS and the model predict."""
        stored = {job.id: job for job in self.backend.find_jobs(limit=10_000)}
        assert stored.keys() == self.model.keys()
        for job_id, expected in self.model.items():
            job = stored[job_id]
            assert (job.status, job.attempts) == (expected.status, expected.attempts), job_id
            assert job.attempts <= job.max_attempts  # G8.2: charged, never over the cap

    @invariant()
    def only_the_current_lease_has_an_open_attempt(self) -> None:
        """G10.1: a job has at most one running attempt row, and it is its current lease's."""
        open_rows: dict[int, list[str]] = {}
        for row in self.backend.attempts(limit=100_000):
            if row.outcome == Outcome.RUNNING:
                open_rows.setdefault(row.job_id, []).append(row.lease_token)
        expected = {
            job_id: [job.lease_token] for job_id, job in self.model.items() if job.lease_token
        }
        assert open_rows == expected


@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
def test_any_interleaving_of_job_events_follows_the_transition_table(backend_name: str) -> None:
    """Invariants 2, 7, 8, G2.4: states follow core.states; stale tokens change nothing."""
    run_state_machine_as_test(on_backend(JobMachine, backend_name), settings=MACHINE_SETTINGS)

"""Every port on one SQL database, written once: the guard's order of writes.

Queue, locks, operations and attempts share one database, so settling a delivery (job moved,
lock released, operation completed or unclaimed, attempt closed) is one transaction, and so is
``db_step`` (the user's rows + the step record). What differs between databases (connections,
transactions, the clock, the SQL text) is the :class:`~jobguard.backends.sql.driver.Driver`'s;
each statement is named and lives in the driver's ``queries.sql``. Decisions (retry or bury,
reason codes) are made above the port and arrive here as facts; sentences come from
:mod:`jobguard.core.messages`.

The store is five parts by role, composed here:

- :class:`~jobguard.backends.sql.leases.Leases`: enqueue, fetch (with each batch's begin), renew;
- :class:`~jobguard.backends.sql.endings.EndingWrites`: :meth:`settle`, how deliveries end;
- :class:`~jobguard.backends.sql.proofs.Proofs`: locks with fences, operation claims, steps;
- :class:`~jobguard.backends.sql.reads.Reads`: jobs, attempts, operator views, schedules;
- :class:`~jobguard.backends.sql.pauses.Pauses`: paused queues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from jobguard.backends.base import (
    BeginRequest,
    Begun,
    DeliveryRules,
    Ending,
    HostAdmission,
    Prepared,
    Renewal,
    RenewalResult,
)
from jobguard.backends.sql.cancels import Cancels
from jobguard.backends.sql.driver import Driver
from jobguard.backends.sql.endings import EndingWrites
from jobguard.backends.sql.leases import Leases
from jobguard.backends.sql.pauses import Pauses
from jobguard.backends.sql.proofs import Proofs
from jobguard.backends.sql.reads import Reads
from jobguard.core.selection import DeadFilter, ReplayBatch
from jobguard.exceptions import JobGuardError
from jobguard.models import (
    Attempt,
    AuditEntry,
    Guard,
    Job,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    OutcomeCount,
    PausedQueue,
    QueueStats,
    ScheduleState,
)

if TYPE_CHECKING:
    from jobguard.steptx import StepTransactions

T = TypeVar("T")


class SQLStore:
    """All the ports over one :class:`Driver`; safe to share between threads.

    Each port method hands over to the part that owns its role (see the module docstring).

    Args:
        driver: The database's driver.
    """

    transactional_steps = True

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.url = driver.url
        self._proofs = Proofs(driver)
        self._leases = Leases(driver, self._proofs)
        self._endings = EndingWrites(driver)
        self._reads = Reads(driver)
        self._pauses = Pauses(driver)
        self._cancels = Cancels(driver)

    def close(self) -> None:
        """Close this process's connections."""
        self.driver.close()

    def expect_handlers(self, handlers: int) -> None:
        """Keep room for a worker of ``handlers`` threads (see the driver's)."""
        self.driver.expect_handlers(handlers)

    def keep_connection(self) -> AbstractContextManager[None]:
        """This thread's calls reuse one connection while inside (see the driver's)."""
        return self.driver.keep_connection()

    def now(self) -> float:
        """The store clock."""
        return self.driver.now()

    def check_usable(self) -> None:
        """Raise :class:`~jobguard.exceptions.StoreBrokenError` if the store is no longer usable
        (see the driver's check)."""
        self.driver.check_usable()

    # -- Queue: in, out, and how deliveries end ----------------------------------------------

    def enqueue(self, spec: JobSpec, *, connection: Any = None) -> Job:
        """Store a job or return the live holder of its dedup key (one transaction)."""
        return self._leases.enqueue(spec, connection=connection)

    def enqueue_many(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store jobs in one transaction (each deduplicated); see :class:`QueuePort`."""
        return self._leases.enqueue_many(specs, connection=connection)

    def wait_for_jobs(self, queues: Sequence[str], timeout_s: float) -> None:
        """Block until an enqueue may have added work, or ``timeout_s`` passed."""
        self._leases.wait_for_jobs(queues, timeout_s)

    def interrupt_wait(self) -> None:
        """End a :meth:`wait_for_jobs` under way in this process now."""
        self._leases.interrupt_wait()

    def fetch_prepared(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules] | None = None,
    ) -> list[Prepared]:
        """Lease ready jobs and begin them (lock + claim) in the same transaction."""
        return self._leases.fetch_prepared(queues, limit, worker_id, rules)

    def renew(self, renewals: Sequence[Renewal]) -> list[RenewalResult]:
        """Extend every lease, lock and slot still ours, in one transaction."""
        return self._leases.renew(renewals)

    def admit_host_delivery(
        self, spec: JobSpec, worker_id: str, rules: DeliveryRules, host_delivery: str
    ) -> HostAdmission:
        """Admit a host queue's delivery against its shadow job (lease it, or say why not)."""
        return self._leases.admit_host_delivery(spec, worker_id, rules, host_delivery)

    def reserve_host_job(self, spec: JobSpec, unsent_s: float) -> Job:
        """A deduplicated send of a host task: store its shadow job, take over a stranded one,
        or find the live one holding its key."""
        return self._leases.reserve_host_job(spec, unsent_s)

    def settle(self, endings: Sequence[Ending]) -> list[JobGuardError | None]:
        """Write a batch of endings in one transaction, each all-or-nothing on its own."""
        return self._endings.settle(endings)

    # -- Locks, operations and steps: the guard's proofs -------------------------------------

    def acquire_lock(
        self, resource: str, owner: str, ttl_s: float, *, attempt_id: int | None = None
    ) -> LockGrant | None:
        """Grant the lock if free or expired, with the next fence (one transaction)."""
        return self._proofs.acquire_lock(resource, owner, ttl_s, attempt_id=attempt_id)

    def renew_lock(self, grant: LockGrant, ttl_s: float) -> bool:
        """Extend the lock if ``grant.owner`` still owns it."""
        return self._proofs.renew_lock(grant, ttl_s)

    def release_lock(self, grant: LockGrant) -> bool:
        """Free the lock if ``grant.owner`` still owns it."""
        return self._proofs.release_lock(grant)

    def lock_fence(self, resource: str) -> int:
        """The last fence issued for ``resource`` (0 if never locked)."""
        return self._proofs.lock_fence(resource)

    def slot_grants(self, key: str) -> list[LockGrant]:
        """Every slot of concurrency key ``key`` ever held, by number."""
        return self._proofs.slot_grants(key)

    def begin(self, guard: Guard, request: BeginRequest) -> Begun:
        """Lock the resource, take a slot and claim the operation together (one transaction)."""
        return self._proofs.begin(guard, request)

    def put_step(self, guard: Guard, key: str, name: str, result_json: str) -> None:
        """Record a completed step (one transaction, guarded)."""
        self._proofs.put_step(guard, key, name, result_json)

    def db_step(
        self,
        guard: Guard,
        key: str,
        name: str,
        fn: Callable[..., T],
        args: Sequence[Any],
        on: StepTransactions | None = None,
    ) -> tuple[bool, Any]:
        """Run ``fn(conn, *args)`` and record the step, both in one transaction."""
        return self._proofs.db_step(guard, key, name, fn, args, on)

    def db_writes(
        self, guard: Guard, key: str, name: str, statements: Sequence[tuple[Any, Any]]
    ) -> bool:
        """Run the statements and record the step, in one transaction sent at once."""
        return self._proofs.db_writes(guard, key, name, statements)

    def get_operation(self, key: str) -> Operation | None:
        """The operation record with its steps, or ``None``."""
        return self._proofs.get_operation(key)

    # -- Reads and operator writes -----------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """One job by id."""
        return self._reads.get_job(job_id)

    def count_jobs(
        self,
    ) -> dict[JobStatus, int]:
        """Jobs per state (every state present, zero if none)."""
        return self._reads.count_jobs()

    def dead_jobs(self, limit: int = 100) -> list[Job]:
        """Jobs in the dead letter queue, most recently buried first."""
        return self._reads.dead_jobs(limit)

    def replay(self, job_id: int) -> Job:
        """Dead job back to the queue with the same id and keys."""
        return self._reads.replay(job_id)

    def prune_completed(self, older_than_s: float, batch_size: int = 1000) -> int:
        """Delete completed jobs finished over ``older_than_s`` ago, with their attempt rows."""
        return self._reads.prune_completed(older_than_s, batch_size)

    def purge(self, job_id: int | None = None) -> int:
        """Delete dead jobs (one, or all) and their attempts."""
        return self._reads.purge(job_id)

    def count_dead(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches."""
        return self._reads.count_dead(selection)

    def count_dead_held(self, selection: DeadFilter) -> int:
        """How many dead jobs ``selection`` matches that a replay would leave dead."""
        return self._reads.count_dead_held(selection)

    def retry_now(self, job_id: int) -> Job | None:
        """Make a queued job waiting for its run time due now; see :class:`QueuePort`."""
        return self._reads.retry_now(job_id)

    def select_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> list[Job]:
        """The first ``limit`` dead jobs ``selection`` matches with ids above ``after_id``."""
        return self._reads.select_dead(selection, limit, after_id)

    def replay_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> ReplayBatch:
        """Replay one batch of matching dead jobs (one transaction); see :class:`QueuePort`."""
        return self._reads.replay_dead(selection, limit, after_id)

    def purge_dead(self, selection: DeadFilter, limit: int, after_id: int = 0) -> tuple[int, int]:
        """Delete one batch of matching dead jobs with their attempts (one transaction)."""
        return self._reads.purge_dead(selection, limit, after_id)

    def attempts(
        self, *, job_id: int | None = None, operation_key: str | None = None, limit: int = 1000
    ) -> list[Attempt]:
        """Attempts of a job or an operation in order, else the most recent ``limit``."""
        return self._reads.attempts(job_id=job_id, operation_key=operation_key, limit=limit)

    def queue_stats(
        self,
    ) -> list[QueueStats]:
        """Per queue: backlog, running and dead counts, oldest ready and running (three reads)."""
        return self._reads.queue_stats()

    def find_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        """Newest first, every filter given applied."""
        return self._reads.find_jobs(
            status=status, queue=queue, task=task, limit=limit, offset=offset
        )

    def outcome_timeline(self, since: float, bucket_s: float, window: int) -> list[OutcomeCount]:
        """Recent attempts per time bucket and outcome."""
        return self._reads.outcome_timeline(since, bucket_s, window)

    def record_audit(self, actor: str, action: str, target: str, detail: str) -> None:
        """Append one operator action."""
        self._reads.record_audit(actor, action, target, detail)

    def audit_trail(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent operator actions, newest first."""
        return self._reads.audit_trail(limit)

    def cancel(self, job_id: int, actor: str, reason: str) -> Job | None:
        """Cancel a queued or running job, audited (``None``: no such job is live)."""
        return self._cancels.cancel(job_id, actor, reason)

    def pause_queue(self, queue: str, actor: str) -> bool:
        """Pause a queue, audited (``False``: it was paused already)."""
        return self._pauses.pause_queue(queue, actor)

    def resume_queue(self, queue: str, actor: str) -> bool:
        """Resume a queue, audited (``False``: it was not paused)."""
        return self._pauses.resume_queue(queue, actor)

    def paused_queues(self) -> list[PausedQueue]:
        """Every paused queue, by name."""
        return self._pauses.paused_queues()

    def schedule_states(
        self,
    ) -> list[ScheduleState]:
        """Every schedule's cursor and newest enqueued tick, by name."""
        return self._reads.schedule_states()

    def advance_schedule(
        self, name: str, expected: int | None, cursor: int, ticks: Sequence[tuple[int, JobSpec]]
    ) -> list[Job] | None:
        """Compare-and-set the cursor and enqueue the ticks' jobs, in one transaction."""
        return self._reads.advance_schedule(name, expected, cursor, ticks)

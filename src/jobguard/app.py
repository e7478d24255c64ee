"""The application object: task registry, store, dead letter queue and diagnostics entry point."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

from jobguard import retrynow
from jobguard.backends import (
    DEFAULT_URL,
    check_store_url,
    display_url,
    migrate_store,
    open_backend,
)
from jobguard.backends.base import Backend
from jobguard.core import checks, messages
from jobguard.core.retry import RetryPolicy
from jobguard.core.schedules import Cron, Every, Missed, Trigger, interval_seconds
from jobguard.core.selection import DeadFilter, ReplayReport
from jobguard.deadletters import DeadLetterQueue
from jobguard.exceptions import (
    ConfigurationError,
    JobFinishedError,
    JobGuardError,
    LockBusyError,
    UnknownTaskError,
)
from jobguard.hooks import Hooks, contained
from jobguard.models import (
    Attempt,
    AuditEntry,
    Job,
    JobSpec,
    JobStatus,
    LockGrant,
    Operation,
    OutcomeCount,
    PausedQueue,
    QueueStats,
)
from jobguard.schedule import Schedule, check_operation_template, check_tick_handler, tick_runner
from jobguard.supervisor import ProcessWorker
from jobguard.task import Task, call_options, check_handler, check_queue_name
from jobguard.worker import Worker

if TYPE_CHECKING:
    from jobguard.diagnostics import Diagnosis

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_VISIBILITY_TIMEOUT_S = 30.0
MAX_PAGE = 1000  # the most jobs one find_jobs() call returns


def with_headers(stored: str | None, added: Mapping[str, str]) -> str:
    """A job's headers (JSON object text) with ``added`` merged in; the job's own win."""
    own = json.loads(stored) if stored else {}
    return json.dumps({**added, **own}, sort_keys=True, separators=(",", ":"))


def _trigger(cron: str | None, every: float | timedelta | None, timezone: str) -> Trigger:
    """The trigger of :meth:`App.periodic`, or a ConfigurationError saying what is wrong."""
    if (cron is None) == (every is None):
        raise ConfigurationError("periodic() needs exactly one of cron= and every=")
    try:
        if cron is not None:
            return Cron(cron, timezone)
        if timezone != "UTC":
            raise ConfigurationError(
                "timezone applies to cron= only; every= counts real time from the Unix epoch "
                "(use cron= for times of day)"
            )
        assert every is not None
        return Every(interval_seconds(every))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc


class App:
    """A jobguard application: where tasks are registered and jobs are stored.

    Args:
        url: Store URL. Default ``sqlite:///jobguard.db`` (a file in the working directory).
        backend: An already-built backend (overrides ``url``).
        max_payload_bytes: Largest JSON payload accepted at enqueue (default 1 MiB).
        hooks: Callbacks for metrics and logs.
        queue_visibility_timeouts_s: Per-queue lease length for tasks that do not set their own
            ``visibility_timeout_s`` (G2.3), e.g. ``{"slow": 300}``; others get 30 s.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        backend: Backend | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        hooks: Hooks | None = None,
        queue_visibility_timeouts_s: Mapping[str, float] | None = None,
    ) -> None:
        max_payload_bytes = checks.count("max_payload_bytes", max_payload_bytes)
        self.queue_visibility_timeouts_s: dict[str, float] = {}
        for queue, timeout_s in (queue_visibility_timeouts_s or {}).items():
            self.queue_visibility_timeouts_s[check_queue_name(queue)] = checks.seconds(
                f"queue_visibility_timeouts_s[{queue!r}]", timeout_s, positive=True
            )
        if hooks is not None and not isinstance(hooks, Hooks):
            raise ConfigurationError(f"hooks must be a jobguard.Hooks instance, not {hooks!r}")
        if backend is not None:
            self.url = backend.url  # as the backend shows it (a password masked)
            self._migrate_url: str | None = None
        else:
            checked = check_store_url(DEFAULT_URL if url is None else url)
            self.url = display_url(checked)  # what may be shown: a password masked
            self._migrate_url = checked
        self._backend = backend
        self._backend_lock = threading.Lock()
        self.max_payload_bytes = max_payload_bytes
        # Behind one containing loop: a hook that raises is logged and counted, never passed on.
        self.hooks: Hooks = contained(hooks or Hooks())
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Schedule] = {}
        # Guarded tasks of host queues (jobguard.hosts): how a replayed job is sent again.
        self.host_replays: dict[str, Callable[[Job], None]] = {}
        self.dlq = DeadLetterQueue(self)

    @property
    def store_url(self) -> str | None:
        """The URL the store is opened from, as given (``None`` for an App made from a backend
        object): what another process needs to open the same store."""
        return self._migrate_url

    @property
    def backend(self) -> Backend:
        """The store, opened on first use (so importing an app module touches no file)."""
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    assert self._migrate_url is not None  # set whenever no backend was given
                    self._backend = open_backend(self._migrate_url)
        return self._backend

    def migrate(self, *, dry_run: bool = False) -> tuple[int, list[str]]:
        """Apply the schema migrations the store lacks; return (version reached, SQL applied).

        Needed once before a PostgreSQL store is used, and after an upgrade that brings a
        migration (SQLite files migrate when opened). With ``dry_run`` nothing changes and the
        SQL that would run is returned. Forward only, one transaction, safe to run concurrently.
        """
        if self._migrate_url is None:
            raise ConfigurationError(
                "this App was given a backend object, not a URL: migrate with "
                "jobguard.backends.migrate_store(url) or `jobguard --url URL migrate`"
            )
        return migrate_store(self._migrate_url, dry_run=dry_run)

    def close(self) -> None:
        """Close the store's connections."""
        if self._backend is not None:
            self._backend.close()

    # -- tasks ----------------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        visibility_timeout_s: float | None = None,
        max_attempts: int = 5,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 300.0,
        fatal: tuple[type[BaseException], ...] = (),
        transient: tuple[type[BaseException], ...] | None = None,
        poison_threshold: int = 3,
        priority: int = 0,
        operation_key: str | None = None,
        resource_key: str | None = None,
        lock_ttl_s: float = 30.0,
        max_defer_s: float = 3600.0,
        dedup_window_s: float = 0.0,
        soft_time_limit_s: float | None = None,
        time_limit_s: float | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        visibility_timeout_s: float | None = None,
        max_attempts: int = 5,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 300.0,
        fatal: tuple[type[BaseException], ...] = (),
        transient: tuple[type[BaseException], ...] | None = None,
        poison_threshold: int = 3,
        priority: int = 0,
        operation_key: str | None = None,
        resource_key: str | None = None,
        lock_ttl_s: float = 30.0,
        max_defer_s: float = 3600.0,
        dedup_window_s: float = 0.0,
        soft_time_limit_s: float | None = None,
        time_limit_s: float | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler ``fn(ctx, **kwargs)`` as a task.

        Args:
            name: Registered name (default ``module.function``).
            queue: Default queue (a plain identifier).
            visibility_timeout_s: Lease length; renewed by the heartbeat while the job runs (G2).
                Default: the queue's (``queue_visibility_timeouts_s``), else 30 s.
            max_attempts: Deliveries allowed, charged at delivery (G7.2, G8.2).
            backoff_base_s: Full-jitter exponential backoff base.
            backoff_cap_s: Longest backoff delay.
            fatal: Exception classes never retried (G7.1).
            transient: Errors declared transient: retried up to ``max_attempts`` and never taken
                for poison. If given, only these (and ``Retry``) are retried; anything else is
                fatal. The whole rule: ``docs/concepts.md``, "What is retried".
            poison_threshold: The same undeclared error signature this many times in a row
                buries the job (G8.2).
            priority: Default priority; higher runs first within a queue.
            operation_key: Template of the business action's idempotency key, e.g.
                ``"fulfill-order:{order_id}"`` (G4.1).
            resource_key: Template of the resource to lock while running, e.g.
                ``"order:{order_id}"`` (G3.1).
            lock_ttl_s: Lock lease length, and the concurrency slot's; renewed with the job's
                lease (G3.3).
            max_defer_s: How long a job may keep waiting for a busy resource (or a free
                concurrency slot) before it is buried.
            dedup_window_s: Default time a dedup key is held after completion (G6.2).
            soft_time_limit_s: Run time after which the handler is told to stop: ``ctx``
                reports it, its next step raises :class:`~jobguard.TimeLimitExceeded`, an
                ``async def`` handler is cancelled; the attempt is recorded as ``timed_out``
                and retried. See ``docs/limits.md``.
            time_limit_s: Run time after which the run is stopped even if it never cooperates;
                only process-mode workers enforce it (a thread-mode worker refuses to start
                with such a task).
            concurrency_key: Template of the key whose jobs share a concurrency limit, e.g.
                ``"api-account:{account_id}"``: a job runs only while holding one of the key's
                ``concurrency_limit`` slots, fleet-wide (G3.6).
            concurrency_limit: How many jobs of one concurrency key may run at once (1 to
                1000); required with ``concurrency_key``.
        """

        def register(handler: Callable[..., Any]) -> Task:
            task_name = name or f"{handler.__module__}.{handler.__qualname__}"
            if task_name in self.tasks:
                raise ConfigurationError(f"task {task_name!r} is registered twice")
            try:
                policy = RetryPolicy(
                    max_attempts=max_attempts,
                    backoff_base_s=backoff_base_s,
                    backoff_cap_s=backoff_cap_s,
                    fatal=fatal,
                    transient=transient,
                    poison_threshold=poison_threshold,
                )
            except ConfigurationError as exc:
                raise ConfigurationError(f"task {task_name!r}: {exc}") from exc
            task = Task(
                self,
                handler,
                name=task_name,
                queue=queue,
                visibility_timeout_s=visibility_timeout_s,
                policy=policy,
                priority=priority,
                operation_key=operation_key,
                resource_key=resource_key,
                lock_ttl_s=lock_ttl_s,
                max_defer_s=max_defer_s,
                dedup_window_s=dedup_window_s,
                soft_time_limit_s=soft_time_limit_s,
                time_limit_s=time_limit_s,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
            )
            self.tasks[task_name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        timezone: str = "UTC",
        missed: str | int = "last",
        grace_s: float = 60.0,
        jitter_s: float = 0.0,
        dedup_window_s: float = 86400.0,
        name: str | None = None,
        **task_options: Any,
    ) -> Callable[[Callable[..., Any]], Schedule]:
        """Register a handler ``fn(ctx, tick)`` as a periodic task; ``tick`` is the scheduled time.

        Give exactly one of ``cron`` and ``every``. Every tick becomes one job, whatever number of
        schedulers run (``jobguard scheduler`` or ``jobguard worker --schedule``).

        Args:
            cron: A cron expression (5 fields, or 6 with seconds first), e.g. ``"*/5 * * * *"``.
            every: An interval, in seconds or as a ``timedelta`` (whole seconds); ticks are its
                multiples since the Unix epoch, in UTC.
            timezone: IANA time zone the cron expression is read in (cron only).
            missed: Ticks no scheduler enqueued in time: ``"skip"`` (only an on-time tick runs),
                ``"last"`` (the newest due tick runs) or ``N`` (the newest N due ticks run).
            grace_s: How late the newest due tick may be enqueued and still count as on time.
            jitter_s: Run each tick's job up to this much later (the same delay on every host).
            dedup_window_s: How long a tick's dedup key is held after its job completed.
            name: Registered name (default ``module.function``).
            **task_options: Any option of :meth:`task` (queue, retries, ``resource_key``...);
                ``operation_key`` must contain ``{tick}`` (default ``schedule:NAME@{tick}``).

        Raises:
            ConfigurationError: an invalid cron expression, time zone, interval or option, with
                the reason.
        """
        trigger = _trigger(cron, every, timezone)
        try:
            policy = Missed.parse(missed)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        unknown = sorted(set(task_options) - _PERIODIC_TASK_OPTIONS)
        if unknown:
            known = ", ".join(sorted(_PERIODIC_TASK_OPTIONS))
            raise ConfigurationError(
                f"periodic() got unknown option(s) {', '.join(unknown)}; besides its own it takes "
                f"these options of task(): {known}"
            )

        def register(fn: Callable[..., Any]) -> Schedule:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            check_handler(task_name, fn)  # the wrapper below would hide a generator function
            check_tick_handler(task_name, fn)
            options = dict(task_options)
            template = options.setdefault("operation_key", f"schedule:{task_name}@{{tick}}")
            check_operation_template(task_name, template)
            task = self.task(name=task_name, **options)(tick_runner(fn, trigger))
            try:
                schedule = Schedule(
                    task,
                    fn,
                    trigger=trigger,
                    missed=policy,
                    grace_s=grace_s,
                    jitter_s=jitter_s,
                    dedup_window_s=dedup_window_s,
                )
            except ConfigurationError:
                del self.tasks[task_name]
                raise
            self.schedules[task_name] = schedule
            return schedule

        return register

    def visibility_timeout_for(self, queue: str) -> float:
        """The lease length of ``queue`` for tasks that do not set their own (default 30 s)."""
        return self.queue_visibility_timeouts_s.get(queue, DEFAULT_VISIBILITY_TIMEOUT_S)

    def queues(self) -> list[str]:
        """The default queues of the registered tasks, in registration order."""
        return list(dict.fromkeys(task.queue for task in self.tasks.values()))

    def get_task(self, name: str) -> Task:
        """The task registered under ``name``; :class:`UnknownTaskError` if none."""
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTaskError(f"unknown task {name!r} (registered: {known})") from None

    def enqueue(self, task_name: str, kwargs: dict[str, Any], **options: Any) -> Job:
        """Enqueue a task by name (as the CLI does); options as in :meth:`Task.options`."""
        task = self.get_task(task_name)
        return self.store_jobs([task.build_spec(kwargs, call_options(**options))])[0]

    def store_jobs(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store validated jobs in one transaction, inside the hooks' :meth:`~Hooks.enqueuing`.

        Every enqueue goes through here, so metrics count it and the headers the hooks yield (a
        tracer's context) are stored with each job. ``connection`` as in :meth:`Task.enqueue`.
        """
        with self.hooks.enqueuing(specs) as headers:
            if headers:
                specs = [
                    replace(spec, headers=with_headers(spec.headers, headers)) for spec in specs
                ]
            if len(specs) == 1:
                jobs = [self.backend.enqueue(specs[0], connection=connection)]
            else:
                jobs = self.backend.enqueue_many(specs, connection=connection)
            for job in jobs:
                self.hooks.job_enqueued(job)
        return jobs

    # -- inspection -----------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """One job by id."""
        job_id = checks.job_id(job_id)
        return self.backend.get_job(job_id)

    def jobs(self, status: JobStatus | str | None = None, limit: int = 100) -> list[Job]:
        """Newest jobs first, optionally of one status."""
        limit = checks.count("limit", limit)
        return self.backend.find_jobs(status=JobStatus(status) if status else None, limit=limit)

    def counts(self) -> dict[JobStatus, int]:
        """How many jobs are in each state."""
        return self.backend.count_jobs()

    def prune(self, older_than_s: float) -> int:
        """Retention: delete completed jobs (and their attempt rows) older than ``older_than_s``.

        Keeps jobs whose dedup window is still open and never deletes operation records or
        steps, so a late duplicate is still acked as already processed. Returns how many jobs.
        """
        older_than_s = checks.seconds("older_than_s", older_than_s)
        return self.backend.prune_completed(older_than_s)

    def queue_stats(self) -> list[QueueStats]:
        """Per queue: ready, scheduled, running and dead jobs, the oldest ready and running,
        and whether it is paused."""
        return self.backend.queue_stats()

    def pause_queue(self, queue: str, *, actor: str) -> bool:
        """Stop workers on every host from starting jobs of ``queue``, audited under ``actor``.

        Jobs already leased run to their end and enqueues still land; the state is kept in the
        store, so it holds across restarts until :meth:`resume_queue`. Returns ``False`` (and
        changes nothing) if the queue was paused already.

        Raises:
            ConfigurationError: ``queue`` is not a valid queue name, or ``actor`` is empty.
        """
        queue, actor = check_queue_name(queue), checks.actor(actor)
        return self.backend.pause_queue(queue, actor)

    def resume_queue(self, queue: str, *, actor: str) -> bool:
        """Let workers start jobs of ``queue`` again, audited; ``False`` if it was not paused.

        Raises:
            ConfigurationError: ``queue`` is not a valid queue name, or ``actor`` is empty.
        """
        queue, actor = check_queue_name(queue), checks.actor(actor)
        return self.backend.resume_queue(queue, actor)

    def cancel(self, job_id: int, *, actor: str) -> Job:
        """Cancel a job, audited under ``actor``; returns the job as it is then.

        A queued job, ready or scheduled for later, never runs: it is buried at once as
        ``cancelled`` (a dead job: replay it to run it after all). A running one is told to
        stop: its worker reads the cancel with the lease's next renewal, ``ctx.cancel_requested``
        turns true, its next step raises :class:`~jobguard.exceptions.JobCancelled` (an
        ``async def`` handler is cancelled), and the attempt ends with the job buried as
        ``cancelled``, not retried; a thread-mode worker gives up a handler that does not stop
        one heartbeat later. See ``docs/limits.md``.

        Raises:
            NotFoundError: there is no job ``job_id``.
            JobFinishedError: it already completed or is dead (nothing is changed).
            ConfigurationError: ``job_id`` is not a job id, or ``actor`` is empty.
        """
        job_id, actor = checks.job_id(job_id), checks.actor(actor)
        job = self.backend.cancel(job_id, actor, messages.cancelled(job_id, actor))
        if job is None:
            current = self.backend.get_job(job_id)  # NotFoundError if there is none
            raise JobFinishedError(messages.cancel_refused(job_id, current.status))
        return job

    def retry_now(self, job_id: int, *, actor: str) -> Job:
        """Run a job that waits on its backoff (a retry's delay, a delay given at enqueue, a
        busy lock) as soon as a worker is free: it becomes due now on the store's clock.

        Nothing else changes: its attempts so far, ``max_attempts``, keys and queue stay, so a
        failure of the hurried run counts like any other. Audited (``retry-now``) under
        ``actor``. Returns the job as it is now.

        Raises:
            NotFoundError: There is no job ``job_id``.
            JobStateError: The job is running, completed, dead (replay it instead) or queued
                and due already; nothing was changed.
            ConfigurationError: ``job_id`` is not a job id, or ``actor`` is empty.
        """
        return retrynow.retry_now(self, job_id, actor)

    def paused_queues(self) -> list[PausedQueue]:
        """Every paused queue with when and by whom it was paused."""
        return self.backend.paused_queues()

    def find_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        """Newest jobs first, matching every filter given; ``limit`` of them from ``offset``."""
        if not 1 <= limit <= MAX_PAGE or offset < 0:
            raise ConfigurationError(f"limit must be 1..{MAX_PAGE} and offset >= 0")
        queue = checks.optional_text("queue", queue)
        task = checks.optional_text("task", task)
        return self.backend.find_jobs(
            status=status, queue=queue, task=task, limit=limit, offset=offset
        )

    def outcome_timeline(
        self, since_s: float, bucket_s: float, window: int = 20000
    ) -> list[OutcomeCount]:
        """Attempts of the last ``since_s`` seconds per ``bucket_s`` and outcome.

        Only the ``window`` most recent attempts are read (throughput and failures over time).
        """
        if since_s <= 0 or bucket_s <= 0 or window < 1:
            raise ConfigurationError("since_s and bucket_s must be > 0 and window >= 1")
        return self.backend.outcome_timeline(self.backend.now() - since_s, bucket_s, window)

    def replay_dead(
        self, selection: DeadFilter, *, actor: str = "api", batch_size: int = 500
    ) -> ReplayReport:
        """Replay every dead job ``selection`` matches, each once; see
        :meth:`DeadLetterQueue.replay_many` (audited as ``replay-dead``)."""
        return self.dlq.replay_many(selection, actor=actor, batch_size=batch_size)

    def purge_dead(
        self, selection: DeadFilter, *, actor: str = "api", batch_size: int = 500
    ) -> int:
        """Delete every dead job ``selection`` matches with its attempts; see
        :meth:`DeadLetterQueue.purge_many` (audited as ``purge-dead``)."""
        return self.dlq.purge_many(selection, actor=actor, batch_size=batch_size)

    def audit_trail(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent operator actions (replays and purges with an actor), newest first."""
        return self.backend.audit_trail(limit)

    def attempts(
        self, *, job_id: int | None = None, operation_key: str | None = None, limit: int = 1000
    ) -> list[Attempt]:
        """The attempt log (G10.1) of a job, an operation, or the most recent attempts."""
        if job_id is not None:
            checks.job_id(job_id)
        operation_key = checks.optional_text("operation key", operation_key)
        limit = checks.count("limit", limit)
        return self.backend.attempts(job_id=job_id, operation_key=operation_key, limit=limit)

    def operation(self, key: str) -> Operation | None:
        """The operation record for ``key`` with its completed steps, or ``None``."""
        return self.backend.get_operation(checks.text("operation key", key))

    def diagnose(
        self, *, task: str | None = None, since_s: float | None = None, limit: int = 5000
    ) -> Diagnosis:
        """Overlaps, durations against timeouts, retry spikes and an audit (G10.2-G10.5).

        Read-only. Looks at the ``limit`` most recent attempts (and as many newest jobs), of
        ``task`` only if given, active in the last ``since_s`` seconds if given. See
        ``docs/diagnostics.md``; ``jobguard doctor`` prints the same report.
        """
        from jobguard.diagnostics import diagnose, read_snapshot

        since_s = checks.optional_seconds("since_s", since_s, positive=True)
        limit = checks.count("limit", limit)
        task = checks.optional_text("task", task)
        return diagnose(read_snapshot(self.backend, task=task, since_s=since_s, limit=limit))

    # -- running --------------------------------------------------------------------------------

    def worker(self, queues: list[str] | None = None, **options: Any) -> Worker:
        """A :class:`~jobguard.worker.Worker` for these queues (default: every task's queue)."""
        return Worker(self, queues, **options)

    def process_worker(self, queues: list[str] | None = None, **options: Any) -> ProcessWorker:
        """A :class:`~jobguard.supervisor.ProcessWorker` for these queues: each slot a child
        process running one job at a time, which enforces hard time limits."""
        return ProcessWorker(self, queues, **options)

    @contextlib.contextmanager
    def lock(
        self, resource: str, ttl_s: float = 30.0, *, renew: bool = True
    ) -> Iterator[LockGrant]:
        """Hold the resource lock for a block of code outside jobs (G3).

        Raises :class:`~jobguard.exceptions.LockBusyError` if another live owner holds it. While
        held, a background thread renews it every ``ttl_s / 3`` (unless ``renew=False``); a
        renewal the store fails is reported to :meth:`~jobguard.hooks.Hooks.store_error` and
        tried again.
        The grant's ``fence`` is strictly larger than any fence issued before for ``resource``.
        """
        ttl_s = checks.seconds("ttl_s", ttl_s, positive=True)
        resource = checks.text("resource", resource)
        owner = f"lock/{secrets.token_hex(8)}"
        grant = self.backend.acquire_lock(resource, owner, ttl_s)
        if grant is None:
            raise LockBusyError(resource)
        stop = threading.Event()
        renewer: threading.Thread | None = None
        if renew:

            def keep_alive() -> None:
                while not stop.wait(ttl_s / 3):
                    try:
                        if not self.backend.renew_lock(grant, ttl_s):
                            return  # taken over: the fence now refuses this holder's writes
                    except JobGuardError as exc:
                        # As the heartbeat does: a store hiccup must not end renewal for good.
                        self.hooks.store_error("lock renew", exc)

            renewer = threading.Thread(target=keep_alive, name="jobguard-lock-renew", daemon=True)
            renewer.start()
        try:
            yield grant
        except BaseException:
            self._stop_renewing(stop, renewer)
            # The block's own error is what the caller needs; a failed release only delays the
            # lock's expiry, so it must not replace it.
            with contextlib.suppress(JobGuardError):
                self.backend.release_lock(grant)
            raise
        self._stop_renewing(stop, renewer)
        self.backend.release_lock(grant)

    @contextlib.asynccontextmanager
    async def lock_async(
        self, resource: str, ttl_s: float = 30.0, *, renew: bool = True
    ) -> AsyncIterator[LockGrant]:
        """:meth:`lock` from async code (``async with``): taking, renewing and releasing the
        lock run on threads, never on the event loop."""
        held = self.lock(resource, ttl_s, renew=renew)
        grant = await asyncio.to_thread(held.__enter__)
        try:
            yield grant
        except BaseException as exc:
            if not await asyncio.to_thread(held.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await asyncio.to_thread(held.__exit__, None, None, None)

    @staticmethod
    def _stop_renewing(stop: threading.Event, renewer: threading.Thread | None) -> None:
        stop.set()
        if renewer is not None:
            renewer.join()


# The options of App.task that App.periodic passes through (name and dedup_window_s are its own).
_PERIODIC_TASK_OPTIONS = frozenset(inspect.signature(App.task).parameters) - {
    "self",
    "fn",
    "name",
    "dedup_window_s",
}

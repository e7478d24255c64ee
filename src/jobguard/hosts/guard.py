"""The guard around a task of another queue: admission, the pipeline, the host's verdict.

::

    host delivery (Celery task id, RQ job id, Dramatiq message id)
        ─► admit against the shadow job (store: one transaction)
             held by a live delivery / due later ─► HAND_BACK(delay)   (run nothing)
             dead                               ─► DEAD               (ack; replay resends)
             leased to this delivery ─► the same Pipeline as jobguard's own worker
                 (resource lock + fence, operation record, steps, retry classification)
                 completed / already processed  ─► ACK
                 transient error                ─► RETRY(jobguard's backoff)
                 resource busy, fence refused   ─► HAND_BACK(delay)
                 fatal, poison, spent           ─► DEAD (jobguard's dead letter queue)

While the handler runs, this process's heartbeat renews the shadow job's lease and the lock.
Each host adapter (``jobguard.hosts.celery``, ``.rq``, ``.dramatiq``) only maps a
:class:`Verdict` onto the host's own ack, retry and failure.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from jobguard.app import App
from jobguard.backends import open_backend
from jobguard.backends.base import Backend, Ending
from jobguard.context import InFlight
from jobguard.core.hosts import HOST_HEADER, HOST_TIMEOUT_HEADER, Admit
from jobguard.core.retry import RetryPolicy, deferral_delay_s
from jobguard.exceptions import ConfigurationError, JobGuardError, StoreUnavailableError
from jobguard.heartbeat import Heartbeat
from jobguard.models import Job, JobSpec, Outcome
from jobguard.pipeline import Pipeline
from jobguard.settler import Settler
from jobguard.task import CallOptions, Task

HOST_ID = "jobguard.host_id"  # the header of a reserved shadow job naming the host's message

# Options of App.task that a guarded host task takes too, with the same meaning.
GUARD_OPTIONS = (
    "name",
    "operation_key",
    "resource_key",
    "lock_ttl_s",
    "concurrency_key",
    "concurrency_limit",
    "visibility_timeout_s",
    "max_attempts",
    "backoff_base_s",
    "backoff_cap_s",
    "fatal",
    "transient",
    "poison_threshold",
    "max_defer_s",
    "dedup",
    "dedup_unsent_s",
)
# How long a deduplicated send's shadow job may stay due with no delivery taking it before the
# next send of its key sends again (its producer died before sending, or the host lost it).
DEFAULT_DEDUP_UNSENT_S = 300.0


class Verdict(StrEnum):
    """What the host should do with its delivery."""

    ACK = "ack"  # done (completed, or already processed): ack the message
    HAND_BACK = "hand_back"  # not run: deliver again after ``delay_s``, charging nothing
    RETRY = "retry"  # ran and failed transiently: the host's retry after ``delay_s``
    DEAD = "dead"  # in jobguard's dead letter queue: ack; `jobguard dlq replay` resends it


@dataclass(frozen=True, slots=True)
class HostVerdict:
    """The guard's answer for one host delivery."""

    verdict: Verdict
    delay_s: float = 0.0
    reason: str = ""
    job_id: int | None = None


def shadow_key(host: str, task: str, operation_key: str) -> str:
    """The key that finds a guarded host task's shadow job (one per operation)."""
    return f"host:{host}:{task}:{operation_key}"


def check_guardable(name: str, fn: Callable[..., Any]) -> inspect.Signature:
    """Refuse a function whose arguments a host message cannot carry by name (at import)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"guarded task {name!r}: cannot read its signature") from exc
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"guarded task {name!r}: the function must take ctx (jobguard's context) as its "
            "first argument, e.g. def fulfil_order(ctx, order_id)"
        )
    for param in params[1:]:
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise ConfigurationError(
                f"guarded task {name!r}: argument {param.name!r} cannot be guarded: jobguard "
                "stores a task's arguments by name (JSON object), so positional-only and *args "
                "arguments are refused; make them ordinary arguments"
            )
    return signature


def check_store(store: App) -> Backend:
    """The store opened once, here: an unreachable store fails at import, not at a job.

    The backend is left with no connection open in this process, and is shared by every
    process forked from it: each process opens its own connections on first use (the backends
    never let a connection cross ``fork()``), so a host that forks a process per job (RQ's work
    horse) neither opens nor checks the store again for every job.
    """
    if not isinstance(store, App):
        raise ConfigurationError(f"the guard's store must be a jobguard.App, not {store!r}")
    url = store.store_url  # worker processes started anew open their own from it
    if url is None:
        raise ConfigurationError(
            "a guarded host task needs the store as a URL (jobguard.App(url)), not a backend "
            "object: each worker process of the host opens its own connections to it"
        )
    try:
        backend = open_backend(url)
        try:
            backend.count_jobs()
        finally:
            backend.close()
    except JobGuardError as exc:
        raise StoreUnavailableError(
            f"the jobguard store at {store.url} cannot be used: {exc}"
        ) from exc
    return backend


def _ignore(_: object) -> None:
    """Nothing to count or free per delivery: the host keeps its own statistics."""


class _Pending:
    """One delivery's ending, waiting to be written with the others gathered meanwhile."""

    __slots__ = ("ending", "error", "final", "inflight", "written")

    def __init__(self, inflight: InFlight, ending: Ending) -> None:
        self.inflight = inflight
        self.ending = ending
        self.final: Ending | None = None
        self.error: BaseException | None = None
        self.written = False

    def result(self) -> Ending:
        if self.error is not None:
            raise self.error
        assert self.final is not None
        return self.final


class Gathering:
    """The endings of this process's deliveries written together (a group commit).

    A delivery that ends while no ending is being written writes its own at once, as one
    :meth:`Settler.settle`. One that ends while another's is being written waits for that
    commit; then every ending gathered meanwhile is written in one settle, by the first of
    them, and each waits for its own. A host that runs one delivery at a time per process
    (Celery's prefork, RQ's work-horse) always writes alone; one that runs several threads
    (Dramatiq) commits once for the deliveries that end together. No delivery returns to its
    host before its ending is written, as before.
    """

    def __init__(self, settler: Settler) -> None:
        self._settler = settler
        self._turn = threading.Condition()
        self._gathered: list[_Pending] = []
        self._writing = False

    def settle(self, inflight: InFlight, ending: Ending) -> Ending:
        """Write one delivery's ending (with those gathered meanwhile); its final ending."""
        mine = _Pending(inflight, ending)
        with self._turn:
            self._gathered.append(mine)
            while self._writing and not mine.written:
                self._turn.wait()
            if mine.written:  # another delivery wrote it with its own
                return mine.result()
            self._writing = True
            batch, self._gathered = self._gathered, []
        try:
            finals = self._settler.settle([(item.inflight, item.ending) for item in batch])
            for item, final in zip(batch, finals, strict=True):
                item.final = final
        except BaseException as exc:  # a bug, or the host's time limit raised in this thread
            for item in batch:
                item.error = exc
            raise
        finally:
            with self._turn:
                for item in batch:
                    item.written = True
                self._writing = False
                self._turn.notify_all()
        return mine.result()


class _Runtime:
    """This process's pipeline and heartbeat (made after any fork, per pid) over the guard's
    backend, whose connections are this process's own."""

    def __init__(self, host: str, backend: Backend, store: App, tasks: Mapping[str, Task]) -> None:
        self.backend = backend
        self.worker_id = f"{host}:{socket.gethostname()}:{os.getpid()}"
        self.pipeline = Pipeline(self.backend, tasks, self.worker_id, store.hooks)
        # The worker's settler, used in the handlers' threads: the endings of deliveries that
        # end together are written in one settle.
        self.settler = Settler(
            self.backend, self.pipeline, store.hooks, counted=_ignore, done=_ignore
        )
        self.endings = Gathering(self.settler)
        self._inflight: dict[str, InFlight] = {}
        self._lock = threading.Lock()
        self.heartbeat = Heartbeat(self.backend, self._snapshot, store.hooks)
        self.heartbeat.start()

    def _snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._inflight.values())

    def hold(self, inflight: InFlight) -> None:
        with self._lock:
            self._inflight[inflight.delivery.lease_token] = inflight
        self.heartbeat.poke()

    def drop(self, inflight: InFlight) -> None:
        with self._lock:
            self._inflight.pop(inflight.delivery.lease_token, None)

    def close(self) -> None:
        self.heartbeat.stop()
        self.heartbeat.join()
        self.backend.close()


class HostGuard:
    """What every host's guard shares: the store, the guarded tasks, this process's runtime.

    Args:
        host: The host's name (``celery``, ``rq``, ``dramatiq``), kept on every attempt.
        store: The jobguard store (a :class:`jobguard.App` made from a URL).
        max_hand_back_s: The longest delay a handed-back delivery is given (the host's own
            limit, e.g. less than Celery's visibility timeout).
    """

    def __init__(self, host: str, store: App, *, max_hand_back_s: float) -> None:
        self.host = host
        self.store = store
        # Opened once in this process; every process forked from it shares the object.
        self.backend = check_store(store)
        self.max_hand_back_s = max_hand_back_s
        self.tasks: dict[str, Task] = {}
        self._runtime: _Runtime | None = None
        self._runtime_pid = 0
        self._runtime_lock = threading.Lock()
        self.dedup: dict[str, bool] = {}
        self.dedup_unsent_s: dict[str, float] = {}
        # The host's limit on a delivery's duration, per task, where it has one (recorded on
        # the shadow job, for the doctor).
        self.host_timeouts: dict[str, float | None] = {}

    def define(
        self,
        fn: Callable[..., Any],
        name: str,
        options: Mapping[str, Any],
        *,
        host_timeout_s: float | None = None,
    ) -> Task:
        """Check a guarded function and its jobguard options; keep its definition.

        ``host_timeout_s`` is the host's own limit on one delivery's duration for this task
        (Celery's visibility timeout, Dramatiq's time limit), if it has one.
        """
        unknown = sorted(set(options) - set(GUARD_OPTIONS))
        if unknown:
            raise ConfigurationError(f"guarded task {name!r}: unknown option(s) {unknown}")
        check_guardable(name, fn)
        if not options.get("operation_key"):
            raise ConfigurationError(
                f"guarded task {name!r} needs operation_key= (e.g. 'fulfil-order:{{order_id}}'):"
                " it names the business action that must happen once, however often the host "
                "delivers it"
            )
        if name in self.tasks:
            raise ConfigurationError(f"guarded task {name!r} is defined twice")
        policy = RetryPolicy(
            max_attempts=options.get("max_attempts", 5),
            backoff_base_s=options.get("backoff_base_s", 1.0),
            backoff_cap_s=options.get("backoff_cap_s", 300.0),
            fatal=options.get("fatal", ()),
            transient=options.get("transient"),
            poison_threshold=options.get("poison_threshold", 3),
        )
        task = Task(
            self.store,
            fn,
            name=name,
            queue=f"host-{self.host}",
            visibility_timeout_s=options.get("visibility_timeout_s", 30.0),
            policy=policy,
            priority=0,
            operation_key=options["operation_key"],
            resource_key=options.get("resource_key"),
            lock_ttl_s=options.get("lock_ttl_s", 30.0),
            concurrency_key=options.get("concurrency_key"),
            concurrency_limit=options.get("concurrency_limit"),
            max_defer_s=options.get("max_defer_s", 3600.0),
            dedup_window_s=0.0,
        )
        unsent_s = options.get("dedup_unsent_s", DEFAULT_DEDUP_UNSENT_S)
        if not isinstance(unsent_s, int | float) or isinstance(unsent_s, bool) or unsent_s <= 0:
            raise ConfigurationError(
                f"guarded task {name!r}: dedup_unsent_s must be a positive number of seconds, "
                f"not {unsent_s!r}"
            )
        self.tasks[name] = task
        self.dedup[name] = bool(options.get("dedup", False))
        self.dedup_unsent_s[name] = float(unsent_s)
        self.host_timeouts[name] = host_timeout_s
        return task

    def arguments(
        self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The host's call arguments as the named arguments jobguard stores."""
        task = self.tasks[name]
        try:
            bound = task.signature.bind_partial(None, *args, **kwargs)
        except TypeError as exc:
            raise ConfigurationError(
                f"guarded task {name!r}: arguments do not match the function: {exc}"
            ) from exc
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(task.signature.parameters)))
        return arguments

    def spec(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        host_timeout_s: float | None = None,
        host_id: str | None = None,
    ) -> JobSpec:
        """The shadow job of one call (validated, keyed by its operation), its headers naming
        the host, its limit on a delivery's duration (``host_timeout_s``, else the task's) and
        the host's id of the message sent for it (``host_id``, a deduplicated send's)."""
        task = self.tasks[name]
        spec = task.build_spec(arguments, CallOptions())
        assert spec.operation_key is not None  # define() requires the template
        headers: dict[str, Any] = {HOST_HEADER: self.host}
        timeout = host_timeout_s if host_timeout_s is not None else self.host_timeouts[name]
        if timeout is not None:
            headers[HOST_TIMEOUT_HEADER] = timeout
        if host_id is not None:
            headers[HOST_ID] = host_id
        return replace(
            spec,
            dedup_key=shadow_key(self.host, name, spec.operation_key),
            headers=json.dumps(headers),
        )

    def runtime(self) -> _Runtime:
        """This process's runtime, made on first use in the process (so after a fork)."""
        pid = os.getpid()
        if self._runtime is None or self._runtime_pid != pid:
            with self._runtime_lock:
                if self._runtime is None or self._runtime_pid != pid:
                    self._runtime = _Runtime(self.host, self.backend, self.store, self.tasks)
                    self._runtime_pid = pid
        return self._runtime

    def close(self) -> None:
        """Stop this process's heartbeat and close its connections (the guard reopens them if
        used again)."""
        with self._runtime_lock:
            if self._runtime is not None and self._runtime_pid == os.getpid():
                self._runtime.close()
            self._runtime = None

    def reserve(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        host_id: str,
        host_timeout_s: float | None = None,
    ) -> Job:
        """Producer-side dedup: store the shadow job queued, or find the live one holding it.

        Concurrent producers of one operation are serialised by the store's dedup key lock, so
        exactly one of them sees ``deduplicated`` False and sends a message (``host_id``, the
        host's id of that message, is kept on the job). A live job left due for the task's
        ``dedup_unsent_s`` with no delivery taking it (its producer died before sending) is
        taken over by the next send, which sends again.
        """
        spec = self.spec(name, arguments, host_timeout_s=host_timeout_s, host_id=host_id)
        return self.runtime().backend.reserve_host_job(spec, self.dedup_unsent_s[name])

    @staticmethod
    def host_id_of(job: Job) -> str | None:
        """The host's id of the message a reserved shadow job was sent as, if known."""
        try:
            headers = json.loads(job.headers or "{}")
        except ValueError:
            return None
        found = headers.get(HOST_ID) if isinstance(headers, dict) else None
        return found if isinstance(found, str) else None

    def on_replay(self, name: str, send: Callable[[dict[str, Any]], None]) -> None:
        """Resend a replayed dead job of task ``name`` through the host (``jobguard dlq
        replay``): ``send`` gets the job's arguments."""

        def resend(job: Job) -> None:
            arguments = json.loads(job.payload)
            send(arguments)

        self.store.host_replays[name] = resend

    def run(
        self,
        name: str,
        arguments: Mapping[str, Any],
        host_delivery: str,
        *,
        host_timeout_s: float | None = None,
    ) -> HostVerdict:
        """Admit one host delivery and, if it got the lease, run it through the pipeline
        (``host_timeout_s``: this delivery's limit, where the host sets one per message)."""
        task = self.tasks[name]
        runtime = self.runtime()
        store = self.store
        spec = self.spec(name, arguments, host_timeout_s=host_timeout_s)
        rules = task.delivery_rules()
        try:
            admitted = runtime.backend.admit_host_delivery(
                spec, runtime.worker_id, rules, f"{self.host}:{host_delivery}"
            )
        except JobGuardError as exc:
            # The store is out of reach: the host keeps the message and delivers it again.
            store.hooks.store_error("host admission", exc)
            return self._hand_back(self.max_hand_back_s, f"store error: {exc}", None)
        if admitted.admit in (Admit.HELD, Admit.EARLY):
            return self._hand_back(admitted.wait_s, admitted.admit.value, admitted.job_id)
        if admitted.admit == Admit.DEAD:
            return HostVerdict(
                Verdict.DEAD, reason="in the dead letter queue", job_id=admitted.job_id
            )
        assert admitted.prepared is not None
        inflight = runtime.pipeline.adopt(admitted.prepared)
        runtime.hold(inflight)
        try:
            return self._execute(runtime, inflight)
        finally:
            runtime.drop(inflight)

    def _hand_back(self, wait_s: float, reason: str, job_id: int | None) -> HostVerdict:
        delay = min(
            self.max_hand_back_s, max(wait_s, deferral_delay_s(0, self.runtime().pipeline.rng))
        )
        return HostVerdict(Verdict.HAND_BACK, delay, reason, job_id)

    def _execute(self, runtime: _Runtime, inflight: InFlight) -> HostVerdict:
        """The pipeline decides the ending, the settler writes it (as for jobguard's own
        jobs); the final ending becomes the host's verdict."""
        job_id = inflight.delivery.job_id
        ending = runtime.pipeline.run(inflight)
        final = runtime.endings.settle(inflight, ending)
        outcome = final.outcome
        if outcome in (Outcome.COMPLETED, Outcome.ALREADY_PROCESSED, Outcome.LEASE_REFUSED):
            # A refused lease: another delivery holds the job now, and its message finishes it.
            return HostVerdict(Verdict.ACK, reason=final.reason or outcome.value, job_id=job_id)
        if outcome == Outcome.DEAD:
            return HostVerdict(Verdict.DEAD, reason=final.reason, job_id=job_id)
        if outcome == Outcome.RETRY:
            # Never longer than the host allows; an early delivery is handed back till due.
            delay = min(final.delay_s, self.max_hand_back_s)
            return HostVerdict(Verdict.RETRY, delay, final.reason, job_id)
        if outcome == Outcome.LOST:
            # Nothing was written (the store failed): the lease expires, then a delivery
            # takes the job over.
            return self._hand_back(inflight.delivery.visibility_timeout_s, final.reason, job_id)
        # Deferred (the resource is busy), fence refused (handed back uncharged), released.
        return self._hand_back(final.delay_s, final.reason or outcome.value, job_id)

"""Guard Celery tasks: Celery keeps delivering, routing and monitoring; jobguard keeps the promise.

::

    import jobguard
    from celery import Celery
    from jobguard.hosts.celery import CeleryGuard

    celery_app = Celery("shop", broker="redis://127.0.0.1:6379/0")
    guard = CeleryGuard(celery_app, jobguard.App("postgresql://app@db/shop"))

    @guard.task(operation_key="fulfil-order:{order_id}", resource_key="order:{order_id}")
    def fulfil_order(ctx, order_id): ...

    fulfil_order.delay(order_id=42)   # a Celery task as before

Every task is made with ``acks_late=True`` and ``reject_on_worker_lost=True`` (a killed worker's
message goes back to the queue, where the guard meets it), ``bind=True`` and unlimited Celery
retries: jobguard decides how often a task runs. A delivery handed back (the operation is held
by a live delivery, or its resource is busy) is ``self.retry(countdown=...)`` with a countdown
below the broker's visibility timeout, so Celery never restores the waiting message twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

try:
    from celery import Celery
    from celery import Task as CeleryTask
    from celery.exceptions import Reject
except ImportError as exc:  # the host is an optional extra
    raise ImportError(
        f"jobguard.hosts.celery needs Celery: pip install 'jobguard[celery]' ({exc})"
    ) from exc

from jobguard.app import App
from jobguard.exceptions import ConfigurationError
from jobguard.hosts.guard import GUARD_OPTIONS, HostGuard, Verdict

# Celery options the guard sets itself, or that would let Celery decide what jobguard decides.
REFUSED = {
    "bind": "the guard binds the task itself",
    "base": "the guard gives the task its own base class",
    "max_retries": "jobguard counts attempts (max_attempts=)",
    "autoretry_for": "jobguard classifies errors and retries (transient=, fatal=)",
    "retry_backoff": "jobguard's backoff applies (backoff_base_s=, backoff_cap_s=)",
    "retry_kwargs": "jobguard decides retries",
    "typing": "the guard checks arguments against the function when a task is sent",
}
REQUIRED_TRUE = {
    "acks_late": "without it Celery acks before the task runs, and a killed worker loses it",
    "reject_on_worker_lost": "without it a killed worker's message is acked as failed: lost",
}
DEFAULT_VISIBILITY_TIMEOUT_S = 3600.0  # kombu's default for Redis and SQS
NO_VISIBILITY_CAP_S = 60.0
VISIBILITY_BROKERS = ("redis", "rediss", "sqs", "sentinel")


def _visibility_timeout_s(celery_app: Celery) -> float | None:
    """The broker's visibility timeout, or ``None`` when its broker has none (AMQP)."""
    scheme = str(celery_app.conf.broker_url or "").split("://", 1)[0].split("+")[0]
    if scheme not in VISIBILITY_BROKERS:
        return None
    options = celery_app.conf.broker_transport_options or {}
    value = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT_S)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(
            f"broker_transport_options['visibility_timeout'] must be a positive number of "
            f"seconds, not {value!r}"
        )
    return float(value)


class GuardedCeleryTask(CeleryTask):  # type: ignore[misc]
    """The base of every guarded task: sending checks arguments and deduplicates if asked."""

    jobguard_guard: CeleryGuard
    jobguard_name: str

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """Send as Celery does, after the guard checked the arguments (no I/O).

        With ``dedup=True`` on the task, nothing is sent while the operation's job is queued or
        running; the result is then the ``AsyncResult`` of the message that holds it.
        """
        guard = self.jobguard_guard
        arguments = guard.arguments(self.jobguard_name, tuple(args or ()), kwargs or {})
        if not guard.dedup[self.jobguard_name]:
            guard.spec(self.jobguard_name, arguments)  # refused here, not at the worker
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        task_id = task_id or str(uuid.uuid4())
        job = guard.reserve(self.jobguard_name, arguments, host_id=task_id)
        if job.deduplicated:
            return self.AsyncResult(guard.host_id_of(job) or task_id)
        return super().apply_async(args, kwargs, task_id=task_id, **options)


class CeleryGuard(HostGuard):
    """The guard for one Celery application.

    Args:
        celery_app: The Celery application whose tasks are guarded.
        store: The jobguard store (``jobguard.App(url)``); opened once here, so an unreachable
            store fails at import, not at the first task.

    Raises:
        ConfigurationError: the broker's visibility timeout is not a positive number.
        StoreUnavailableError: the store cannot be opened.
    """

    def __init__(self, celery_app: Celery, store: App) -> None:
        if not isinstance(celery_app, Celery):
            raise ConfigurationError(f"CeleryGuard needs a celery.Celery app, not {celery_app!r}")
        visibility_s = _visibility_timeout_s(celery_app)
        # A handed-back message waits in the worker as an ETA message, unacked: it must come
        # due before the visibility timeout, or the broker restores a second copy of it.
        cap = NO_VISIBILITY_CAP_S if visibility_s is None else visibility_s / 2
        super().__init__("celery", store, max_hand_back_s=cap)
        self.celery_app = celery_app
        self.visibility_timeout_s = visibility_s

    def task(self, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """Make a guarded Celery task of ``fn(ctx, ...)``.

        jobguard's options (``operation_key`` is required; ``resource_key``, ``lock_ttl_s``,
        ``visibility_timeout_s`` — the shadow job's lease —, ``max_attempts``, ``backoff_*``,
        ``fatal``, ``transient``, ``poison_threshold``, ``max_defer_s``, ``dedup``,
        ``dedup_unsent_s`` — how long a deduplicated send's reservation waits for its first
        delivery before the next send sends again, default 300 —, ``name``)
        are taken here; every other option goes to ``celery_app.task`` (``queue``...), except
        those that would let Celery decide what jobguard decides, which are refused.
        """
        guard_options = {k: v for k, v in options.items() if k in GUARD_OPTIONS}
        celery_options = {k: v for k, v in options.items() if k not in GUARD_OPTIONS}
        for option, why in REFUSED.items():
            if option in celery_options:
                raise ConfigurationError(f"guarded Celery task: {option}= is refused: {why}")
        for option, why in REQUIRED_TRUE.items():
            if celery_options.pop(option, True) is not True:
                raise ConfigurationError(f"guarded Celery task: {option}=False is refused: {why}")

        def register(fn: Callable[..., Any]) -> Any:
            name = guard_options.pop("name", None) or f"{fn.__module__}.{fn.__qualname__}"
            self.define(fn, name, guard_options, host_timeout_s=self.visibility_timeout_s)

            def run(task: CeleryTask, *args: Any, **kwargs: Any) -> None:
                return self._deliver(task, name, args, kwargs)

            run.__name__ = fn.__name__
            run.__qualname__ = fn.__qualname__
            run.__module__ = fn.__module__
            run.__doc__ = fn.__doc__
            task = self.celery_app.task(
                run,
                name=name,
                bind=True,
                base=GuardedCeleryTask,
                acks_late=True,
                reject_on_worker_lost=True,
                max_retries=None,
                typing=False,
                jobguard_guard=self,
                jobguard_name=name,
                **celery_options,
            )
            # A replayed dead job goes back through Celery (past the producer's dedup: its
            # shadow job is queued again and waits for exactly this message).
            self.on_replay(name, lambda arguments: CeleryTask.apply_async(task, kwargs=arguments))
            return task

        return register

    def _deliver(
        self, task: CeleryTask, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        request = task.request
        arguments = self.arguments(name, args, kwargs)
        delivery = f"{request.id or uuid.uuid4()}#{request.retries}"
        verdict = self.run(name, arguments, delivery)
        if verdict.verdict == Verdict.ACK:
            return
        if verdict.verdict == Verdict.DEAD:
            raise Reject(f"jobguard job {verdict.job_id}: {verdict.reason}", requeue=False)
        raise task.retry(countdown=verdict.delay_s, max_retries=None)

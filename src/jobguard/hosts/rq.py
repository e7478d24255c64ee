"""Guard RQ jobs: RQ keeps its queues, workers and registries; jobguard keeps the promise.

::

    import jobguard
    from jobguard.hosts.rq import RQGuard

    guard = RQGuard(jobguard.App("postgresql://app@db/shop"))

    @guard.job(operation_key="fulfil-order:{order_id}", resource_key="order:{order_id}")
    def fulfil_order(ctx, order_id): ...

    fulfil_order.enqueue(queue, order_id=42)   # or queue.enqueue(fulfil_order, order_id=42)

The guarded function stays importable under its own name, so RQ's workers find it as they find
any job function. A delivery handed back (the operation is held by a live delivery, or its
resource is busy) and a transient failure both *return* ``rq.Retry(interval=...)``, which RQ
2.x reschedules (workers need ``--with-scheduler``). ``enqueue`` gives each job
``retry=Retry(max=max_attempts)``, so a work-horse SIGKILLed mid-job is queued again by RQ.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Callable
from typing import Any

try:
    from rq import Queue, Retry, get_current_job
except ImportError as exc:  # the host is an optional extra
    raise ImportError(f"jobguard.hosts.rq needs RQ: pip install 'jobguard[rq]' ({exc})") from exc

from jobguard.app import App
from jobguard.exceptions import ConfigurationError
from jobguard.hosts.guard import GUARD_OPTIONS, HostGuard, Verdict

MAX_HAND_BACK_S = 60.0
ENDLESS = 10**9  # RQ counts a job's retries; jobguard counts its attempts


class DeadLettered(Exception):
    """Raised to RQ for a job jobguard buried: RQ records it failed (replay resends it)."""


def _deliver(guard: RQGuard, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one delivery (RQ calls the guarded function in its work-horse)."""
    arguments = guard.arguments(name, args, kwargs)
    job = get_current_job()
    delivery = f"{job.id}#{job.number_of_retries or 0}" if job else f"direct-{uuid.uuid4()}"
    timeout = _timeout_s(job.timeout) if job else None
    verdict = guard.run(name, arguments, delivery, host_timeout_s=timeout)
    if verdict.verdict == Verdict.ACK:
        return None
    if verdict.verdict == Verdict.DEAD:
        raise DeadLettered(f"jobguard job {verdict.job_id}: {verdict.reason}")
    # Whole seconds (RQ's unit), never 0: a held operation is not polled in a busy loop.
    return Retry(max=ENDLESS, interval=max(1, math.ceil(verdict.delay_s)))


def _timeout_s(timeout: Any) -> float | None:
    """An RQ job timeout in seconds; ``None`` for none (RQ's -1, or unset)."""
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout)
    return None


def _enqueue(
    guard: RQGuard, fn: Callable[..., Any], name: str, queue: Queue, arguments: dict[str, Any],
    *, dedup: bool,
) -> Any:  # fmt: skip
    spec = guard.spec(name, arguments)  # refused here, not in the worker
    job_id = str(uuid.uuid4())
    if dedup:
        # The queue's default job timeout, which RQ gives the job enqueued below.
        timeout = _timeout_s(getattr(queue, "_default_timeout", Queue.DEFAULT_TIMEOUT))
        reserved = guard.reserve(name, arguments, host_id=job_id, host_timeout_s=timeout)
        if reserved.deduplicated:
            return None
    return queue.enqueue(fn, kwargs=arguments, job_id=job_id, retry=Retry(max=spec.max_attempts))


class RQGuard(HostGuard):
    """The guard for RQ jobs on one jobguard store.

    Args:
        store: The jobguard store (``jobguard.App(url)``); opened once here, so an unreachable
            store fails at import, not at the first job.
        replay_queue: Where ``jobguard dlq replay`` sends a replayed job (an ``rq.Queue``);
            without it, replayed jobs of these functions are refused.
    """

    def __init__(self, store: App, *, replay_queue: Queue | None = None) -> None:
        if replay_queue is not None and not isinstance(replay_queue, Queue):
            raise ConfigurationError(f"replay_queue must be an rq.Queue, not {replay_queue!r}")
        super().__init__("rq", store, max_hand_back_s=MAX_HAND_BACK_S)
        self.replay_queue = replay_queue

    def job(self, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """Make a guarded RQ job function of ``fn(ctx, ...)``; options as in
        :meth:`jobguard.hosts.celery.CeleryGuard.task` (``operation_key`` is required)."""
        unknown = sorted(set(options) - set(GUARD_OPTIONS))
        if unknown:
            raise ConfigurationError(f"guarded RQ job: unknown option(s) {', '.join(unknown)}")

        def register(fn: Callable[..., Any]) -> Any:
            name = options.get("name") or f"{fn.__module__}.{fn.__qualname__}"
            self.define(fn, name, {k: v for k, v in options.items() if k != "name"})

            # A plain function under fn's own name: RQ stores "module.name" and its workers
            # import exactly this.
            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                return _deliver(self, name, args, kwargs)

            def enqueue(queue: Queue, /, *args: Any, **kwargs: Any) -> Any:
                """``queue.enqueue`` of the guarded function, with ``retry=Retry(max=
                max_attempts)`` so a killed work-horse's job comes back; with ``dedup=True``,
                nothing is enqueued (``None`` returned) while the operation's job is queued or
                running."""
                arguments = self.arguments(name, args, kwargs)
                return _enqueue(self, guarded, name, queue, arguments, dedup=self.dedup[name])

            guarded.enqueue = enqueue  # type: ignore[attr-defined]
            del guarded.__wrapped__  # RQ and inspect must see (*args, **kwargs), not fn's ctx
            if self.replay_queue is not None:
                queue = self.replay_queue
                self.on_replay(
                    name,
                    lambda arguments: _enqueue(self, guarded, name, queue, arguments, dedup=False),
                )
            return guarded

        return register

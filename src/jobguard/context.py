"""What a handler sees of its delivery: identity, fence, memoised steps and idempotency keys."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from jobguard.core.keys import idempotency_key
from jobguard.exceptions import ConfigurationError

if TYPE_CHECKING:
    from jobguard.backends.base import Backend, Begun
    from jobguard.models import Delivery, Guard

T = TypeVar("T")


class InFlight:
    """A delivery the worker is holding: its current guard and whether it was lost.

    Shared between the handler thread, the heartbeat thread and the shutdown path.
    """

    def __init__(self, delivery: Delivery, guard: Guard, lock_ttl_s: float | None) -> None:
        self.delivery = delivery
        self.guard = guard
        self.lock_ttl_s = lock_ttl_s
        # A plain flag, not an Event: it is only ever set once and read, and one is made per job.
        self.lost = False
        self.lost_reason = ""
        self.started = False  # taken by a handler thread: shutdown waits for it, not releases it
        self.finishing = False  # handler done; its finish waits in the worker's ack batch
        self.begun: Begun | None = None
        self.context: Context | None = None
        # When the lease was last known to be ours (monotonic): fetched, or renewed.
        self.renewed_at = time.monotonic()

    def mark_lost(self, reason: str) -> None:
        """Record that the lease or lock is gone; the handler's writes will be refused."""
        if not self.lost:
            self.lost_reason = reason
            self.lost = True


class Context:
    """Handed to every handler as its first argument.

    Attributes:
        job_id: The job's id (stable across retries and replays).
        attempt: This delivery's number, 1-based, charged at delivery.
        max_attempts: Deliveries allowed in total.
        worker_id: The worker process running it.
        queue: The queue it was fetched from.
        task_name: The registered task name.
        operation_key: The idempotency identity of the business action, if the task has one.
        resource_key: The resource locked for this run, if any.
        fence: The lock's fencing token (strictly increasing per resource), or ``None``.
        lock_owner: The lock's owner token, or ``None``.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        inflight: InFlight,
        worker_id: str,
        stored_steps: dict[str, Any],
    ) -> None:
        delivery = inflight.delivery
        self._backend = backend
        self._inflight = inflight
        self._steps = dict(stored_steps)
        self.job_id = delivery.job_id
        self.attempt = delivery.attempt
        self.max_attempts = delivery.max_attempts
        self.worker_id = worker_id
        self.queue = delivery.queue
        self.task_name = delivery.task
        self.operation_key = delivery.operation_key
        self.resource_key = delivery.resource_key
        lock = inflight.guard.lock
        self.fence: int | None = lock.fence if lock else None
        self.lock_owner: str | None = lock.owner if lock else None
        self.external_ref: str | None = None
        self.steps_run = 0
        self.steps_skipped = 0

    @property
    def lease_lost(self) -> bool:
        """True once the heartbeat found the lease (or lock) taken over; stop work early."""
        return self._inflight.lost

    def idempotency_key(self, name: str) -> str:
        """A key for an external API call, stable across attempts and replays (R4.5)."""
        base = self.operation_key if self.operation_key is not None else f"job:{self.job_id}"
        return idempotency_key(base, name)

    def set_external_ref(self, ref: str) -> None:
        """Store the external system's reference on the operation record at completion (R4.2)."""
        self.external_ref = ref

    def _operation(self, what: str) -> str:
        if self.operation_key is None:
            raise ConfigurationError(
                f"ctx.{what}() needs the task to have an operation_key "
                '(e.g. @app.task(operation_key="fulfill-order:{order_id}"))'
            )
        return self.operation_key

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once per operation; on retries return its stored result.

        The result must be JSON-serialisable. A step that raises is not recorded as done.
        Refused with :class:`~jobguard.exceptions.GuardLost` if this delivery is stale.
        """
        key = self._operation("step")
        if name in self._steps:
            self.steps_skipped += 1
            stored: T = self._steps[name]
            return stored
        value = fn(*args, **kwargs)
        self._backend.put_step(self._inflight.guard, key, name, json.dumps(value))
        self._steps[name] = value
        self.steps_run += 1
        return value

    def db_step(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one transaction with the step record (invariant 10).

        ``conn`` offers ``execute``/``executemany`` on the app's own database; business rows
        written there commit if and only if the step record commits, exactly once per operation.
        """
        key = self._operation("db_step")
        if name in self._steps:
            self.steps_skipped += 1
            stored: T = self._steps[name]
            return stored
        ran, value = self._backend.db_step(self._inflight.guard, key, name, fn, args)
        self._steps[name] = value
        if ran:
            self.steps_run += 1
        else:
            self.steps_skipped += 1
        result: T = value
        return result
